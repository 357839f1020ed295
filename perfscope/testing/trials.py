"""A simulated trial runner, and the contract every :class:`~perfscope.tuner.runner.TrialRunner` keeps.

:class:`SimulatedRunner` runs no script: each configuration's steps take the time a
:class:`Workload` gives it (seconds of input wait and of compute per step, with seeded noise), and
its profiled steps are written as a small Kineto trace with the same shares, which the tuner
analyzes as it analyzes a real one. A whole ``perfscope tune`` -- baseline, search, pruning,
confirmation, the profile of the recommendation -- then runs in about a second, so the study's
flow (resuming after a kill or Ctrl-C, several workers on one storage, refusals) is tested
against it, and the child processes in a few end-to-end tests.

:func:`check_runner` raises :class:`~perfscope.testing.ContractError` where a runner breaks the
contract stated on :class:`~perfscope.tuner.runner.TrialRunner`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import shutil
from collections.abc import Callable
from pathlib import Path

from perfscope.testing import expect
from perfscope.tuner.objective import unit_of
from perfscope.tuner.runner import TrialRunner
from perfscope.tuner.trial import PRUNED_REASON, Pruned, TrialOutcome, TrialSpec
from perfscope.tuner.window import measure_steps_for

# A one-process CPU run loading batches of 16 on its training thread (the facts a real
# measurement reports for examples/io_bound.py, trimmed to what the knob groups read).
CPU_FACTS = {"cuda": False, "cpu_count": 2, "world_size": 1, "local_world_size": 1, "ddp": None,
             "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False,
                            "batch_size": 16},
             "accelerate": {"called": False}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """What one training step of a simulated script costs, by configuration.

    Attributes:
        io_s: Seconds per step the training thread waits for its batch when it loads it itself.
        compute_s: Seconds per step of the model's work.
        noise: Relative standard deviation of each step's time (seeded, so runs repeat).
        idle_w, busy_w, worker_w: Watts of the machine while the training thread waits, while
            it works (its own loading included), and of each DataLoader worker while it runs:
            more workers end the wait but burn power of their own, so the step that takes the
            least energy is not the fastest one.
    """

    io_s: float = 0.008
    compute_s: float = 0.002
    noise: float = 0.01
    idle_w: float = 20.0
    busy_w: float = 60.0
    worker_w: float = 15.0

    def step_joules(self, changes: dict) -> float:
        """Joules of one step under ``changes`` (at the step's mean time)."""
        wait, compute = self.step_parts(changes)
        workers = int(changes.get("num_workers") or 0)
        if workers <= 0:  # the training thread loads its batch itself: busy throughout
            return (wait + compute) * self.busy_w
        return wait * self.idle_w + compute * self.busy_w + workers * self.worker_w * (wait + compute)

    def step_parts(self, changes: dict) -> tuple[float, float]:
        """``(input wait, compute)`` seconds of one step under the configuration ``changes``.

        DataLoader workers load ahead while the step computes: each of N workers yields a batch
        every ``io_s`` seconds, so the step waits ``max(0, io_s / N - compute_s)``.
        """
        workers = int(changes.get("num_workers") or 0)
        wait = self.io_s if workers <= 0 else max(0.0, self.io_s / workers - self.compute_s)
        return wait, self.compute_s


@dataclasses.dataclass(frozen=True)
class Run:
    """One run the simulated runner made: its configuration's changes, folder and outcome status."""

    changes: dict
    work_dir: Path
    status: str


class SimulatedRunner(TrialRunner):
    """Runs configurations of a :class:`Workload` without a script (see the module's words).

    Args:
        workload: The step costs by configuration.
        facts: The run's facts as a measurement reports them (:data:`CPU_FACTS` by default).
        fail: ``changes -> (status, reason)`` for configurations whose run fails (None: none).
        on_run: Called as each run starts with ``(index of the run from 0, changes, work_dir)``:
            where a test stops the tuner (raise ``KeyboardInterrupt``, or kill the process).
        sleep, pace_s: Each run sleeps ``pace_s`` real seconds through ``sleep`` (default none),
            so that several workers' runs overlap in time.
        seed: Seed of the step-time noise (each run draws from ``seed`` and its index).
        start_s: Simulated seconds each run spends starting (a process, imports) before its steps.

    Its :meth:`clock` is simulated: each run advances it by its start-up and all its steps, so the
    tuning's budgets are spent in simulated seconds.
    """

    def __init__(self, workload: Workload | None = None, *, facts: dict | None = None,
                 fail: Callable[[dict], tuple[str, str] | None] | None = None,
                 on_run: Callable[[int, dict, Path], None] | None = None,
                 sleep: Callable[[float], None] | None = None, pace_s: float = 0.0, seed: int = 0,
                 start_s: float = 1.0) -> None:
        self.workload = workload or Workload()
        self.facts = facts if facts is not None else CPU_FACTS
        self.fail, self.on_run, self.sleep, self.pace_s, self.seed = fail, on_run, sleep, pace_s, seed
        self.start_s = start_s
        self.now = 0.0
        self.runs: list[Run] = []

    def clock(self) -> float:
        """Simulated seconds spent by the runs so far."""
        return self.now

    def run(self, spec: TrialSpec, config, work_dir: Path, *, on_step=None, profile_steps=None,
            loader_workers=None, prefetch_factor=None, on_progress=None) -> TrialOutcome:
        changes = dict(config.changes()) if config is not None else {}
        work_dir = Path(work_dir)
        shutil.rmtree(work_dir, ignore_errors=True)
        (work_dir / "records").mkdir(parents=True)
        index = len(self.runs)
        if self.on_run is not None:
            self.on_run(index, changes, work_dir)
        if self.sleep is not None and self.pace_s > 0:
            self.sleep(self.pace_s)
        profile = spec.profile_steps if profile_steps is None else profile_steps
        outcome = self._outcome(spec, changes, work_dir, index, on_step, loader_workers, profile)
        step = sum(self.workload.step_parts(changes))
        self.now += self.start_s + sum(outcome.step_seconds) + (spec.warmup_steps + profile) * step
        self.runs.append(Run(changes, work_dir, outcome.status))
        return outcome

    def _outcome(self, spec, changes, work_dir, index, on_step, loader_workers, profile) -> TrialOutcome:
        failure = self.fail(changes) if self.fail is not None else None
        if failure is not None:
            return TrialOutcome(status=failure[0], reason=failure[1], facts=self._facts(changes), exit_code=1)
        wait, compute = self.workload.step_parts(changes)
        batch = self._batch(changes)
        rng = random.Random(self.seed * 1_000_003 + index)
        steps = measure_steps_for(spec.measure_steps, loader_workers)
        seconds = [(wait + compute) * max(0.05, rng.gauss(1.0, self.workload.noise)) for _ in range(steps)]
        watts = self.workload.step_joules(changes) / (wait + compute)
        outcome = TrialOutcome(status="ok", unit=unit_of(spec.objective, "samples/s"), facts=self._facts(changes),
                               exit_code=0, objective=spec.objective,
                               data_wait=wait / (wait + compute) if wait + compute > 0 else None,
                               losses=_losses(spec.warmup_steps + steps + profile, batch))
        try:
            for i, s in enumerate(seconds):
                outcome.step_seconds.append(s)
                outcome.step_samples.append(batch)
                outcome.step_energy.append(s * watts)
                outcome.step_values.append(batch / s)
                if on_step is not None:
                    on_step(i, outcome.value)
        except Pruned:
            outcome.status, outcome.reason = "pruned", PRUNED_REASON
            return outcome
        outcome.duration_s = sum(seconds) + spec.warmup_steps * (wait + compute)
        outcome.window = {"target_rse": spec.target_rse, "rse": _rse(seconds), "steps": steps,
                          "seconds": sum(seconds), "ended_by": "steps"}
        if profile > 0:
            outcome.trace_files = [_write_trace(work_dir / "records" / "rank0.trace.json", profile, wait, compute)]
        return outcome

    def _batch(self, changes: dict) -> int:
        return int(changes.get("batch_size") or (self.facts.get("dataloader") or {}).get("batch_size") or 1)

    def _facts(self, changes: dict) -> dict:
        """The facts a run of ``changes`` reports: the loader's settings as the configuration set them."""
        facts = copy.deepcopy(self.facts)
        loader = facts.get("dataloader")
        if isinstance(loader, dict):
            for key in ("num_workers", "prefetch_factor", "pin_memory", "batch_size"):
                if changes.get(key) is not None:
                    loader[key] = changes[key]
        return facts


def _losses(count: int, batch: int) -> list[float]:
    """The same loss curve for every configuration, by samples seen (a larger batch sees more a step)."""
    return [2.0 / (1.0 + 0.001 * (i + 1) * batch) for i in range(count)]


def _rse(seconds: list[float]) -> float | None:
    """Relative standard error of the window's mean step time (None below two steps)."""
    n = len(seconds)
    if n < 2:
        return None
    mean = sum(seconds) / n
    sd = math.sqrt(sum((s - mean) ** 2 for s in seconds) / (n - 1))
    return sd / math.sqrt(n) / mean if mean > 0 else None


def _write_trace(path: Path, steps: int, wait: float, compute: float) -> Path:
    """A CPU Kineto trace of ``steps`` profiled steps, each an input wait then compute (µs)."""
    events, ts = [], 1_000.0
    wait_us, compute_us = wait * 1e6, compute * 1e6
    for n in range(steps):
        events.append(_event("user_annotation", f"ProfilerStep#{n}", ts, wait_us + compute_us + 10))
        if wait_us > 0:
            events.append(_event("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                 ts + 1, wait_us))
        events.append(_event("cpu_op", "aten::addmm", ts + wait_us + 2, compute_us))
        ts += wait_us + compute_us + 20
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 1, "ts": round(ts, 3), "dur": round(dur, 3)}


def check_runner(runner: TrialRunner, spec: TrialSpec, work_dir: Path) -> None:
    """Check ``runner`` against the :class:`~perfscope.tuner.runner.TrialRunner` contract on a
    script ``spec`` runs well for at least ``spec.measure_steps + 2`` steps (the runner's own
    script, for a simulated one), in folders under ``work_dir``.

    Raises:
        ContractError: naming the part of the contract broken.
    """
    seen: list[tuple[int, float]] = []
    ok = runner.run(spec, None, work_dir / "ok", on_step=lambda i, v: seen.append((i, v)), profile_steps=0)
    expect(ok.status == "ok", f"a run of a working script ended {ok.status!r}: {ok.reason}")
    expect((work_dir / "ok").is_dir(), "the run's work folder was not created")
    expect(ok.value is not None and ok.value > 0, f"an ok run measured no throughput: {ok.value!r}")
    expect(len(ok.step_seconds) >= spec.measure_steps,
           f"{len(ok.step_seconds)} measured steps, fewer than the {spec.measure_steps} asked")
    expect([i for i, _ in seen] == list(range(len(seen))) and len(seen) >= spec.measure_steps,
           f"on_step was called with indices {[i for i, _ in seen]}, not 0, 1, ... for each measured step")
    expect(all(v > 0 for _, v in seen), "on_step was given a throughput that is not positive")

    def prune(index: int, value: float) -> None:
        if index == 1:
            raise Pruned

    pruned = runner.run(spec, None, work_dir / "pruned", on_step=prune, profile_steps=0)
    expect(pruned.status == "pruned" and pruned.reason, f"a run whose on_step raised Pruned ended {pruned.status!r}")
    expect(len(pruned.step_seconds) <= 3, f"a run pruned at its second step went on for {len(pruned.step_seconds)}")

    (work_dir / "again").mkdir(parents=True, exist_ok=True)
    (work_dir / "again" / "stale.txt").write_text("from an earlier run")
    again = runner.run(spec, None, work_dir / "again", profile_steps=0)
    expect(again.ok and not (work_dir / "again" / "stale.txt").exists(),
           "the work folder of an earlier run was not emptied first")

    def stop(index: int, value: float) -> None:
        raise KeyboardInterrupt

    try:
        runner.run(spec, None, work_dir / "stopped", on_step=stop, profile_steps=0)
    except KeyboardInterrupt:
        pass
    else:
        expect(False, "a KeyboardInterrupt during the run did not reach the caller")
