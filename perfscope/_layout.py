"""Where perfscope's subpackages ``tuner``, ``reports`` and ``fused_ops`` live in a source tree.

The repository keeps them as folders beside ``perfscope/`` (the owner's layout); they are
installed and imported as ``perfscope.tuner``, ``perfscope.reports`` and ``perfscope.fused_ops``
(pyproject's ``package-dir``), so that a user's own ``reports`` or ``tuner`` module next to a
training script never stands in for them. An installed wheel holds them inside ``perfscope/`` and
needs nothing here. Run from a source tree (``PYTHONPATH``, an editable install), Python would not
find ``perfscope/tuner``: :func:`install` adds a finder that maps exactly those three names to the
folders beside this package -- this copy's, whichever other install is on ``sys.path``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

SUBPACKAGES = ("tuner", "reports", "fused_ops")


class _BesideFinder(importlib.abc.MetaPathFinder):
    """Finds ``perfscope.<name>`` for each name of ``folders`` in ``folders[name]``."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = {f"perfscope.{name}": path for name, path in folders.items()}

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def install(package_dir: str) -> None:
    """Map the subpackages that are not inside ``package_dir`` (perfscope's own folder) but beside
    it, once per process; nothing in an installed wheel, where they are inside."""
    here = Path(package_dir)
    folders = {name: here.parent / name for name in SUBPACKAGES
               if not (here / name / "__init__.py").is_file() and (here.parent / name / "__init__.py").is_file()}
    if not folders or any(isinstance(f, _BesideFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _BesideFinder(folders))
