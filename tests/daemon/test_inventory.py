"""Inventory: the real NVML call fails cleanly here, declared devices, owner protection."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from frenzyd.errors import ConfigError, InventoryError
from frenzyd.gpu_types import GIB, GPU_TYPES
from frenzyd.node.inventory import (
    DeclaredBackend,
    GpuBackend,
    GpuInfo,
    Inventory,
    NvmlBackend,
    offerable,
    open_backend,
)


@dataclass(frozen=True)
class Decl:
    type: str
    count: int
    memory_gib: float | None = None


def _nvml_works() -> bool:
    try:
        NvmlBackend().close()
    except InventoryError:
        return False
    return True


def test_real_nvml_fails_cleanly_or_sees_gpus() -> None:
    if _nvml_works():
        backend = NvmlBackend()
        gpus = backend.snapshot()
        backend.close()
        assert all(not g.simulated and g.memory_bytes > 0 for g in gpus)
    else:
        with pytest.raises(InventoryError, match="NVML"):
            NvmlBackend()


def test_open_backend_falls_back_to_declared_devices() -> None:
    if _nvml_works():
        pytest.skip("this machine has a working NVML; the fallback path is covered where it does not")
    backend = open_backend([Decl("A100-80GB", 2), Decl("RTX-3090", 1)], "ws-07")
    assert isinstance(backend, DeclaredBackend)
    gpus = backend.snapshot()
    assert [g.uuid for g in gpus] == ["SIM-ws-07-0", "SIM-ws-07-1", "SIM-ws-07-2"]
    assert [g.type for g in gpus] == ["A100-80GB", "A100-80GB", "RTX-3090"]
    assert gpus[0].memory_bytes == GPU_TYPES["A100-80GB"].memory_bytes
    assert all(g.simulated and g.free_bytes == g.memory_bytes for g in gpus)


def test_declared_uuids_are_stable_across_restarts() -> None:
    a = DeclaredBackend([Decl("T4", 3)], "n1").snapshot()
    b = DeclaredBackend([Decl("T4", 3)], "n1").snapshot()
    c = DeclaredBackend([Decl("T4", 3)], "n2").snapshot()
    assert [g.uuid for g in a] == [g.uuid for g in b]
    assert not {g.uuid for g in a} & {g.uuid for g in c}


def test_declared_unknown_type_needs_memory() -> None:
    with pytest.raises(ConfigError, match="give its memory"):
        DeclaredBackend([Decl("Quadro-X", 1)], "n")
    gpus = DeclaredBackend([Decl("Quadro-X", 1, 12.0)], "n").snapshot()
    assert gpus[0].memory_bytes == 12 * GIB


@pytest.mark.parametrize(("count", "mem"), [(-1, None), (1, 0.0), (1, -3.0)])
def test_declared_rejects_bad_values(count: int, mem: float | None) -> None:
    with pytest.raises(ConfigError, match=r"\[\[devices\]\]"):
        DeclaredBackend([Decl("T4", count, mem)], "n")


class OwnerBusyBackend(GpuBackend):
    """A fake GPU node: GPU 0 runs an owner's process, GPU 1 runs a Frenzy rank, GPU 2 is nearly full."""

    def __init__(self, frenzy_pid: int) -> None:
        self.frenzy_pid = frenzy_pid
        self.calls = 0

    def snapshot(self) -> list[GpuInfo]:
        self.calls += 1
        m = 24 * GIB
        return [
            GpuInfo("GPU-a", 0, "RTX-3090", m, m // 2, 0.9, False, pids=(4242,)),
            GpuInfo("GPU-b", 1, "RTX-3090", m, m // 2, 0.9, False, pids=(self.frenzy_pid,)),
            GpuInfo("GPU-c", 2, "RTX-3090", m, GIB, 0.0, False),
            GpuInfo("GPU-d", 3, "RTX-3090", m, m, 0.0, False),
        ]


class FailingBackend(GpuBackend):
    def snapshot(self) -> list[GpuInfo]:
        raise InventoryError("NVML query failed: GPU is lost")


async def test_owner_protection_tells_foreign_processes_from_frenzys() -> None:
    own = {os.getpid()}
    inv = Inventory(OwnerBusyBackend(os.getpid()), lambda: own)
    gpus = await inv.refresh()
    assert [g.foreign_processes for g in gpus] == [1, 0, 0, 0]
    assert [g.uuid for g in inv.offerable(min_free_bytes=2 * GIB)] == ["GPU-b", "GPU-d"]
    assert [g.uuid for g in inv.offerable(min_free_bytes=0)] == ["GPU-b", "GPU-c", "GPU-d"]
    # a fraction of the GPU's memory works the same way
    assert [g.uuid for g in offerable(gpus, 0, min_free_fraction=0.9)] == ["GPU-d"]
    # once the rank's pid is no longer Frenzy's (it exited, a foreign process got the pid) it blocks the GPU
    own.clear()
    await inv.refresh()
    assert [g.uuid for g in inv.offerable(min_free_bytes=2 * GIB)] == ["GPU-d"]


async def test_refresh_failure_keeps_last_snapshot() -> None:
    inv = Inventory(DeclaredBackend([Decl("L4", 1)], "n"), set)
    await inv.refresh()
    inv.backend = FailingBackend()
    with pytest.raises(InventoryError, match="GPU is lost"):
        await inv.refresh()
    assert [g.type for g in inv.last] == ["L4"]


def test_gpu_json_is_marked_simulated() -> None:
    g = DeclaredBackend([Decl("A10", 1)], "n").snapshot()[0]
    js = g.to_json()
    assert js["simulated"] is True
    assert js["type"] == "A10"
    assert js["uuid"] == "SIM-n-0"
