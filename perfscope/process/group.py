"""Process groups, and the environment of a child that runs perfscope's own code."""

from __future__ import annotations

import os
import pathlib


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child running perfscope code: this one's, with this perfscope
    importable (its source root appended to ``PYTHONPATH``) and ``extra`` set (e.g. the
    configuration's path under ``$PERFSCOPE_CONFIG``, :func:`perfscope.runtime.config.config_env_of`)."""
    # The ranks must import the same perfscope as this process, also when it
    # runs from a source checkout that is not installed. Appended, so the
    # user's own PYTHONPATH entries keep precedence.
    env = dict(os.environ)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts.append(root)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra or {})
    return env
