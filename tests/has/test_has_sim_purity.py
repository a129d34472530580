"""Every HAS and simulator module is pure core: importing it brings no socket, thread or event loop."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "frenzyd.has.interface",
    "frenzyd.has.frenzy",
    "frenzyd.has.fifo",
    "frenzyd.has.sia",
    "frenzyd.has.gavel",
    "frenzyd.has.registry",
    "frenzyd.has.speed",
    "frenzyd.sim.model",
    "frenzyd.sim.simulator",
    "frenzyd.sim.cluster",
    "frenzyd.sim.trace",
    "frenzyd.sim.mapping",
    "frenzyd.sim.jobs",
    "frenzyd.sim.run",
]
FORBIDDEN = ["socket", "asyncio", "torch", "zeroconf", "aiohttp", "threading", "pynvml", "transformers"]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_nothing_impure(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
