"""Measures a rank's peak tensor memory over its first steady-state steps (what MARP predicts, DESIGN.md §3).

* CUDA: ``torch.cuda.max_memory_allocated`` (reset when the window opens) and the
  process's NVML memory (``nvmlDeviceGetComputeRunningProcesses``).
* CPU: an allocator count.  torch's profiler with ``profile_memory=True`` sees
  every allocation and free of the CPU allocator (whatever tensor subclass -
  DTensor, FSDP's flat buffers - made it); the peak is the bytes of the
  parameters, buffers, gradients and optimizer state alive when the window
  opens plus the highest running sum of allocations inside it.

The window covers ``WINDOW_STEPS`` optimizer steps (the optimizer state is
created in the first; DDP rebuilds its buckets in the second).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

WINDOW_STEPS = 3


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
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

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
        events = [e for e in self._prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        events.sort(key=lambda e: e.start_ns())
        run = peak = 0
        for e in events:
            if e.device_type() == self._prof_cpu_type():
                run += int(e.nbytes())
                peak = max(peak, run)
        self._prof = None
        self.report = MemoryReport(
            rank=self.rank, device="cpu", peak_tensor_bytes=self._baseline + peak,
            method="torch.profiler CPU allocator events + tensors alive at the window's start",
            steps_measured=self._steps, baseline_bytes=self._baseline,
        )
        return self.report

    @staticmethod
    def _prof_cpu_type() -> Any:
        from torch._C._autograd import DeviceType

        return DeviceType.CPU


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
