"""The gate's defaults, apart from the statistics so that the command line can name them without
loading them (``docs/check.md``)."""

ALPHA = 0.01
"""The one-sided test's significance level: a regression is called at p < 1%."""
DEFAULT_MAX_REGRESSION = 0.05
"""The step-time regression the gate is to catch (5%); a slowdown must reach half of it."""
