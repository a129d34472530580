"""The house rules of the code base: the pure core imports no I/O, packages import only what the
README's architecture section allows, and no module imports itself back through others (lazy
imports inside functions included).

The list of core modules is the one in ``pyproject.toml`` (the mypy-strict override); nothing
else in the repository lists them.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("frenzyd", "frenzy_client")

FORBIDDEN_AT_IMPORT = ["socket", "asyncio", "torch", "zeroconf", "aiohttp", "threading", "pynvml",
                       "transformers"]
"""What importing a core module must not load (DESIGN.md §2; torch only lazily, in MARP's trace mode)."""

IO_LIBRARIES = {"socket", "asyncio", "aiohttp", "zeroconf", "pynvml", "threading", "prometheus_client"}
"""Third-party or standard I/O libraries no core module may import, not even inside a function."""
MEASURES_FOR_REAL = "frenzyd.marp.trace"
"""MARP's trace mode runs the reference step for real (torch, rank subprocesses on loopback gloo):
inside its functions it may use I/O; importing it must still load nothing impure."""
AT_IMPORT_EXEMPT = {"frenzyd.marp.trace.dist": {"socket", "threading"}}
"""The trace mode's rank-subprocess runner (never imported by the scheduler or the daemon)."""

# Package -> the frenzyd packages its modules may import (besides itself).  The README's
# architecture section shows the same table.  Top-level modules: ``errors``, ``gpu_types``,
# ``payload`` (the job archive format the client and the daemon share), ``config`` (leaf modules),
# ``daemon`` and ``__main__`` (the composition root: anything).
LEAVES = {"frenzyd.errors", "frenzyd.gpu_types", "frenzyd.logs", "frenzyd.payload"}
ALLOWED: dict[str, set[str]] = {
    "frenzyd.marp": set(),
    "frenzyd.has": {"frenzyd.marp"},
    "frenzyd.sim": {"frenzyd.has", "frenzyd.marp"},
    "frenzyd.net": {"frenzyd.config"},
    "frenzyd.node": {"frenzyd.config"},
    "frenzyd.jobs": {"frenzyd.net", "frenzyd.marp", "frenzyd.has"},
    "frenzyd.api": {"frenzyd.jobs", "frenzyd.config"},
    "frenzyd.config": {"frenzyd.net"},
    "frenzyd.examples": {"frenzyd.trainer"},  # user scripts: the user-script API (DESIGN.md §8)
    "frenzyd.trainer": {"frenzyd.marp"},
    "frenzy_client": {"frenzyd.marp", "frenzyd.has", "frenzyd.sim", "frenzyd.config", "frenzyd.net",
                      "frenzyd.jobs"},
}
SHELL_FOR_CLIENT = {"frenzyd.daemon", "frenzyd.__main__", "frenzyd.node", "frenzyd.api"}
"""``frenzy_client`` may use the pure core and config, never the daemon's shell (DESIGN.md §2)."""


def core_patterns() -> list[str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lists = [o["module"] for o in doc["tool"]["mypy"].get("overrides", []) if o.get("strict")]
    assert len(lists) == 1, "pyproject.toml must hold exactly one strict override: the core list"
    return list(lists[0])


def all_modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = all_modules()


def is_core(module: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(module, p) or (p.endswith(".*") and module == p[:-2]) for p in patterns)


CORE = sorted(m for m in MODULES if is_core(m, core_patterns()))


def _resolve(name: str) -> str:
    """The longest known module that ``name`` names (``a.b.C`` -> ``a.b`` when C is a class)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """Every module ``module`` imports, at any depth of its code (lazy imports included)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def internal_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for name, _ in imports_of(m):
            target = _resolve(name)
            if target and target != m and target.split(".")[0] in PACKAGES:
                graph[m].add(target)
    return graph


def owner(module: str) -> str:
    """The architecture unit a module belongs to (a package of frenzyd, or a top-level module)."""
    parts = module.split(".")
    if parts[0] == "frenzy_client":
        return "frenzy_client"
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_core_list_names_real_modules() -> None:
    for pattern in core_patterns():
        assert any(is_core(m, [pattern]) for m in MODULES), f"core pattern {pattern!r} matches no module"
    assert "frenzyd.net.wire" in CORE
    assert "frenzyd.jobs.model" in CORE


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_nothing_impure(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"bad = [m for m in {FORBIDDEN_AT_IMPORT!r} if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    bad = set(filter(None, out.stdout.strip().split(","))) - AT_IMPORT_EXEMPT.get(module, set())
    assert not bad, f"{module} imports {sorted(bad)}"


def test_core_imports_only_core() -> None:
    """No core module imports an I/O module of ours or an I/O library, even inside a function."""
    bad = []
    for m in CORE:
        for name, line in imports_of(m):
            target = _resolve(name)
            if target.split(".")[0] in PACKAGES and target not in CORE:
                bad.append(f"{m}:{line} imports the I/O module {target}")
            if name.split(".")[0] in IO_LIBRARIES and not m.startswith(MEASURES_FOR_REAL):
                bad.append(f"{m}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def test_packages_import_only_what_the_architecture_allows() -> None:
    bad = []
    for m, targets in internal_graph().items():
        unit = owner(m)
        if unit in ("frenzyd.daemon", "frenzyd.__main__", "frenzyd"):
            continue  # the composition root wires everything
        allowed = ALLOWED.get(unit)
        assert allowed is not None or unit in LEAVES, f"{m}: package {unit} is missing from ALLOWED"
        for t in targets:
            tu = owner(t)
            if tu == unit or tu in LEAVES or (allowed is not None and tu in allowed):
                continue
            bad.append(f"{m} imports {t} ({unit} may import {sorted(allowed or ())} and the leaves)")
        if unit == "frenzy_client":
            bad.extend(f"{m} imports the daemon's shell {t}" for t in targets if owner(t) in SHELL_FOR_CLIENT)
    assert not bad, "\n".join(bad)


def test_has_never_imports_sim() -> None:
    graph = internal_graph()
    bad = [f"{m} -> {t}" for m in graph if owner(m) == "frenzyd.has"
           for t in graph[m] if owner(t) == "frenzyd.sim"]
    assert not bad, "the scheduler must not depend on its simulator: " + ", ".join(bad)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles() -> None:
    cycles = find_cycles(internal_graph())
    assert not cycles, "import cycles (lazy imports included): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle() -> None:
    """The checker itself: a lazy back-edge is a cycle, a chain is not."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
