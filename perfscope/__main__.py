"""``python -m perfscope`` is the ``perfscope`` command."""

from perfscope.cli import main

raise SystemExit(main())
