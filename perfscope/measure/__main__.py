"""``python -m perfscope.measure``: see :mod:`perfscope.measure.runner`."""

import sys

from perfscope.measure.runner import main

sys.exit(main())
