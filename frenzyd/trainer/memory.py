"""Measures a rank's peak tensor memory over its first steady-state steps (what MARP predicts, DESIGN.md §3).

* CUDA: ``torch.cuda.max_memory_allocated`` (reset when the window opens) and the
  process's NVML memory (``nvmlDeviceGetComputeRunningProcesses``).
* CPU: an allocator count.  torch's profiler with ``profile_memory=True`` sees
  the allocations of the CPU allocator (whatever tensor subclass - DTensor,
  FSDP's flat buffers - made them); the peak is the bytes of the parameters,
  buffers, gradients and optimizer state alive when the window opens plus the
  highest rise of the allocator's own byte count inside it.

  Not a running sum of the profiler's events: the profiler reports a free only
  on a thread it profiles, and a gloo collective's work object (holding, e.g.,
  the clone ``ProcessGroupGloo`` makes of a reduce-scatter input) is often
  destroyed by the gloo worker thread after the work has run, outside the
  profiled scope.  Such a free was never reported, so a running sum kept those
  bytes forever, a different amount each run (whichever thread dropped the last
  reference).  With c10's ``caffe2_report_cpu_memory_usage`` flag on, the CPU
  allocator's ``ProfiledCPUMemoryReporter`` keeps its byte count for every
  thread; each event carries that count (``total_allocated``), frees on
  unprofiled threads included.  Not seen: bytes allocated and freed again on an
  unprofiled thread between two events (gloo runs a collective's own work in a
  profiled scope; what it frees afterwards only lowers the count).

The window covers ``WINDOW_STEPS`` optimizer steps (the optimizer state is
created in the first; DDP rebuilds its buckets in the second).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

WINDOW_STEPS = 3
METHOD_CPU = "torch.profiler CPU allocator byte count (all threads) + tensors alive at the window's start"
METHOD_CPU_EVENTS_ONLY = "torch.profiler CPU allocator events, running sum (profiled threads) + tensors alive"
_FLAG = "FLAGS_caffe2_report_cpu_memory_usage"
_PROBE_BYTES = 64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryReport:
    rank: int
    device: str
    peak_tensor_bytes: int
    method: str
    steps_measured: int
    baseline_bytes: int
    nvml_process_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def live_tensor_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors by their local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", t)
        st = local.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


class PeakMemory:
    """Open with :meth:`start`, close with :meth:`stop` after ``WINDOW_STEPS`` steps."""

    def __init__(self, device: Any, rank: int) -> None:
        self.device, self.rank = device, rank
        self._prof: Any = None
        self._flag: Any = None
        self._flag_was = False
        self._probe = 0
        self._baseline = 0
        self._steps = 0
        self.report: MemoryReport | None = None

    def start(self, held: list[Any]) -> None:
        import gc

        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        from torch.profiler import ProfilerActivity, profile

        self._baseline = live_tensor_bytes(held)
        self._flag = _report_flag()
        if self._flag is not None:
            self._flag_was = bool(self._flag.value)
            self._flag.value = True
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        # the first event of the window: its count minus its size is the allocator's count at the start
        probe = torch.empty(_PROBE_BYTES, dtype=torch.uint8)
        self._probe = probe.data_ptr()
        del probe

    def step_done(self) -> bool:
        """Count a finished step; True when the window just closed (then ``report`` is set)."""
        self._steps += 1
        if self.report is None and self._steps >= WINDOW_STEPS:
            self.stop()
            return True
        return False

    def stop(self) -> MemoryReport:
        import torch

        if self.report is not None:
            return self.report
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.report = MemoryReport(
                rank=self.rank, device=str(self.device),
                peak_tensor_bytes=int(torch.cuda.max_memory_allocated(self.device)),
                method="torch.cuda.max_memory_allocated", steps_measured=self._steps, baseline_bytes=0,
                nvml_process_bytes=_nvml_process_bytes(self.device),
            )
            return self.report
        self._prof.__exit__(None, None, None)
        if self._flag is not None:
            self._flag.value = self._flag_was
        peak = _window_rise(self._prof.profiler.kineto_results, self._probe, counted=self._flag is not None)
        self._prof = None
        self.report = MemoryReport(
            rank=self.rank, device="cpu", peak_tensor_bytes=self._baseline + peak,
            method=METHOD_CPU if self._flag is not None else METHOD_CPU_EVENTS_ONLY,
            steps_measured=self._steps, baseline_bytes=self._baseline,
        )
        return self.report


def _report_flag() -> Any:
    """c10's ``caffe2_report_cpu_memory_usage`` flag as a ctypes bool in the loaded libc10, or None.

    c10 defines it as a plain global (``C10_DEFINE_bool``) and reads it on every CPU allocation and
    free; torch has no Python setter, so it is set where c10 keeps it.
    """
    import torch

    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    name = {"darwin": "libc10.dylib", "win32": "c10.dll"}.get(sys.platform, "libc10.so")
    try:
        return ctypes.c_bool.in_dll(ctypes.CDLL(os.path.join(libdir, name)), _FLAG)
    except (OSError, ValueError) as e:
        log.warning("cannot set c10's %s (%s): the CPU peak misses frees made on threads the profiler "
                    "does not profile (gloo's workers) and may read high", _FLAG, e)
        return None


def _window_rise(results: Any, probe_ptr: int, *, counted: bool) -> int:
    """The highest rise of the CPU allocator's byte count over the window, from the profiler's results.

    ``counted``: the all-threads flag was on, so each allocation event's ``total_allocated`` is the
    allocator's count after it (frees on any thread included); the count at the window's start is
    the probe's event's count minus the probe.  Otherwise: the running sum of the reported sizes.
    """
    from torch._C._profiler import _EventType

    def walk(evs: list[Any]) -> Any:
        for e in evs:
            yield e
            yield from walk(e.children)

    mem = [e for e in walk(results.experimental_event_tree())
           if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu"]
    mem.sort(key=lambda e: e.start_time_ns)
    if counted:
        start = next((e for e in mem if e.extra_fields.ptr == probe_ptr and e.extra_fields.alloc_size > 0),
                     None)
        if start is None:
            raise RuntimeError("the memory window's probe allocation is missing from the profiler's events")
        base = int(start.extra_fields.total_allocated) - int(start.extra_fields.alloc_size)
        return max(0, max(int(e.extra_fields.total_allocated) for e in mem) - base)
    run = peak = 0
    for e in mem:
        run += int(e.extra_fields.alloc_size)
        peak = max(peak, run)
    return peak


def _nvml_process_bytes(device: Any) -> int | None:
    """This process's memory on ``device`` as NVML reports it (None where NVML cannot say)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            idx = device.index if device.index is not None else 0
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                ids = [v.strip() for v in visible.split(",")]
                if ids[idx].isdigit():
                    idx = int(ids[idx])
                else:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(ids[idx])
                    idx = pynvml.nvmlDeviceGetIndex(handle)
            handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
            return None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml raises NVMLError subclasses and OSError; the figure is optional
        return None
