"""Damaged files of our own making: cut, spliced and garbled copies of a trace. Whatever the damage,
perfscope never loses data silently: a text that is not strict JSON ends in a clear error naming the
file, or in an analysis whose warnings name it -- never in a quiet result, never in an internal
error. Seeded, so every run tries the same files."""

from __future__ import annotations

import json
import random

import pytest
from tracegen import cpu_op, dataloader, launch, memcpy, runtime, step, trace_bytes

import perfscope
from perfscope.errors import PerfscopeError

NASTY = [b"\x00", b"\xff", b"\xb5", b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\n", b"\x1b[31m", b"N/A",
         b"NaN", b"-Infinity", b"\\u12", b"\xe2\x82", b"\t", b"9" * 30, b"true", b"null", b"ProfilerStep#"]


def _base() -> bytes:
    events = []
    for n in range(4):
        s = 1000 * n
        copy = memcpy("Memcpy HtoD (Pinned -> Device)", s + 5, 20, correlation=100 + n)
        copy["args"]["bytes"] = 4096
        events += [step(n + 1, s, 1000), dataloader(s, 100), cpu_op("aten::mm", s + 110, 800),
                   runtime("cudaMemcpyAsync", s + 2, 3, correlation=100 + n),  copy,
                   *launch("gemm", s + 120, s + 130, 700, correlation=n + 1)]
    return trace_bytes(events, schemaVersion=1, distributedInfo={"rank": 0, "world_size": 1},
                       baseTimeNanoseconds=1_700_000_000_000_000_000)


def _strict_json(text: bytes) -> bool:
    def no_constants(name):
        raise ValueError(name)

    try:
        json.loads(text.decode("utf-8"), parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return True


def _mutants(seed: int, n: int):
    rng = random.Random(seed)
    base = _base()
    for _ in range(n):
        kind = rng.choice(("cut", "insert", "delete", "replace", "splice"))
        at = rng.randrange(1, len(base) - 1)
        if kind == "cut":
            yield kind, base[:at]
        elif kind == "insert":
            yield kind, base[:at] + rng.choice(NASTY) + base[at:]
        elif kind == "delete":
            yield kind, base[:at] + base[at + rng.randint(1, 40):]
        elif kind == "replace":
            yield kind, base[:at] + rng.choice(NASTY) + base[at + 1:]
        else:  # a block of the file written twice, as a writer that retried might
            span = rng.randint(10, 400)
            yield kind, base[:at] + base[max(0, at - span):at] + base[at:]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damage_is_never_silent(tmp_path, seed):
    tried = 0
    for k, (kind, text) in enumerate(_mutants(seed, 150)):
        if _strict_json(text):
            continue  # still valid JSON: a different trace, not a damaged one
        tried += 1
        path = tmp_path / f"m{k}.json"
        path.write_bytes(text)
        try:
            a = perfscope.analyze(path)
        except PerfscopeError as e:  # a clear error, naming the file
            assert path.name in str(e), (kind, str(e))
            assert "\n" not in str(e)
            continue
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"{kind} damage at seed {seed} #{k} ended in {type(e).__name__}: {e}")
        assert any(path.name in w for w in a.warnings), (kind, a.warnings)
        assert a.traces[0].data_quality, kind
    assert tried > 100  # most mutants are damaged JSON


def test_the_base_trace_itself_reads_without_a_warning(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(_base())
    a = perfscope.analyze(path)
    assert a.warnings == [] and a.verdict.verdict is not None
