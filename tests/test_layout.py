"""The package layout: the owner's folders tuner/, reports/ and fused_ops/ are perfscope's
subpackages (perfscope.tuner, ...), every package is listed in pyproject.toml, and nothing
imports them by a top-level name that a user's own module could take."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from test_import_graph import FOLDERS, ROOT, modules
from conftest import HANG_TIMEOUT_S  # noqa: E402


def tree_packages() -> set[str]:
    return {name for name, (_, is_package) in modules().items() if is_package}


def test_pyproject_lists_every_package_of_the_tree_and_maps_the_folders():
    tomllib = pytest.importorskip("tomllib")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(tool["packages"]) == tree_packages()
    assert tool["package-dir"] == {name: folder for folder, name in FOLDERS.items() if folder != "perfscope"}


def test_no_library_module_imports_a_folder_by_its_top_level_name():
    bare = set(FOLDERS) - {"perfscope"}
    offenders = []
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in bare]
    assert offenders == []


def test_the_subpackages_load_from_this_tree_beside_perfscope(tmp_path):
    # run from elsewhere, with this tree first on the path: perfscope.tuner is this tree's tuner/
    code = ("import perfscope.tuner.options, perfscope.reports, perfscope.fused_ops, sys\n"
            "print(perfscope.tuner.options.__file__)\nprint(perfscope.fused_ops.__file__)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tuner', 'reports', 'fused_ops')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    tuner_file, fused_file, bare = out.stdout.splitlines()
    assert Path(tuner_file) == ROOT / "tuner" / "options.py" and Path(fused_file) == ROOT / "fused_ops" / "__init__.py"
    assert bare == "[]"


def test_every_declared_dependency_is_imported_by_the_library():
    # pyproject's dependencies against the library's import statements (a dependency nothing
    # imports is weight every install pays for; the one module name of each distribution).
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    modules = importlib.metadata.packages_distributions()
    sources = "\n".join(p.read_text(encoding="utf-8") for folder in ("perfscope", "tuner", "reports", "fused_ops")
                        for p in (ROOT / folder).rglob("*.py"))
    imported = set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", sources, re.M))
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        names = {m for m, dists in modules.items() if name in {d.lower().replace("_", "-") for d in dists}}
        assert names & imported, f"{requirement}: declared, but the library imports none of {sorted(names)}"
