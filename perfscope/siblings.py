"""Import perfscope's sibling packages (``reports``, ``tuner``, ``fused_ops``) by location.

The product's layout gives them generic top-level names. After ``perfscope profile`` has run a
training script in this process, ``sys.modules`` may hold the script's own ``reports`` module, and
``python -m perfscope`` puts the current directory first on ``sys.path``; a plain ``import reports``
could then load the user's module. These helpers load the package that sits beside ``perfscope/``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_ROOT = Path(__file__).resolve().parent.parent  # the directory holding perfscope/ and its siblings


def _is_ours(module: ModuleType) -> bool:
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve().is_relative_to(_ROOT / module.__name__.split(".")[0])


def import_sibling(name: str) -> ModuleType:
    """The sibling package ``name`` installed with perfscope, whatever else is on ``sys.path``.

    Raises:
        ImportError: perfscope's installation holds no such package.
    """
    module = sys.modules.get(name)
    if module is not None and _is_ours(module):
        return module
    spec = importlib.machinery.PathFinder.find_spec(name, [str(_ROOT)])
    if spec is None or spec.loader is None:
        raise ImportError(f"perfscope's package {name!r} is missing from {_ROOT}")
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]  # someone else's module of that name, or its submodules
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: the package's own submodule imports resolve to it
    spec.loader.exec_module(module)
    return module
