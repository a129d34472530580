"""The CPU peak meter (frenzyd/trainer/memory.py): every byte the allocator holds, whoever frees it."""

from __future__ import annotations

import threading

import pytest

from frenzyd.trainer.memory import METHOD_CPU, PeakMemory

torch = pytest.importorskip("torch")

MIB = 1 << 20
SLACK = 64 << 10  # the window's probe and the profiler's own small allocations


def test_a_tensor_freed_on_another_thread_leaves_the_count() -> None:
    """A gloo work object often drops its buffers on a worker thread the profiler does not profile;
    a running sum of the profiler's events never saw that free and read 2 MiB here."""
    held = torch.zeros(MIB // 4)  # 1 MiB of float32, alive when the window opens
    meter = PeakMemory(torch.device("cpu"), 0)
    meter.start([held])
    box = [torch.empty(MIB, dtype=torch.uint8)]
    t = threading.Thread(target=box.clear)  # the last reference dies on another thread
    t.start()
    t.join()
    after = torch.empty(MIB, dtype=torch.uint8)
    del after
    report = meter.stop()
    assert report.method == METHOD_CPU
    assert report.baseline_bytes == MIB
    assert 2 * MIB <= report.peak_tensor_bytes < 2 * MIB + SLACK


def test_the_peak_is_the_highest_moment_not_the_end() -> None:
    meter = PeakMemory(torch.device("cpu"), 0)
    meter.start([])
    a = torch.empty(3 * MIB, dtype=torch.uint8)
    b = torch.empty(MIB, dtype=torch.uint8)
    del a, b
    c = torch.empty(2 * MIB, dtype=torch.uint8)
    report = meter.stop()
    del c
    assert 4 * MIB <= report.peak_tensor_bytes < 4 * MIB + SLACK
