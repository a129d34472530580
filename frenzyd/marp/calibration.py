"""Calibration of MARP's runtime-overhead term from measured runs: a pure value and its versioned JSON file.

A :class:`Calibration` keeps, per (GPU type, model family, torch minor version),
the shortfalls of recent measured runs: how far each run's worst rank went
beyond what MARP predicted for it (tensor peak + runtime overhead), as a
fraction of the predicted tensor peak.  :meth:`Calibration.correction` turns
them into a correction with three rules:

* it may only **raise** the runtime-overhead term (a run that needed less
  lowers nothing);
* it applies only with at least :data:`MIN_RUNS` runs of that key;
* runs measured on the CPU never count for a GPU type (only for ``"CPU"``).

MARP receives the value (``plans.feasible_plans(..., calibration=)``);
:func:`fold_run` folds one measured run into it; :func:`parse_calibration`,
:func:`dump_calibration` and :func:`load_calibration` are the file format
(``FORMAT``, ``VERSION``), with fix-it errors for a bad file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from frenzyd.errors import ConfigError
from frenzyd.marp.overhead import overhead_bytes

FORMAT = "frenzy-marp-calibration"
VERSION = 1
MIN_RUNS = 3
"""Runs of a key (GPU runs, for a GPU type) needed before its correction applies."""
MAX_RUNS = 20
"""Samples kept per key: the most recent ones (a changed driver or allocator ages out)."""
CPU_TYPE = "CPU"
"""The pseudo GPU type of runs on a host without a GPU; the only type CPU runs count for."""
FAMILIES = ("gpt2", "llama")
MAX_FILE_BYTES = 8 * 2**20

RunDevice = Literal["cuda", "cpu"]


class CalibrationError(ConfigError):
    """A calibration file or measured run is invalid; the message names the field and the fix."""


def torch_minor(version: str) -> str:
    """``"2.13.0+cu128"`` -> ``"2.13"``: calibrations are kept per torch minor version."""
    parts = version.strip().split("+")[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise CalibrationError(f"torch version {version!r} is not MAJOR.MINOR[.PATCH]: e.g. 2.13.0")
    return f"{int(parts[0])}.{int(parts[1])}"


@dataclass(frozen=True, slots=True, order=True)
class CalibrationKey:
    """What a correction is kept for."""

    gpu_type: str
    family: str
    torch: str
    """torch minor version, e.g. ``"2.13"``."""


@dataclass(frozen=True, slots=True)
class RunSample:
    """One measured run, reduced to what the correction needs."""

    device: RunDevice
    shortfall: float
    """Worst rank: (needed - predicted tensor peak - predicted overhead) / predicted tensor peak."""
    ranks: int
    job: str = ""


@dataclass(frozen=True, slots=True)
class OverheadCorrection:
    """The calibration's verdict for one key: whether it applies, from how many runs, by how much."""

    key: CalibrationKey
    applies: bool
    runs: int
    """Runs that count for this key (GPU runs for a GPU type)."""
    cpu_runs_ignored: int
    extra_overhead_fraction: float
    """Added to the runtime overhead, times the tensor peak (0.0 when it does not apply; never < 0)."""

    def extra_bytes(self, tensor_peak: int) -> int:
        return int(self.extra_overhead_fraction * tensor_peak) if self.applies else 0


@dataclass(frozen=True, slots=True)
class Calibration:
    """Measured-run samples per key (a pure, immutable value; :func:`fold_run` returns a new one)."""

    entries: tuple[tuple[CalibrationKey, tuple[RunSample, ...]], ...] = field(default=())

    def samples(self, key: CalibrationKey) -> tuple[RunSample, ...]:
        for k, runs in self.entries:
            if k == key:
                return runs
        return ()

    def correction(self, gpu_type: str, family: str, torch_version: str) -> OverheadCorrection:
        """The correction for a GPU type, model family and torch version (any ``MAJOR.MINOR[...]``)."""
        key = CalibrationKey(gpu_type, family, torch_minor(torch_version))
        samples = self.samples(key)
        counted = [s for s in samples if s.device == "cuda" or gpu_type == CPU_TYPE]
        ignored = len(samples) - len(counted)
        applies = len(counted) >= MIN_RUNS
        extra = max(0.0, *(s.shortfall for s in counted)) if applies else 0.0
        return OverheadCorrection(key, applies, len(counted), ignored, extra)

    def calibrated_keys(self) -> list[CalibrationKey]:
        return [k for k, _ in self.entries]


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One finished run as the trainer reports it (per rank, in the order of ``per_rank_peak_bytes``).

    ``measured_peak_bytes``: the tensor peak of each rank (``torch.cuda.max_memory_allocated``,
    or MemTracker on the CPU).  ``measured_process_bytes``: the whole process on its GPU (NVML),
    when known; it includes what the overhead term stands for.
    """

    gpu_type: str
    family: str
    torch_version: str
    device: RunDevice
    predicted_peak_bytes: Sequence[int]
    measured_peak_bytes: Sequence[int]
    measured_process_bytes: Sequence[int] | None = None
    job: str = ""


def _run_shortfall(run: MeasuredRun) -> float:
    world = len(run.predicted_peak_bytes)
    worst = -math.inf
    for i, predicted in enumerate(run.predicted_peak_bytes):
        planned = predicted + overhead_bytes(run.gpu_type, predicted, world)
        if run.measured_process_bytes is not None:
            needed = run.measured_process_bytes[i]
        else:  # only the tensor peak is known: its excess over the prediction must be covered
            needed = planned + max(0, run.measured_peak_bytes[i] - predicted)
        worst = max(worst, (needed - planned) / predicted)
    return worst


def fold_run(cal: Calibration, run: MeasuredRun) -> Calibration:
    """``cal`` with one measured run added to its key (the oldest beyond ``MAX_RUNS`` dropped).

    Raises CalibrationError for a run that cannot be used (unknown family or
    device, rank lists of different lengths, non-positive bytes).
    """
    if not run.gpu_type:
        raise CalibrationError(
            "measured run has no gpu_type: give the canonical type (e.g. A100-80GB) or CPU"
        )
    if run.family not in FAMILIES:
        raise CalibrationError(f"measured run family {run.family!r}: use one of {', '.join(FAMILIES)}")
    if run.device not in ("cuda", "cpu"):
        raise CalibrationError(f"measured run device {run.device!r}: use cuda or cpu")
    n = len(run.predicted_peak_bytes)
    lists = [run.measured_peak_bytes] + ([run.measured_process_bytes] if run.measured_process_bytes else [])
    if n == 0 or any(len(x) != n for x in lists):
        raise CalibrationError(
            f"measured run of {run.gpu_type}: give one predicted and one measured peak per rank "
            f"(got {n} predicted, {[len(x) for x in lists]} measured)"
        )
    if any(int(v) <= 0 for x in [run.predicted_peak_bytes, *lists] for v in x):
        raise CalibrationError(f"measured run of {run.gpu_type}: byte counts must be positive")
    key = CalibrationKey(run.gpu_type, run.family, torch_minor(run.torch_version))
    sample = RunSample(run.device, _run_shortfall(run), n, run.job)
    runs = (*cal.samples(key), sample)[-MAX_RUNS:]
    others = [(k, v) for k, v in cal.entries if k != key]
    return replace(cal, entries=tuple(sorted([*others, (key, runs)], key=lambda kv: kv[0])))


# --------------------------------------------------------------------------- the file


def dump_calibration(cal: Calibration) -> str:
    """The versioned JSON text of ``cal`` (parse_calibration's inverse)."""
    entries = [
        {
            "gpu_type": k.gpu_type,
            "family": k.family,
            "torch": k.torch,
            "runs": [
                {"device": r.device, "shortfall": r.shortfall, "ranks": r.ranks, "job": r.job} for r in runs
            ],
        }
        for k, runs in cal.entries
    ]
    return json.dumps({"format": FORMAT, "version": VERSION, "entries": entries}, indent=1) + "\n"


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; CalibrationError says what is wrong and where."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise CalibrationError(f"{p}: larger than {MAX_FILE_BYTES} bytes; not a calibration file")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(
            f"calibration file {str(p)!r} does not exist: give the file the daemon keeps"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"cannot read calibration file {str(p)!r}: {e}") from e
    return parse_calibration(text, source=str(p))


def parse_calibration(text: str, *, source: str = "calibration") -> Calibration:
    """Validate the JSON text of a calibration file (any field, with its JSON path in the error)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(
            f"{source}: not JSON ({e.msg} at line {e.lineno}); expected a {FORMAT} file"
        ) from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f'{source}: not a calibration file: expected {{"format": "{FORMAT}", ...}}')
    version = doc.get("version")
    if version != VERSION:
        hint = "(written by a newer frenzy: upgrade)" if isinstance(version, int) and version > VERSION else ""
        raise CalibrationError(
            f"{source}: version {version!r} is not supported (this frenzy reads {VERSION}) {hint}"
        )
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise CalibrationError(f"{source}: 'entries' must be a list")
    out: dict[CalibrationKey, tuple[RunSample, ...]] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: entries[{i}]"
        if not isinstance(entry, dict):
            raise CalibrationError(f"{where} must be an object")
        gpu = _str(entry, "gpu_type", where)
        family = _str(entry, "family", where)
        if family not in FAMILIES:
            raise CalibrationError(f"{where}.family {family!r}: use one of {', '.join(FAMILIES)}")
        key = CalibrationKey(gpu, family, torch_minor(_str(entry, "torch", where)))
        if key in out:
            raise CalibrationError(
                f"{where}: a second entry for {gpu}/{family}/torch {key.torch}: merge them"
            )
        runs = entry.get("runs")
        if not isinstance(runs, list):
            raise CalibrationError(f"{where}.runs must be a list")
        out[key] = tuple(_run(r, f"{where}.runs[{j}]") for j, r in enumerate(runs))[-MAX_RUNS:]
    return Calibration(tuple(sorted(out.items(), key=lambda kv: kv[0])))


def _str(d: dict[str, Any], name: str, where: str) -> str:
    v = d.get(name)
    if not isinstance(v, str) or not v:
        raise CalibrationError(f"{where}.{name} must be a non-empty string, got {v!r}")
    return v


def _run(r: Any, where: str) -> RunSample:
    if not isinstance(r, dict):
        raise CalibrationError(f"{where} must be an object")
    device = r.get("device")
    if device not in ("cuda", "cpu"):
        raise CalibrationError(f"{where}.device {device!r}: use cuda or cpu")
    shortfall = r.get("shortfall")
    if isinstance(shortfall, bool) or not isinstance(shortfall, int | float) or not math.isfinite(shortfall):
        raise CalibrationError(f"{where}.shortfall must be a finite number, got {shortfall!r}")
    if not -1.0 <= float(shortfall) <= 100.0:
        raise CalibrationError(f"{where}.shortfall {shortfall} is outside [-1, 100]: not a measured run")
    ranks = r.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise CalibrationError(f"{where}.ranks must be a positive integer, got {ranks!r}")
    job = r.get("job", "")
    if not isinstance(job, str):
        raise CalibrationError(f"{where}.job must be a string")
    return RunSample(device, float(shortfall), ranks, job)
