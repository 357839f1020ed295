"""Contract suites for perfscope's extension points, to run against every implementation -- the
shipped ones (``tests/``) and your own.

Each ``check_*`` function raises :class:`ContractError` (an ``AssertionError``, so a test runner
reports it as a failed check) naming what the implementation broke, and returns None when it
keeps the contract:

- :mod:`.knob_groups`: a :class:`~perfscope.runtime.groups.base.KnobGroup` (search, baseline,
  application by ``perfscope.accelerate`` and at launch), over :data:`.knob_groups.SAMPLE_RUNS`;
- :mod:`.executors`: a :class:`~perfscope.analysis.executors.RankExecutor` (order, streaming,
  exceptions, dead workers, close);
- :mod:`.sections`: a report :class:`~perfscope.reports.bottleneck.Section`;
- :mod:`.record`: a summary record against the schema (:mod:`perfscope.record.schema`);
- :mod:`.trials`: a :class:`~perfscope.tuner.runner.TrialRunner` (outcomes, ``on_step``, pruning,
  Ctrl-C, its work folder), and :class:`~.trials.SimulatedRunner`, which runs a tuning's
  configurations as a simulated workload, without a script.

Nothing in the library imports this package.
"""


class ContractError(AssertionError):
    """An implementation broke its extension point's contract (the message says how)."""


def expect(condition: object, message: str) -> None:
    """Raise :class:`ContractError` with ``message`` unless ``condition`` holds (kept under
    ``python -O``, unlike ``assert``)."""
    if not condition:
        raise ContractError(message)
