"""Bulk byte work beside running ranks, at a lower CPU priority.

Packing, unpacking, hashing and merging checkpoints and results take CPU seconds per copy (an
82.6 MB tiny-llama checkpoint: ~0.2 s to pack stored, ~0.2 s to unpack, ~0.15 s to hash), and on
the node that runs the job's ranks that time comes out of their steps
(``scripts/bench_trainer_overhead.py``).  :func:`run` does such work on this module's own worker
threads, each lowered to nice :data:`BULK_NICE` when it starts (on Linux a thread's nice value is
its own), so the ranks' steps come first and the copy takes what they leave.  The event loop and
the default executor keep their priority: heartbeats and handlers are not slowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

BULK_NICE = 10
"""Nice value of the bulk threads (0 is the daemon's and the ranks'; CFS gives a nice-10 thread about
a tenth of a nice-0 one's share when both want the CPU)."""
BULK_THREADS = 2
"""At most this many copies are packed or unpacked at once."""

_lock = threading.Lock()
_executors: list[ThreadPoolExecutor] = []


def _lower_priority() -> None:
    """This thread to nice :data:`BULK_NICE` (never higher than it already runs)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: normal priority
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(BULK_NICE, os.getpriority(os.PRIO_PROCESS, tid)))


def executor() -> ThreadPoolExecutor:
    """The bulk threads (started on first use, for the life of the process)."""
    with _lock:
        if not _executors:
            _executors.append(ThreadPoolExecutor(BULK_THREADS, thread_name_prefix="frenzy-bulk",
                                                 initializer=_lower_priority))
        return _executors[0]


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a bulk thread; like ``asyncio.to_thread`` at a lower priority."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(fn, *args, **kwargs))
