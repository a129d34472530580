"""GPU inventory: NVML per GPU by UUID (or declared simulated devices), and owner protection.

The only module that imports ``pynvml``.  Every NVML call is blocking, so
:class:`Inventory` runs snapshots on a worker thread.  Any NVML failure at start
(no library, no driver, no permission, a driver/library or nvidia-ml-py mismatch)
means no real GPUs: :func:`open_backend` logs what is wrong and how to fix it, then
falls back to the devices the config declares, marked ``simulated`` wherever they appear.

Owner protection is conservative: a GPU is offered only when NVML positively says
that nothing but Frenzy's ranks and allow-listed processes (``[owner] ignore_processes``,
display servers by default) run on it.  A process query answering NOT_SUPPORTED, or
anything else NVML cannot answer, withholds the GPU with the reason shown
(:func:`withheld_reason`).  MIG instances are devices of their own, numbered
``MIG_INDEX_BASE + 10 * parent + slot``, for one-rank jobs (``frenzyd.gpu_types.cuda_device``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Final, Protocol

from frenzyd.config import DEFAULT_IGNORE_PROCESSES
from frenzyd.errors import ConfigError, InventoryError
from frenzyd.gpu_types import GIB, canonical_type, mig_index, type_info

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute or graphics process NVML lists on a GPU."""

    pid: int
    used_bytes: int | None = None
    """GPU memory it holds; None when NVML does not say (another user's process, WDDM, MIG)."""
    name: str | None = None
    """Executable name (basename); None when it cannot be read (another user, hidden /proc)."""
    compute: bool = False
    """NVML lists it as a compute (CUDA) process, not only a graphics one."""


@dataclass(frozen=True, slots=True)
class MigInfo:
    """Where a MIG instance lives: its parent GPU and its GPU/compute instance ids."""

    parent_uuid: str
    parent_index: int
    gpu_instance: int | None
    compute_instance: int | None

    def to_json(self) -> dict[str, Any]:
        return {"parent_uuid": self.parent_uuid, "parent_index": self.parent_index,
                "gpu_instance": self.gpu_instance, "compute_instance": self.compute_instance}


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU (or MIG instance) as seen now.

    ``foreign_processes`` counts processes on it that are neither Frenzy's nor allow-listed;
    ``unknown`` says why NVML could not tell who uses it (then it is never offered).
    """

    uuid: str
    index: int
    type: str
    memory_bytes: int
    free_bytes: int
    utilization: float
    """0..1, the fraction of the last sample period a kernel ran (0 for simulated devices)."""
    simulated: bool
    foreign_processes: int = 0
    pids: tuple[int, ...] = ()
    """Every compute/graphics process on the GPU (Frenzy's own included)."""
    processes: tuple[GpuProcess, ...] = ()
    """The same processes with what NVML knows of them (backends fill it; may be empty)."""
    unknown: str | None = None
    """Why the processes on it could not be listed (NVML answered NOT_SUPPORTED, ...); None = listed."""
    ignored: tuple[str, ...] = ()
    """Names of the allow-listed processes on it (a desktop session), filled by :class:`Inventory`."""
    ignored_bytes: int = 0
    """GPU memory the allow-listed processes hold (subtracted from ``free_bytes``)."""
    owner_processes: tuple[GpuProcess, ...] = ()
    """The processes counted in ``foreign_processes`` (filled by :class:`Inventory`)."""
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    mig: MigInfo | None = None
    withheld: str | None = None
    """A reason the backend already knows not to offer it (MIG, a query that failed)."""

    def to_json(self) -> dict[str, Any]:
        """The GPU as the status JSON of DESIGN.md §6 shows it (``offered``, ``reason`` and
        ``leased_to`` are added by the caller)."""
        return {
            "uuid": self.uuid,
            "index": self.index,
            "type": self.type,
            "memory_bytes": self.memory_bytes,
            "free_bytes": self.free_bytes,
            "utilization": self.utilization,
            "simulated": self.simulated,
            "foreign_processes": self.foreign_processes,
            "ignored_processes": list(self.ignored),
            "ignored_bytes": self.ignored_bytes,
            "processes_known": self.unknown is None,
            "compute_capability": self.compute_capability,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "mig": None if self.mig is None else self.mig.to_json(),
        }


class DeviceDeclaration(Protocol):
    """What inventory needs of a config ``[[devices]]`` entry (``frenzyd.config.DeviceDecl``)."""

    @property
    def type(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def memory_gib(self) -> float | None: ...


class GpuBackend(abc.ABC):
    """A source of GPU snapshots.  ``snapshot`` blocks; call it off the event loop.

    ``foreign_processes`` is filled by :class:`Inventory` (which knows Frenzy's
    own pids); backends report every pid in ``pids``.
    """

    simulated: bool = False
    note: str = ""
    """Why this backend serves the node (set by :func:`open_backend`: NVML's GPUs and driver, or
    the NVML failure and its fix); shown in the status JSON's ``node.gpu_backend`` and by doctor."""

    @abc.abstractmethod
    def snapshot(self) -> list[GpuInfo]:
        """Every GPU now; raises :class:`InventoryError` when the source fails."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release the backend (NVML shutdown)."""


class DeclaredBackend(GpuBackend):
    """The devices a config declares: simulated, always idle and empty, UUIDs stable per node."""

    simulated = True

    def __init__(self, devices: Iterable[DeviceDeclaration], node_name: str) -> None:
        gpus: list[GpuInfo] = []
        for decl in devices:
            if decl.count < 0:
                raise ConfigError(f"[[devices]] type {decl.type!r}: count must be >= 0, got {decl.count}")
            if decl.memory_gib is not None:
                if decl.memory_gib <= 0:
                    raise ConfigError(
                        f"[[devices]] type {decl.type!r}: memory_gib must be positive, got {decl.memory_gib}"
                    )
                memory = int(decl.memory_gib * GIB)
            else:
                memory = type_info(decl.type).memory_bytes  # unknown types need memory_gib
            for _ in range(decl.count):
                i = len(gpus)
                gpus.append(GpuInfo(f"SIM-{node_name}-{i}", i, decl.type, memory, memory, 0.0, True))
        self._gpus = tuple(gpus)

    def snapshot(self) -> list[GpuInfo]:
        return list(self._gpus)


# --- NVML ------------------------------------------------------------------------------------


def read_proc_comm(pid: int) -> str | None:
    """The executable name of ``pid`` from /proc (None when it is gone or hidden from us)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _installed_nvml_py() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class NvmlUnavailable(InventoryError):
    """NVML cannot start; ``expected`` when that is normal for the machine (no NVIDIA driver or
    nvidia-ml-py: a GPU-less box), not a GPU machine that is broken."""

    def __init__(self, message: str, *, expected: bool = False) -> None:
        super().__init__(message)
        self.expected = expected


_NO_GPU_MACHINE: Final = frozenset({"NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"})
"""Start-up failures that mean the machine has no NVIDIA driver at all (logged at INFO)."""


def init_failure_message(nv: ModuleType, exc: BaseException) -> str:
    """What an NVML failure at start means and what to do, for the log (never raises)."""
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    if mismatch is not None and isinstance(exc, mismatch):
        return (f"nvidia-ml-py {_installed_nvml_py()} does not match the driver's NVML library ({exc}): "
                "install the nvidia-ml-py release of the driver's major version, e.g. "
                "pip install 'nvidia-ml-py==<driver major>.*'")
    name = type(exc).__name__
    hints = {
        "NVMLError_LibraryNotFound": "libnvidia-ml.so.1 not found: no NVIDIA driver is installed",
        "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded (does nvidia-smi work?)",
        "NVMLError_NoPermission": "no permission to open /dev/nvidia*: add the daemon's user to the "
                                  "group that owns them (often 'video') or fix the device permissions",
        "NVMLError_LibRmVersionMismatch": "the NVML library and the loaded kernel driver differ (driver "
                                          "upgraded without a reboot?): reboot or reload the nvidia modules",
        "NVMLError_FunctionNotFound": f"nvidia-ml-py {_installed_nvml_py()} calls a function the driver's "
                                      "NVML lacks: install the nvidia-ml-py release matching the driver",
        "NVMLError_InsufficientPower": "a GPU lacks external power: check its power cables",
        "NVMLError_GpuIsLost": "a GPU fell off the bus: check dmesg and reset or reboot",
        "NVMLError_ResetRequired": "a GPU needs a reset (nvidia-smi -r) or a reboot",
        "NVMLError_CorruptedInforom": "a GPU's infoROM is corrupted: check nvidia-smi -q and the vendor",
        "NVMLError_Uninitialized": "NVML was used before it started (a bug: please report it)",
    }
    return f"NVML unavailable: {hints.get(name, f'{name}: {exc}')}"


class NvmlBackend(GpuBackend):
    """Real GPUs through NVML.  Construction calls ``nvmlInit``; :class:`NvmlUnavailable` on failure.

    ``nvml`` is the ``pynvml`` module (injected by tests); ``process_name`` names a pid when NVML
    cannot (default: /proc/PID/comm).
    """

    def __init__(
        self, nvml: ModuleType | None = None, *, process_name: Callable[[int], str | None] = read_proc_comm
    ) -> None:
        if nvml is None:
            try:
                import pynvml as nvml_mod
            except ImportError as exc:
                raise NvmlUnavailable("NVML unavailable: the nvidia-ml-py package is not installed "
                                      "(pip install nvidia-ml-py)", expected=True) from exc
            nvml = nvml_mod
        self._nvml: ModuleType = nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        # Not an NVMLError subclass: catching NVMLError alone let it crash the daemon at start.
        self._mismatch: type[BaseException] | None = mismatch if isinstance(mismatch, type) else None
        self._errors: tuple[type[BaseException], ...] = tuple(
            e for e in (getattr(nvml, "NVMLError", None), self._mismatch) if isinstance(e, type)
        )
        self._errors_or_missing: tuple[type[BaseException], ...] = (*self._errors, AttributeError)
        self._process_name = process_name
        self._lock = threading.Lock()
        self._uuids: dict[int, str] = {}
        self._seen: dict[str, GpuInfo] = {}
        """The last good reading of each GPU, kept for a GPU NVML later fails on (shown withheld)."""
        try:
            nvml.nvmlInit()
        except self._errors as exc:
            raise NvmlUnavailable(init_failure_message(nvml, exc),
                                  expected=type(exc).__name__ in _NO_GPU_MACHINE) from exc
        self.driver_version = self._optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        self.cuda_driver_version = self._optional(self._cuda_version)

    def _optional(self, read: Callable[[], str]) -> str | None:
        try:
            return read()
        except self._errors:
            return None

    def _instance_id(self, read: Callable[[Any], Any], handle: Any) -> int | None:
        try:
            return int(read(handle))
        except self._errors:
            return None

    def _cuda_version(self) -> str:
        v = int(self._nvml.nvmlSystemGetCudaDriverVersion())
        return f"{v // 1000}.{v % 1000 // 10}"

    def snapshot(self) -> list[GpuInfo]:
        nv = self._nvml
        with self._lock:
            try:
                count = int(nv.nvmlDeviceGetCount())
            except self._errors as exc:
                raise InventoryError(f"NVML query failed: {exc}") from exc
            out: list[GpuInfo] = []
            for i in range(count):
                out.extend(self._device(i))
            return out

    def _device(self, index: int) -> list[GpuInfo]:
        """The GPU at ``index``, or its MIG instances; a GPU NVML fails on is withheld, not dropped."""
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            self._uuids[index] = uuid
        except self._errors as exc:
            known = self._seen.get(self._uuids.get(index, ""))
            if known is None:
                log.warning("GPU %d: NVML cannot identify it (%s); it is not offered", index, exc)
                return []
            return [replace(known, free_bytes=0, utilization=0.0, withheld=f"NVML query failed: {exc}")]
        try:
            cc = nv.nvmlDeviceGetCudaComputeCapability(handle)
            capability: str | None = f"{int(cc[0])}.{int(cc[1])}"
        except self._errors:
            capability = None
        try:
            mig_mode = int(nv.nvmlDeviceGetMigMode(handle)[0])
        except self._errors_or_missing:  # NOT_SUPPORTED without MIG; a pynvml without MIG calls
            mig_mode = 0
        if mig_mode == int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)):
            migs = self._mig_devices(handle, index, uuid, capability)
            if migs:
                return migs
            base = self._info(handle, index, uuid, capability, None)
            return [replace(base, withheld=base.withheld or "MIG is enabled but no instance exists: create "
                            "instances (nvidia-smi mig -cgi PROFILES -C) or disable MIG")]
        return [self._info(handle, index, uuid, capability, None)]

    def _mig_devices(
        self, parent: Any, index: int, parent_uuid: str, capability: str | None
    ) -> list[GpuInfo]:
        nv = self._nvml
        out = []
        try:
            slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(parent))
            parent_type = canonical_type(_text(nv.nvmlDeviceGetName(parent)),
                                         int(nv.nvmlDeviceGetMemoryInfo(parent).total))
        except self._errors:
            return []
        for slot in range(slots):
            try:
                h = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
            except self._errors:  # NOT_FOUND: an empty slot
                continue
            mig = MigInfo(parent_uuid, index, self._instance_id(nv.nvmlDeviceGetGpuInstanceId, h),
                          self._instance_id(nv.nvmlDeviceGetComputeInstanceId, h))
            out.append(self._info(h, mig_index(index, slot), uuid, capability, mig, parent_type=parent_type))
        return out

    def _info(
        self, handle: Any, index: int, uuid: str, capability: str | None, mig: MigInfo | None = None,
        *, parent_type: str | None = None,
    ) -> GpuInfo:
        """One device; a MIG slice is typed ``PARENT-MIG-PROFILE`` (e.g. ``A100-40GB-MIG-3g.20gb``):
        it has neither its parent's memory nor its speed."""
        nv = self._nvml
        try:
            name = _text(nv.nvmlDeviceGetName(handle))
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            total, free = int(mem.total), int(mem.free)
        except self._errors as exc:
            reason = f"NVML cannot read its name or memory ({exc})"
            known = self._seen.get(uuid)
            if known is not None:
                return replace(known, free_bytes=0, utilization=0.0, withheld=reason)
            return GpuInfo(uuid, index, "unknown-gpu", 0, 0, 0.0, False, withheld=reason,
                           compute_capability=capability, driver_version=self.driver_version,
                           cuda_driver_version=self.cuda_driver_version, mig=mig)
        try:
            util = nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except self._errors:  # NOT_SUPPORTED on MIG instances and some boards: no load figure
            util = 0.0
        procs, unknown = self._processes(handle)
        gtype = canonical_type(name, total)
        if parent_type is not None:
            m = re.search(r"\bMIG\s+(\S+)", name)
            gtype = f"{parent_type}-MIG-{m.group(1) if m else f'{total // GIB}gb'}"
        info = GpuInfo(
            uuid=uuid, index=index, type=gtype, memory_bytes=total, free_bytes=free,
            utilization=util, simulated=False, pids=tuple(p.pid for p in procs), processes=procs,
            unknown=unknown, compute_capability=capability, driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version, mig=mig,
        )
        self._seen[uuid] = info
        return info

    def _processes(self, handle: Any) -> tuple[tuple[GpuProcess, ...], str | None]:
        """Every compute and graphics process, and why the list is incomplete (None = complete).

        Conservative: any answer other than a list (NOT_SUPPORTED, NO_PERMISSION, a function the
        driver lacks, a malformed entry) makes the list unknown, which withholds the GPU.
        """
        nv = self._nvml
        by_pid: dict[int, GpuProcess] = {}
        problems: list[str] = []
        for kind in ("compute", "graphics"):
            entries: list[Any] | None = None
            err = "this pynvml has no call to list them"
            # The unversioned call raises NVMLLibraryMismatchError when the driver's NVML lacks the
            # newest struct version; the _v2 call then still works on older drivers.
            for suffix in ("", "_v2"):
                getter = getattr(nv, f"nvmlDeviceGet{kind.title()}RunningProcesses{suffix}", None)
                if getter is None:
                    continue
                try:
                    entries = list(getter(handle))
                    break
                except self._errors as exc:
                    err = self._describe(exc)
                    if not self._is_mismatch(exc):
                        break
            if entries is None:
                problems.append(f"{kind} processes: {err}")
                continue
            for e in entries:
                try:
                    pid = int(e.pid)
                    used = getattr(e, "usedGpuMemory", None)
                    used_bytes = None if used is None else int(used)
                except (AttributeError, TypeError, ValueError):
                    problems.append(f"{kind} processes: NVML returned an unreadable entry")
                    continue
                old = by_pid.get(pid)
                if old is not None and old.used_bytes is not None:
                    used_bytes = max(old.used_bytes, used_bytes or 0)
                by_pid[pid] = GpuProcess(pid, used_bytes, old.name if old else self._name(pid),
                                         compute=kind == "compute" or (old is not None and old.compute))
        unknown = "; ".join(problems) if problems else None
        return tuple(by_pid[p] for p in sorted(by_pid)), unknown

    def _is_mismatch(self, exc: BaseException) -> bool:
        return self._mismatch is not None and isinstance(exc, self._mismatch)

    def _describe(self, exc: BaseException) -> str:
        if self._is_mismatch(exc):
            return f"nvidia-ml-py {_installed_nvml_py()} does not match the driver's NVML"
        return f"NVML answered {exc}"

    def _name(self, pid: int) -> str | None:
        try:
            name = _text(self._nvml.nvmlSystemGetProcessName(pid)).strip()
        except self._errors_or_missing:
            name = ""
        name = name or (self._process_name(pid) or "").strip()
        return os.path.basename(name.split()[0]) if name else None

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self._nvml.nvmlShutdown()


def open_backend(
    devices: Sequence[DeviceDeclaration], node_name: str, *, nvml: ModuleType | None = None,
    process_name: Callable[[int], str | None] = read_proc_comm,
) -> GpuBackend:
    """NVML when it initialises and sees at least one GPU, else the declared devices.

    Every NVML failure (no library, no driver, no permission, a version mismatch, ...) is logged
    once with what to do and means the declared devices; a bad declaration raises
    :class:`ConfigError`.  ``nvml`` replaces the ``pynvml`` module (tests).
    """
    declared = DeclaredBackend(devices, node_name)  # validate the config even when NVML works
    n = len(declared.snapshot())
    try:
        backend = NvmlBackend(nvml, process_name=process_name)
    except NvmlUnavailable as exc:
        log.log(logging.INFO if exc.expected else logging.WARNING,
                "%s (offering %d declared simulated device(s))", exc, n)
        declared.note = str(exc)
        return declared
    try:
        gpus = backend.snapshot()
    except InventoryError as exc:
        backend.close()
        log.warning("%s (offering %d declared simulated device(s))", exc, n)
        declared.note = str(exc)
        return declared
    if gpus:
        backend.note = (f"NVML: {len(gpus)} GPU(s), driver {backend.driver_version}, "
                        f"CUDA {backend.cuda_driver_version}")
        log.info("%s", backend.note)
        return backend
    backend.close()
    log.info("NVML sees no GPU; offering %d declared simulated device(s)", n)
    declared.note = "NVML sees no GPU"
    return declared


# --- owner protection -------------------------------------------------------------------------


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def withheld_reason(
    g: GpuInfo, min_free_bytes: int = 0, min_free_fraction: float = 0.0, *, protect_owner: bool = True
) -> str | None:
    """Why the GPU is not offered now, or None when it may be offered.

    Not offered: a reason the backend gave (MIG, a failed query); with ``protect_owner``
    (``[owner] protect_foreign_processes``), also a process list NVML could not give, a process
    that is neither Frenzy's nor allow-listed, or less free memory than
    ``max(min_free_bytes, min_free_fraction * memory_bytes)``.
    """
    if g.withheld:
        return g.withheld
    if not protect_owner:
        return None
    if g.unknown is not None:
        return (f"cannot tell whether the owner uses it ({g.unknown}); on a machine only Frenzy uses, "
                "set [owner] protect_foreign_processes = false")
    if g.foreign_processes > 0:
        shown = [f"{p.name or 'unnamed process'}" + (f" {_gib(p.used_bytes)}" if p.used_bytes else "")
                 for p in g.owner_processes[:3]]
        more = g.foreign_processes - len(shown)
        what = ", ".join(shown + ([f"{more} more"] if more > 0 else []))
        return f"in use by the owner: {g.foreign_processes} process(es) that are not Frenzy's ({what})"
    need = max(min_free_bytes, int(min_free_fraction * g.memory_bytes))
    if g.free_bytes < need:
        return (f"{_gib(g.free_bytes)} free, below the {_gib(need)} the owner keeps "
                "([owner] min_free_fraction)")
    return None


def offerable(gpus: Iterable[GpuInfo], min_free_bytes: int, min_free_fraction: float = 0.0) -> list[GpuInfo]:
    """Owner protection: the GPUs Frenzy may offer now (:func:`withheld_reason` is None)."""
    return [g for g in gpus if withheld_reason(g, min_free_bytes, min_free_fraction) is None]


def classify(g: GpuInfo, own: set[int], ignore: frozenset[str]) -> GpuInfo:
    """Tell Frenzy's processes, allow-listed ones (their memory subtracted from ``free_bytes``) and
    the owner's apart.  A process whose name cannot be read counts as the owner's, and so does an
    allow-listed name running CUDA work (a job named ``Xorg`` is still a job): the allow-list is for
    display servers, which NVML lists as graphics processes only."""
    named = {p.pid: p for p in g.processes}
    owner: list[GpuProcess] = []
    ignored: list[str] = []
    ignored_bytes = 0
    for pid in g.pids:
        if pid in own:
            continue
        proc = named.get(pid, GpuProcess(pid))
        if proc.name is not None and proc.name in ignore and not proc.compute:
            ignored.append(proc.name)
            ignored_bytes += proc.used_bytes or 0
            continue
        owner.append(proc)
    # NVML's free memory already excludes what the desktop holds; subtracting it explicitly keeps that
    # true where a driver reports free memory without it.
    free = min(g.free_bytes, max(0, g.memory_bytes - ignored_bytes)) if ignored_bytes else g.free_bytes
    return replace(g, foreign_processes=max(len(owner), g.foreign_processes), owner_processes=tuple(owner),
                   ignored=tuple(sorted(ignored)), ignored_bytes=ignored_bytes, free_bytes=free)


class Inventory:
    """Periodic view of this node's GPUs, with Frenzy's own processes told from the owner's.

    ``ignore_processes`` names processes (executable basenames) that do not count as the owner's
    work, e.g. a display server (``[owner] ignore_processes``).
    """

    def __init__(
        self, backend: GpuBackend, own_pids: Callable[[], set[int]],
        ignore_processes: Iterable[str] = DEFAULT_IGNORE_PROCESSES,
    ) -> None:
        self.backend = backend
        self._own_pids = own_pids
        self._ignore = frozenset(ignore_processes)
        self._last: list[GpuInfo] = []

    @property
    def simulated(self) -> bool:
        return self.backend.simulated

    @property
    def last(self) -> list[GpuInfo]:
        """The last snapshot (empty before the first refresh)."""
        return list(self._last)

    def _snapshot(self) -> list[GpuInfo]:
        own = self._own_pids()
        return [classify(g, own, self._ignore) for g in self.backend.snapshot()]

    async def refresh(self) -> list[GpuInfo]:
        """Take a snapshot on a worker thread; on a backend failure keep the last one and raise."""
        self._last = await asyncio.to_thread(self._snapshot)
        return list(self._last)

    def offerable(
        self, gpus: Iterable[GpuInfo] | None = None, min_free_bytes: int = 0, min_free_fraction: float = 0.0
    ) -> list[GpuInfo]:
        """:func:`offerable` over ``gpus`` (default: the last snapshot)."""
        return offerable(self._last if gpus is None else gpus, min_free_bytes, min_free_fraction)

    def close(self) -> None:
        self.backend.close()
