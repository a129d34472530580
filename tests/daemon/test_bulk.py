"""Bulk byte work (packing, unpacking, hashing checkpoints) runs on threads of lower CPU priority
than the event loop and the ranks (frenzyd/jobs/bulk.py)."""

from __future__ import annotations

import os
import threading

import pytest

from frenzyd.jobs import bulk


def _where() -> tuple[str, int]:
    me = threading.current_thread()
    return me.name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_bulk_work_runs_on_a_lowered_thread_and_returns_its_value() -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    name, nice = await bulk.run(_where)
    assert name.startswith("frenzy-bulk")
    assert nice == max(base, bulk.BULK_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the loop's thread is not
    assert await bulk.run(sorted, [3, 1, 2], reverse=True) == [3, 2, 1]


async def test_an_error_in_bulk_work_reaches_the_caller() -> None:
    def boom() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await bulk.run(boom)
