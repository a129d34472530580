"""The pure core must not drag in sockets, asyncio, torch, zeroconf or threads (STYLE.md habit 1)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

CORE_MODULES = [
    "frenzyd.errors",
    "frenzyd.gpu_types",
    "frenzyd.marp.spec",
    "frenzyd.marp.model",
    "frenzyd.marp.analytic",
    "frenzyd.marp.plans",
    "frenzyd.marp.validate",
    "frenzyd.marp.overhead",
    "frenzyd.marp.baselines",
    "frenzyd.marp.trace",  # imports torch lazily, inside its functions
    "frenzyd.has.interface",
    "frenzyd.has.frenzy",
    "frenzyd.has.fifo",
    "frenzyd.sim.simulator",
    "frenzyd.wire",
    "frenzyd.auth",
    "frenzyd.election",
    "frenzyd.peer_table",
    "frenzyd.jobs",
    "frenzyd.state",
    "frenzyd.placement",
]
FORBIDDEN = ["socket", "asyncio", "torch", "zeroconf", "aiohttp", "threading", "pynvml", "transformers"]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_nothing_impure(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"core module {module} is missing")
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
