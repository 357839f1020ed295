"""The run facts (perfscope/record/run_facts.py): the measurement's record read once, at the search
space's door, absent, null and empty parts reading as their defaults."""

from __future__ import annotations

import pytest

from perfscope.errors import PerfscopeError
from perfscope.record.run_facts import LoaderFacts, RunFacts, run_facts
from perfscope.testing.knob_groups import SAMPLE_RUNS


def test_each_sample_run_reads_with_what_it_holds():
    for name, facts in SAMPLE_RUNS.items():
        read = run_facts(facts)
        assert read.cuda == bool(facts.get("cuda")), name
        assert (read.dataloader is None) == (not facts.get("dataloader")), name
        if read.dataloader is not None:
            assert read.dataloader.num_workers == facts["dataloader"]["num_workers"], name
        if facts.get("model"):
            assert read.model.class_ == facts["model"]["class"], name


def test_absent_null_and_empty_parts_read_as_their_defaults():
    read = run_facts({"dataloader": {}, "model": None, "accelerate": {}, "world_size": None,
                      "threads": {"intra_op_threads": None}, "compiler": {}})
    assert read.dataloader is None and read.model is None and read.threads.intra_op_threads is None
    assert not read.accelerate.called and read.compiler.unavailable is None
    assert read.ranks == 1 and read.ranks_per_node == 1
    assert run_facts(None) == RunFacts() == run_facts({})
    assert run_facts({"dataloader": {"batch_size": 8}}).dataloader == LoaderFacts(batch_size=8)


def test_fields_beyond_the_record_are_ignored_and_a_read_record_passes_through():
    read = run_facts({"cuda": True, "world_size": 4, "local_world_size": 2, "something_new": {"x": 1}})
    assert read.cuda and read.ranks == 4 and read.ranks_per_node == 2
    assert run_facts(read) is read


def test_a_part_of_the_wrong_type_is_one_clear_error():
    with pytest.raises(PerfscopeError) as info:
        run_facts({"dataloader": "four workers"})
    message = str(info.value)
    assert message.startswith("run facts:") and "dataloader" in message and "\n" not in message
