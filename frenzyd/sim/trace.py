"""The Philly job trace: parsing, the split by time, and seeded sampling of a window of a few hundred jobs.

:func:`split_window` draws from one part of the trace split by submission
time (:data:`SPLITS`: tune on the first 60 %, validate on the next 20 %,
test on the last 20 %), so a policy tuned on windows never meets a test
window.  :func:`busy_window` (the whole trace, 11 distinct busy stretches)
is kept for old results only.

Columns (``../shared/data/README.md``): ``timestamp`` (submission,
``YYYY-MM-DD HH:MM:SS``), ``duration`` (s), ``num_gpus``, ``gpu_time``
(GPU-seconds), ``cluster``.  Rows are unsorted.  Jobs shorter than
:data:`MIN_DURATION_S` are dropped (Philly's many jobs that died at start-up
are not training work), and durations are capped at :data:`MAX_DURATION_S`
so one multi-week job does not decide a window's makespan; both are stated
with every result.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import random
from dataclasses import dataclass
from datetime import datetime

from frenzyd.errors import ConfigError

MIN_DURATION_S = 60.0
MAX_DURATION_S = 24 * 3600.0
BUSY_QUANTILE = 0.1
"""Stretches are drawn among the busiest 10 % (most submissions)."""
WINDOW_HOURS = 8.0
"""Length of the busy stretch a workload is sampled from (Sia samples busy stretches of hours)."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace row: submission time (s, trace epoch), duration (s), GPU count, GPU-seconds."""

    submit_s: float
    duration_s: float
    gpus: int
    gpu_time_s: float


def parse_philly_csv(text: str) -> list[TraceJob]:
    """Every usable row of a Philly trace CSV, sorted by submission time."""
    reader = csv.DictReader(io.StringIO(text))
    need = {"timestamp", "duration", "num_gpus", "gpu_time"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise ConfigError("not a Philly trace: expected columns timestamp, duration, num_gpus, gpu_time")
    jobs: list[TraceJob] = []
    epoch = datetime(2017, 1, 1)
    for line, row in enumerate(reader, start=2):
        try:
            ts = (datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S") - epoch).total_seconds()
            duration = float(row["duration"])
            gpus = int(float(row["num_gpus"]))
            gpu_time = float(row["gpu_time"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # Overflow: num_gpus "inf"
            raise ConfigError(f"trace line {line}: cannot parse {dict(row)!r}: {exc}") from exc
        if not (math.isfinite(duration) and math.isfinite(gpu_time)):
            raise ConfigError(f"trace line {line}: duration and gpu_time must be finite: {dict(row)!r}")
        if duration < MIN_DURATION_S or gpus < 1:
            continue
        jobs.append(TraceJob(ts, min(duration, MAX_DURATION_S), gpus, gpu_time))
    if not jobs:
        raise ConfigError("the trace has no usable jobs (duration >= 60 s and at least one GPU)")
    jobs.sort(key=lambda j: (j.submit_s, j.duration_s, j.gpus))
    return jobs


def busy_window(jobs: list[TraceJob], n: int, seed: int, hours: float = WINDOW_HOURS) -> list[TraceJob]:
    """``n`` jobs sampled (seeded) from one busy stretch of ``hours`` hours of the trace.

    Candidate stretches start at every submission; the busiest
    :data:`BUSY_QUANTILE` of them (most submissions) holding at least ``n``
    jobs are eligible; ``seed`` picks one and then ``n`` of its jobs uniformly.
    Submission times come back relative to the stretch's first sampled job.
    """
    if n < 1:
        raise ConfigError("--jobs must be at least 1")
    span = hours * 3600.0
    counts: list[tuple[int, int]] = []
    j = 0
    for i in range(len(jobs)):
        j = max(j, i)
        while j < len(jobs) and jobs[j].submit_s < jobs[i].submit_s + span:
            j += 1
        counts.append((j - i, i))
    eligible = [c for c in counts if c[0] >= n]
    if not eligible:
        raise ConfigError(f"no {hours:g}-hour stretch of the trace holds {n} jobs: ask for fewer --jobs")
    eligible.sort(key=lambda c: (-c[0], c[1]))
    top = eligible[: max(1, int(len(eligible) * BUSY_QUANTILE))]
    starts = sorted(i for _, i in top)
    distinct: list[int] = []
    for i in starts:  # windows starting close together overlap: keep distinct stretches
        if not distinct or jobs[i].submit_s - jobs[distinct[-1]].submit_s >= span:
            distinct.append(i)
    rng = random.Random(seed)
    start = rng.choice(distinct)
    end = start
    while end < len(jobs) and jobs[end].submit_s < jobs[start].submit_s + span:
        end += 1
    picked = sorted(rng.sample(range(start, end), n))
    window = [jobs[k] for k in picked]
    t0 = window[0].submit_s
    return [TraceJob(x.submit_s - t0, x.duration_s, x.gpus, x.gpu_time_s) for x in window]


SPLITS: dict[str, tuple[float, float]] = {
    "tune": (0.0, 0.6),
    "validation": (0.6, 0.8),
    "test": (0.8, 1.0),
}
"""The trace split by submission time: first 60 % to tune on, next 20 % to validate, last 20 % to test."""
_SPLIT_SALT = {"tune": 0x7E1, "validation": 0x7A1, "test": 0x7E5}


def split_windows(jobs: list[TraceJob], split: str, n: int, hours: float = WINDOW_HOURS) -> list[int]:
    """Start indices of the windows of ``split`` that hold at least ``n`` jobs, in a fixed seeded order.

    The split's time range is tiled with back-to-back windows of ``hours``
    hours from its start (no window crosses a split boundary, none overlaps
    another); those holding ≥ ``n`` submissions are eligible.  Their order
    is a fixed shuffle (salted per split), so seeds 0, 1, 2, … draw distinct
    windows until the split runs out, then repeat them.
    """
    if split not in SPLITS:
        raise ConfigError(f"unknown trace split {split!r}: use one of {', '.join(SPLITS)}")
    if n < 1:
        raise ConfigError("--jobs must be at least 1")
    t_first, t_last = jobs[0].submit_s, jobs[-1].submit_s
    a, b = SPLITS[split]
    lo = t_first + a * (t_last - t_first)
    hi = t_first + b * (t_last - t_first) + (1.0 if b == 1.0 else 0.0)
    span = hours * 3600.0
    subs = [j.submit_s for j in jobs]
    starts: list[int] = []
    t = lo
    while t + span <= hi + 1.0:
        i = bisect.bisect_left(subs, t)
        k = bisect.bisect_left(subs, min(t + span, hi))
        if k - i >= n:
            starts.append(i)
        t += span
    random.Random(_SPLIT_SALT[split]).shuffle(starts)
    return starts


def split_window(
    jobs: list[TraceJob], n: int, seed: int, split: str, hours: float = WINDOW_HOURS
) -> list[TraceJob]:
    """``n`` jobs sampled (seeded) from window ``seed`` of ``split`` (:func:`split_windows`).

    Submission times come back relative to the first sampled job.  Raises
    :class:`ConfigError` when no window of the split holds ``n`` jobs.
    """
    starts = split_windows(jobs, split, n, hours)
    if not starts:
        raise ConfigError(
            f"no {hours:g}-hour window of the {split} split holds {n} jobs: ask for fewer --jobs"
        )
    start = starts[seed % len(starts)]
    end = bisect.bisect_left([j.submit_s for j in jobs], jobs[start].submit_s + hours * 3600.0)
    b = SPLITS[split][1]
    t_first, t_last = jobs[0].submit_s, jobs[-1].submit_s
    if b < 1.0:  # the last window of a split stops at its boundary
        boundary = t_first + b * (t_last - t_first)
        end = min(end, bisect.bisect_left([j.submit_s for j in jobs], boundary))
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(start, end), n))
    window = [jobs[k] for k in picked]
    t0 = window[0].submit_s
    return [TraceJob(x.submit_s - t0, x.duration_s, x.gpus, x.gpu_time_s) for x in window]


def window_id(jobs: list[TraceJob], n: int, seed: int, split: str, hours: float = WINDOW_HOURS) -> int:
    """Which window of ``split`` seed ``seed`` draws (its index in the split's tiling order of time)."""
    starts = split_windows(jobs, split, n, hours)
    return sorted(starts).index(starts[seed % len(starts)]) if starts else -1
