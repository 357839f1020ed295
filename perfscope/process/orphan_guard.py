"""``python -m perfscope.process.orphan_guard -m MODULE ARGS...``: run ``python -m MODULE ARGS``
in this process after asking the kernel to kill it when its parent exits
(:func:`perfscope.process.keeper.die_with_parent`).

For a launcher perfscope starts but cannot tell to die with it -- ``torch.distributed.run``
would outlive a killed ``perfscope tune`` and keep its ranks running. The request survives the
``exec`` (``PR_SET_PDEATHSIG`` is kept across it), so the launcher itself dies with perfscope.
"""

from __future__ import annotations

import os
import sys

from perfscope.process.keeper import die_with_parent


def main(argv: list[str]) -> None:
    """Ask to die with the parent, then become ``python ARGV`` (``argv`` starts with ``-m``).

    Exits with status 2 and one line on stderr when ``argv`` is not ``-m MODULE ...``; with status
    1 when the parent has already gone.
    """
    if len(argv) < 2 or argv[0] != "-m":
        print("usage: python -m perfscope.process.orphan_guard -m MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    die_with_parent()
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
