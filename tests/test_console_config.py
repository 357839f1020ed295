"""The console's account of what --config applied, what found nothing to act on, and what was skipped."""

from perfscope.console import config_lines


def summary(mode, **report):
    base = {"applied": {}, "needs_accelerate": {}, "not_applied": {}, "loaders": 0, "ddp_modules": 0,
            "by_accelerate": {}}
    return {"mode": mode, "run": {"config_applied": {**base, **report}}}


def test_knobs_without_anything_to_act_on_are_said_to_be_unused():
    lines = config_lines(summary("cpu", applied={"num_workers": "DataLoader(num_workers=2)", "tf32": "flags on",
                                                 "amp_level": "autocast", "bucket_cap_mb": "DDP(bucket_cap_mb=50)"},
                                 not_applied={"grad_compression": "needs torch.distributed"}))
    assert "config applied: amp_level: autocast" in lines
    assert "config not used: num_workers: the script built no DataLoader (set: DataLoader(num_workers=2))" in lines
    assert "config not used: tf32: no effect: the run used no CUDA device (set: flags on)" in lines
    assert any(line.startswith("config not used: bucket_cap_mb: the script built no DistributedDataParallel")
               for line in lines)
    assert "config not applied: grad_compression: needs torch.distributed" in lines


def test_knobs_that_found_their_objects_are_applied():
    lines = config_lines(summary("gpu", loaders=1, ddp_modules=1,
                                 applied={"num_workers": "w", "tf32": "t", "bucket_cap_mb": "b"}))
    assert lines == ["config applied: num_workers: w", "config applied: tf32: t", "config applied: bucket_cap_mb: b"]


def test_no_configuration_no_lines():
    assert config_lines({"mode": "cpu", "run": {}}) == []
