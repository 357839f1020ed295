"""The library's import graph: no module imports itself back through others (an import made
inside a function counts, and so does one under ``if TYPE_CHECKING:``: a loop a type checker follows
is a loop a reader follows), and each package imports only the packages below it, so the tree
reads collect -> trace -> analyze -> report over the records they share, and tune -> trial ->
runtime -> ops."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"perfscope": "perfscope", "tuner": "perfscope.tuner", "reports": "perfscope.reports",
           "fused_ops": "perfscope.fused_ops"}
# Which of the library's packages each package may import (besides its own modules and the loose
# modules at the top of perfscope/: errors, text, atomic writes ...). record/ (the summary and the
# wire formats between the collector and the reader) is the floor every side of those formats stands on. The command line (cli*,
# __main__) may import anything; nothing imports it.
MAY_IMPORT = {
    "process": set(),
    "trace": {"record"},
    "fused_ops": set(),
    "runtime": {"trace", "fused_ops", "record"},
    "collect": {"runtime", "process", "record"},
    "record": set(),
    "analysis": {"trace", "process", "record"},
    "check": {"analysis", "trace", "record"},
    "forecast": {"analysis", "trace", "runtime", "record"},
    "reports": {"analysis", "trace", "record"},
    "measure": {"collect", "runtime", "fused_ops", "process", "record"},
    "tuner": {"analysis", "collect", "measure", "reports", "runtime", "fused_ops", "trace", "process", "record"},
}


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if folder == "perfscope" and rel[0] in FOLDERS:
                continue
            is_package = rel[-1] == "__init__"
            found[".".join((package, *(rel[:-1] if is_package else rel)))] = (path, is_package)
    return found


def import_graph(mods: dict[str, tuple[Path, bool]] | None = None) -> dict[str, set[str]]:
    """Module -> the library's modules it imports, at the top, inside functions or under
    ``if TYPE_CHECKING:``."""
    mods = modules() if mods is None else mods
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_package) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in mods or base in mods:
                        graph[name].add(target if target in mods else base)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in mods)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "perfscope"
    if parts[1].startswith("cli") or parts[1] == "__main__":
        return "cli"
    if parts[1] == "testing":  # the contract suites: like the command line, above everything
        return "testing"
    return parts[1] if parts[1] in MAY_IMPORT else "top"


def test_the_library_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_an_import_for_the_type_checker_only_closes_a_loop(tmp_path):
    (tmp_path / "a.py").write_text("from perfscope.b import B\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from perfscope.a import A\n")
    mods = {"perfscope.a": (tmp_path / "a.py", False), "perfscope.b": (tmp_path / "b.py", False)}
    assert cycles(import_graph(mods)) == [["perfscope.a", "perfscope.b"]]


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_package_imports_only_the_packages_below_it_and_nothing_imports_the_command_line():
    wrong = []
    for module, targets in import_graph().items():
        mine = package_of(module)
        for target in targets:
            theirs = package_of(target)
            if theirs == "cli" and mine != "cli":
                wrong.append(f"{module} imports the command line ({target})")
            elif theirs == "testing" and mine != "testing":
                wrong.append(f"{module} imports the contract suites ({target})")
            elif mine in MAY_IMPORT and theirs in MAY_IMPORT and theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert wrong == []
