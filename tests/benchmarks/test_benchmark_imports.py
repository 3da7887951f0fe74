"""The benchmark scripts import each other without circles (the package's own modules are held to that by the
import contract, tests/test_layers.py; the scripts are not a package, so their imports are read here)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _imports(path: Path, names: set[str]) -> set[str]:
    """The other benchmark scripts ``path`` imports, anywhere in it (TYPE_CHECKING blocks and functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return (found & names) - {path.stem}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (script -> the scripts it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for other in sorted(graph[node]):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other, [*path, other])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_circle_finder_finds_a_circle():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_no_benchmark_script_imports_itself_through_others():
    scripts = {path.stem: path for path in BENCHMARKS.glob("*.py")}
    assert {"common", "bench_report", "peer", "peer_rows"} <= set(scripts)
    graph = {name: _imports(path, set(scripts)) for name, path in scripts.items()}
    assert "bench_report" in graph["common"] and "peer_rows" in graph["peer"]  # the edges that once ran both ways
    assert _circle(graph) is None, _circle(graph)
