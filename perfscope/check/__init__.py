"""``perfscope check``'s decision: did a run regress against a baseline, beyond the noise?

Each side is one run or several runs of the same command (``docs/check.md``):

- **Step time.** A run's step time is its window over its steps (:mod:`perfscope.steptime`: the
  mean of the job's counted step times); a side's is the mean over its runs, and the slowdown is
  the run side's over the baseline side's, minus 1. A regression is called when both

  1. a one-sided test rejects "the run is no slower than the baseline" at ``alpha`` (default
     :data:`ALPHA`, 1%). Which test depends on what the sides can tell about the noise:

     - several runs on both sides: **Welch's t-test** on the runs' step times
       (``scipy.stats.ttest_ind(equal_var=False, alternative="greater")``). The run is the unit:
       separate runs of one command drift by several percent on a shared machine (its load
       changes between them), far more than the mean of a run's steps varies within it, so a
       test over the steps of single runs takes drift for a regression;
     - several runs on one side, one on the other: the single run against the **prediction
       interval** of the several (Student's t with their n - 1 degrees of freedom, standard
       deviation times sqrt(1 + 1/n)): a stored set of baseline runs, one new run per CI job;
     - one run each: the one-sided **Mann-Whitney U test** on the two runs' job step times
       (``scipy.stats.mannwhitneyu(alternative="greater")``; rank-based, so a few long steps, a
       loader wait or a GC pause, do not dominate it). It sees the noise within each run only,
       and the result says so: drift between runs is not in it (docs/check.md measures what that
       costs).

  2. the slowdown reaches half of ``max_regression``, the regression the gate is to catch
     (default :data:`DEFAULT_MAX_REGRESSION`, 5%): a true regression of the target size passes it
     more often than not, and the noise must reach half of it to.

  Mann-Whitney U needs at least :data:`MIN_STEPS` steps in each run: with 4 and 4 the smallest
  one-sided p-value possible is 1/70, above 1%, so fewer steps could never show a regression.
- **Verdict.** A change from compute-bound (the math itself is the limit) to a removable class
  (io, comm or launch) is a regression; a change between removable classes is reported, not failed.
  With several runs a side's verdict is its most common one.
- **What changed**: each class's milliseconds per step, and the kernels (GPU) or operators (CPU)
  whose time per step grew the most (each side averaged over its runs).

Times are microseconds inside, as in the summaries; the text says milliseconds.
"""

from perfscope.check.gate import ALPHA, DEFAULT_MAX_REGRESSION  # noqa: F401 (API)

__all__ = ["ALPHA", "DEFAULT_MAX_REGRESSION", "MIN_STEPS", "CheckInputError", "CheckResult", "compare", "junit_xml",
           "report_lines", "step_sample", "write_junit"]

# The statistics load on first use: `perfscope --help` and the other commands never pay for them.
_HOME = {"CheckInputError": "decide", "CheckResult": "decide", "compare": "decide", "report_lines": "decide",
         "junit_xml": "junit", "write_junit": "junit", "MIN_STEPS": "stats", "step_sample": "stats"}


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"perfscope.check.{_HOME[name]}"), name)
    raise AttributeError(f"module 'perfscope.check' has no attribute {name!r}")
