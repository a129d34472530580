"""NVML failure modes with a fake ``pynvml``: a real module object that keeps the real package's error
classes and constants (so ``NVMLError(3)`` is the real ``NVMLError_NotSupported``) and answers the
device calls from a table."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as real
import pytest

from frenzyd.config import DEFAULT_IGNORE_PROCESSES
from frenzyd.errors import InventoryError
from frenzyd.gpu_types import GIB, mig_index
from frenzyd.node.inventory import (
    DeclaredBackend,
    Inventory,
    NvmlBackend,
    open_backend,
    withheld_reason,
)

MIB = 1 << 20


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 3090"
    uuid: str = "GPU-aaaa"
    total: int = 24 * GIB
    used: int = 0
    cc: tuple[int, int] = (8, 6)
    compute: list[Proc] | int = field(default_factory=list)  # an int: that NVML error code
    graphics: list[Proc] | int = field(default_factory=list)
    mig: list[FakeGpu] | None = None  # MIG instances (MIG mode enabled)


def nvml_error(code: int) -> Exception:
    return real.NVMLError(code)  # the real class picks the real subclass, e.g. NVMLError_NotSupported


def fake_nvml(
    gpus: list[FakeGpu], *, init_error: Exception | None = None, names: dict[int, str] | None = None,
    mismatch_v3: bool = False,
) -> types.ModuleType:
    """A ``pynvml`` stand-in over ``gpus``; ``mismatch_v3``: the unversioned process calls raise
    ``NVMLLibraryMismatchError`` (the driver's NVML lacks the _v3 struct), the ``_v2`` calls work."""
    nv = types.ModuleType("pynvml")
    for k, v in vars(real).items():
        if k.startswith(("NVML_", "NVMLError", "NVMLLibraryMismatchError")):
            setattr(nv, k, v)
    handles: dict[int, FakeGpu] = {}

    def handle_of(g: FakeGpu) -> int:
        handles[id(g)] = g
        return id(g)

    def g_of(h: int) -> FakeGpu:
        return handles[h]

    def init() -> None:
        if init_error is not None:
            raise init_error

    def procs(kind: str, versioned: bool) -> Callable[[int], list[Proc]]:
        def get(h: int) -> list[Proc]:
            if mismatch_v3 and not versioned:
                raise real.NVMLLibraryMismatchError("Unversioned function called ...")
            answer = getattr(g_of(h), kind)
            if isinstance(answer, int):
                raise nvml_error(answer)
            return list(answer)
        return get

    def mig_mode(h: int) -> list[int]:
        if g_of(h).mig is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def mig_handle(h: int, i: int) -> int:
        inst = g_of(h).mig or []
        if i >= len(inst):
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return handle_of(inst[i])

    def process_name(pid: int) -> str:
        if names is None or pid not in names:
            raise nvml_error(real.NVML_ERROR_NO_PERMISSION)  # another user's process
        return names[pid]

    funcs: dict[str, Any] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "550.54.14",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: handle_of(gpus[i]),
        "nvmlDeviceGetName": lambda h: g_of(h).name,
        "nvmlDeviceGetUUID": lambda h: g_of(h).uuid,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=g_of(h).total, free=g_of(h).total - g_of(h).used, used=g_of(h).used),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=10, memory=5),
        "nvmlDeviceGetCudaComputeCapability": lambda h: g_of(h).cc,
        "nvmlDeviceGetComputeRunningProcesses": procs("compute", False),
        "nvmlDeviceGetComputeRunningProcesses_v2": procs("compute", True),
        "nvmlDeviceGetGraphicsRunningProcesses": procs("graphics", False),
        "nvmlDeviceGetGraphicsRunningProcesses_v2": procs("graphics", True),
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda h: 1 + (g_of(h).mig or [None]).__len__(),
        "nvmlDeviceGetComputeInstanceId": lambda h: 0,
        "nvmlSystemGetProcessName": process_name,
    }
    for k, f in funcs.items():
        setattr(nv, k, f)
    return nv


@dataclass(frozen=True)
class Decl:
    type: str
    count: int
    memory_gib: float | None = None


def no_proc(pid: int) -> str | None:
    return None


def snap(nv: types.ModuleType, own: set[int] | None = None,
         ignore: tuple[str, ...] = DEFAULT_IGNORE_PROCESSES) -> list[Any]:
    inv = Inventory(NvmlBackend(nv, process_name=no_proc), lambda: own or set(), ignore)
    return inv._snapshot()


# --- failure modes at start -------------------------------------------------------------------


@pytest.mark.parametrize(("error", "says"), [
    (nvml_error(real.NVML_ERROR_LIBRARY_NOT_FOUND), "no NVIDIA driver is installed"),
    (nvml_error(real.NVML_ERROR_DRIVER_NOT_LOADED), "driver is not loaded"),
    (nvml_error(real.NVML_ERROR_NO_PERMISSION), "no permission to open /dev/nvidia"),
    (nvml_error(real.NVML_ERROR_LIB_RM_VERSION_MISMATCH), "reboot"),
    (real.NVMLLibraryMismatchError("Unversioned function called"), "does not match the driver's NVML"),
    (nvml_error(real.NVML_ERROR_UNKNOWN), "NVMLError_Unknown"),
])
def test_init_failure_is_a_clear_message_and_falls_back(
    error: Exception, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    nv = fake_nvml([FakeGpu()], init_error=error)
    with pytest.raises(InventoryError, match=says):
        NvmlBackend(nv)
    with caplog.at_level(logging.INFO, logger="frenzyd.node.inventory"):
        backend = open_backend([Decl("T4", 2)], "n1", nvml=nv)
    assert isinstance(backend, DeclaredBackend)
    assert len(backend.snapshot()) == 2
    (rec,) = [r for r in caplog.records if says in r.getMessage()]
    assert "2 declared simulated device(s)" in rec.getMessage()
    # a machine without the library or driver is normal (INFO); a broken GPU machine is a WARNING
    quiet = "installed" in says or "not loaded" in says  # no driver at all: normal, not broken
    assert rec.levelno == (logging.INFO if quiet else logging.WARNING)


def test_library_not_found_through_sys_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default path imports ``pynvml`` itself: a fake one in sys.modules is what it gets."""
    nv = fake_nvml([FakeGpu()], init_error=nvml_error(real.NVML_ERROR_LIBRARY_NOT_FOUND))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert isinstance(open_backend([Decl("L4", 1)], "n"), DeclaredBackend)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    with pytest.raises(InventoryError, match="pip install nvidia-ml-py"):
        NvmlBackend()


def test_library_mismatch_in_process_query_does_not_crash_and_uses_v2() -> None:
    """``NVMLLibraryMismatchError`` is not an NVMLError: it used to escape the first snapshot and end
    the daemon.  The older _v2 call answers instead."""
    assert not issubclass(real.NVMLLibraryMismatchError, real.NVMLError)
    nv = fake_nvml([FakeGpu(compute=[Proc(4242, 2 * GIB)])], names={4242: "python3"}, mismatch_v3=True)
    (g,) = snap(nv)
    assert g.unknown is None
    assert g.foreign_processes == 1
    assert "python3 2.0 GiB" in (withheld_reason(g) or "")


def test_library_mismatch_without_v2_withholds_the_gpu() -> None:
    nv = fake_nvml([FakeGpu()], mismatch_v3=True)
    del nv.nvmlDeviceGetComputeRunningProcesses_v2
    backend = open_backend([], "n", nvml=nv, process_name=no_proc)
    assert isinstance(backend, NvmlBackend)  # the GPU is there, it just cannot be offered
    (g,) = Inventory(backend, set)._snapshot()
    reason = withheld_reason(g) or ""
    assert "cannot tell whether the owner uses it" in reason
    assert "nvidia-ml-py" in reason


# --- owner protection -------------------------------------------------------------------------


def test_not_supported_process_query_withholds_the_gpu_with_the_reason() -> None:
    """The owner's 8.8 GiB job on a board whose process query answers NOT_SUPPORTED: never offered."""
    ns = real.NVML_ERROR_NOT_SUPPORTED
    nv = fake_nvml([FakeGpu(used=int(8.8 * GIB), compute=ns, graphics=ns),
                    FakeGpu(uuid="GPU-bbbb")])
    busy, idle = snap(nv)
    reason = withheld_reason(busy, 0, 0.0)
    assert reason is not None
    assert "Not Supported" in reason
    assert "protect_foreign_processes = false" in reason
    assert withheld_reason(idle, 0, 0.0) is None
    # only the admin's explicit "this machine is Frenzy's" offers it
    assert withheld_reason(busy, 0, 0.0, protect_owner=False) is None
    assert busy.to_json()["processes_known"] is False


def test_one_failing_query_kind_is_enough_to_withhold() -> None:
    nv = fake_nvml([FakeGpu(graphics=real.NVML_ERROR_NO_PERMISSION)])
    (g,) = snap(nv)
    assert "graphics processes: NVML answered Insufficient Permissions" in (withheld_reason(g) or "")


def test_desktop_session_does_not_withhold_and_its_memory_is_subtracted() -> None:
    x, shell = Proc(900, 300 * MIB), Proc(901, 200 * MIB)
    gpu = FakeGpu(used=500 * MIB, graphics=[x, shell])
    nv = fake_nvml([gpu], names={900: "/usr/lib/xorg/Xorg", 901: "/usr/bin/gnome-shell"})
    (g,) = snap(nv)
    assert g.foreign_processes == 0
    assert g.ignored == ("Xorg", "gnome-shell")
    assert g.ignored_bytes == 500 * MIB
    assert g.free_bytes == 24 * GIB - 500 * MIB
    assert withheld_reason(g, 0, 0.5) is None
    js = g.to_json()
    assert js["ignored_processes"] == ["Xorg", "gnome-shell"]
    assert js["ignored_bytes"] == 500 * MIB
    # a driver that does not count the desktop in "used": the allow-listed memory is subtracted anyway
    gpu.used = 0
    (g,) = snap(nv)
    assert g.free_bytes == 24 * GIB - 500 * MIB
    # with an empty allow-list the desktop is the owner's work
    (g,) = snap(nv, ignore=())
    assert g.foreign_processes == 2
    assert "Xorg" in (withheld_reason(g) or "")


def test_a_process_of_another_user_withholds_the_gpu() -> None:
    """NVML lists another user's process but hides its memory, and its name cannot be read: it is
    the owner's work (conservative), and the reason says so without naming it."""
    nv = fake_nvml([FakeGpu(used=3 * GIB, compute=[Proc(31337, None)])], names={})
    (g,) = snap(nv)
    assert g.foreign_processes == 1
    assert g.processes[0].name is None
    assert g.processes[0].used_bytes is None
    assert withheld_reason(g) == "in use by the owner: 1 process(es) that are not Frenzy's (unnamed process)"
    # a rank Frenzy started (under run_as, another user) is Frenzy's own
    (g,) = snap(nv, own={31337})
    assert g.foreign_processes == 0
    assert withheld_reason(g) is None


def test_a_process_named_like_a_display_server_only_counts_by_its_name() -> None:
    nv = fake_nvml([FakeGpu(compute=[Proc(5, GIB)])], names={5: "python"})
    (g,) = snap(nv, ignore=("Xorg",))
    assert g.foreign_processes == 1


# --- MIG, versions ----------------------------------------------------------------------------


def test_mig_instances_are_devices_with_their_parent() -> None:
    a = FakeGpu("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-1111", 20 * GIB)
    b = FakeGpu("NVIDIA A100-SXM4-40GB MIG 2g.10gb", "MIG-2222", 10 * GIB, compute=[Proc(77, GIB)])
    parent = FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-parent", 40 * GIB, cc=(8, 0), mig=[a, b])
    plain = FakeGpu(uuid="GPU-plain")
    gpus = snap(fake_nvml([parent, plain], names={77: "python"}))
    assert [g.uuid for g in gpus] == ["MIG-1111", "MIG-2222", "GPU-plain"]
    m1, m2, p = gpus
    assert m1.memory_bytes == 20 * GIB
    assert m1.type == "A100-40GB-MIG-3g.20gb"
    assert m2.type == "A100-40GB-MIG-2g.10gb"
    assert m1.mig is not None
    assert m1.mig.parent_uuid == "GPU-parent"
    assert m1.mig.parent_index == 0
    assert m1.compute_capability == "8.0"
    assert m2.foreign_processes == 1
    assert (m1.index, m2.index, p.index) == (mig_index(0, 0), mig_index(0, 1), 1)
    assert withheld_reason(m1) is None  # offered: a one-rank job runs on it by its UUID
    assert "python" in (withheld_reason(m2) or "")
    assert m1.to_json()["mig"]["parent_uuid"] == "GPU-parent"
    assert p.mig is None
    assert withheld_reason(p) is None


def test_mig_enabled_without_instances_shows_the_parent_withheld() -> None:
    (g,) = snap(fake_nvml([FakeGpu("NVIDIA A100-SXM4-80GB", "GPU-p", 80 * GIB, mig=[])]))
    assert g.uuid == "GPU-p"
    assert "no instance exists" in (withheld_reason(g) or "")


def test_versions_and_compute_capability_in_the_json() -> None:
    (g,) = snap(fake_nvml([FakeGpu(cc=(8, 9), name="NVIDIA GeForce RTX 4090")]))
    js = g.to_json()
    assert js["type"] == "RTX-4090"
    assert js["compute_capability"] == "8.9"
    assert js["driver_version"] == "550.54.14"
    assert js["cuda_driver_version"] == "12.4"
    assert js["processes_known"] is True


def test_a_gpu_lost_later_stays_listed_and_withheld() -> None:
    gpu = FakeGpu()
    nv = fake_nvml([gpu])
    backend = NvmlBackend(nv, process_name=no_proc)
    (g,) = backend.snapshot()
    assert g.withheld is None

    def lost(h: int) -> Any:
        raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)

    nv.nvmlDeviceGetHandleByIndex = lost
    (g,) = backend.snapshot()
    assert g.uuid == "GPU-aaaa"
    assert g.type == "RTX-3090"
    assert g.free_bytes == 0
    assert withheld_reason(g) == "NVML query failed: GPU is lost"


def test_an_allow_listed_name_doing_cuda_work_is_the_owners() -> None:
    """Naming a CUDA job 'Xorg' does not hide it: allow-listed names count only as graphics processes."""
    nv = fake_nvml([FakeGpu(used=5 * GIB, compute=[Proc(66, 5 * GIB)], graphics=[Proc(66, 5 * GIB)])],
                   names={66: "Xorg"})
    (g,) = snap(nv)
    assert g.processes[0].compute
    assert g.foreign_processes == 1
    assert "Xorg" in (withheld_reason(g) or "")


def test_ignore_processes_config() -> None:
    from frenzyd.config import config_from_dict
    from frenzyd.errors import ConfigError

    def load(owner: dict[str, Any]) -> Any:
        raw = {"node": {"name": "n", "data_dir": "/tmp/x"}, "pool": {"credentials": "/tmp/c"}, "owner": owner}
        return config_from_dict(raw, {}, base=Path("/tmp")).owner.ignore_processes

    assert load({}) == DEFAULT_IGNORE_PROCESSES
    assert {"Xorg", "Xwayland", "gnome-shell", "kwin_wayland", "plasmashell"} <= set(DEFAULT_IGNORE_PROCESSES)
    assert load({"ignore_processes": ["Xorg", "my-kiosk"]}) == ("Xorg", "my-kiosk")
    assert load({"ignore_processes": []}) == ()
    with pytest.raises(ConfigError, match=r"\[owner\] ignore_processes"):
        load({"ignore_processes": 3})
    with pytest.raises(ConfigError, match="did you mean 'ignore_processes'"):
        load({"ignore_process": ["Xorg"]})


def test_status_json_passes_the_inventory_fields_through() -> None:
    from frenzyd.jobs.status import PeerState, build_status

    (g,) = snap(fake_nvml([FakeGpu(compute=real.NVML_ERROR_NOT_SUPPORTED)]))
    reason = withheld_reason(g)
    report = {"gpus": [{**g.to_json(), "offered": reason is None, "reason": reason, "leased_to": None}]}
    st = build_status(node_id="n", node_name="n", term=1, coordinator=None,
                      peers=[PeerState("n", "n", "127.0.0.1:1", True, report)], jobs=[])
    (gj,) = st["peers"][0]["gpus"]
    assert gj["offered"] is False
    assert "Not Supported" in gj["reason"]
    assert gj["compute_capability"] == "8.6"
    assert gj["driver_version"] == "550.54.14"
    assert gj["cuda_driver_version"] == "12.4"
    assert gj["processes_known"] is False
    assert gj["mig"] is None
