"""GPU inventory: NVML per GPU by UUID (or declared simulated devices), and owner protection.

The only module that imports ``pynvml``.  Every NVML call is blocking, so
:class:`Inventory` runs snapshots on a worker thread.  Any ``NVMLError`` at start
means no real GPUs: :func:`open_backend` then falls back to the devices the
config declares, marked ``simulated`` wherever they appear.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from frenzyd.errors import ConfigError, InventoryError
from frenzyd.gpu_types import GIB, canonical_type, type_info

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as seen now.  ``foreign_processes`` counts processes on it that are not Frenzy's."""

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

    def to_json(self) -> dict[str, Any]:
        """The GPU as the status JSON of DESIGN.md §6 shows it (``leased_to`` is added by the caller)."""
        return {
            "uuid": self.uuid,
            "index": self.index,
            "type": self.type,
            "memory_bytes": self.memory_bytes,
            "free_bytes": self.free_bytes,
            "utilization": self.utilization,
            "simulated": self.simulated,
            "foreign_processes": self.foreign_processes,
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


class NvmlBackend(GpuBackend):
    """Real GPUs through NVML.  Construction calls ``nvmlInit`` and raises InventoryError on failure."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        self._lock = threading.Lock()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise InventoryError(f"NVML unavailable ({exc}); declared devices will be used") from exc

    def snapshot(self) -> list[GpuInfo]:
        nv = self._nvml
        with self._lock:
            try:
                return [self._one(i) for i in range(nv.nvmlDeviceGetCount())]
            except nv.NVMLError as exc:
                raise InventoryError(f"NVML query failed: {exc}") from exc

    def _one(self, index: int) -> GpuInfo:
        nv = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        name = nv.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        uuid = nv.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        try:
            util = nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except nv.NVMLError:
            util = 0.0
        pids: set[int] = set()
        for getter in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                pids.update(int(p.pid) for p in getter(handle))
            except nv.NVMLError:
                continue
        return GpuInfo(
            uuid=uuid,
            index=index,
            type=canonical_type(name, int(mem.total)),
            memory_bytes=int(mem.total),
            free_bytes=int(mem.free),
            utilization=util,
            simulated=False,
            pids=tuple(sorted(pids)),
        )

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def open_backend(devices: Sequence[DeviceDeclaration], node_name: str) -> GpuBackend:
    """NVML when it initialises and sees at least one GPU, else the declared devices.

    Any NVML error (no library, no driver, ...) is logged once and means the
    declared devices; a bad declaration raises :class:`ConfigError`.
    """
    declared = DeclaredBackend(devices, node_name)  # validate the config even when NVML works
    try:
        backend = NvmlBackend()
        if backend.snapshot():
            return backend
        backend.close()
        log.info("NVML sees no GPU; offering %d declared simulated device(s)", len(declared.snapshot()))
    except InventoryError as exc:
        log.info("%s (%d declared simulated device(s))", exc, len(declared.snapshot()))
    return declared


def offerable(gpus: Iterable[GpuInfo], min_free_bytes: int, min_free_fraction: float = 0.0) -> list[GpuInfo]:
    """Owner protection: the GPUs Frenzy may offer now.

    A GPU with a process that is not Frenzy's, or with less than
    ``max(min_free_bytes, min_free_fraction * memory_bytes)`` free, is not offered.
    """
    return [
        g
        for g in gpus
        if g.foreign_processes == 0
        and g.free_bytes >= max(min_free_bytes, int(min_free_fraction * g.memory_bytes))
    ]


class Inventory:
    """Periodic view of this node's GPUs, with Frenzy's own processes told from the owner's."""

    def __init__(self, backend: GpuBackend, own_pids: Callable[[], set[int]]) -> None:
        self.backend = backend
        self._own_pids = own_pids
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
        out = []
        for g in self.backend.snapshot():
            foreign = sum(1 for p in g.pids if p not in own)
            out.append(
                GpuInfo(
                    g.uuid, g.index, g.type, g.memory_bytes, g.free_bytes, g.utilization,
                    g.simulated, max(foreign, g.foreign_processes), g.pids,
                )
            )
        return out

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
