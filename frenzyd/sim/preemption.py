"""What a preemption costs a job in the simulator: checkpoint write, progress since the last checkpoint.

Every policy pays the same costs; the simulator charges them whenever a
running job is stopped or moved (a placement of a running job on other
GPUs, a shrink or growth included).  With ``P`` parameters:

* **checkpoint write** ``W = 12·P / write_bw`` (fp32 weights and the two Adam
  moments, the same 12 bytes per parameter the restart reads back,
  ``has.speed.CHECKPOINT_BYTES_PER_PARAM``), ``write_bw`` =
  :data:`CHECKPOINT_WRITE_BYTES_S`, 1 GB/s like the read: the job saves its
  state when told to stop; its GPUs pass to the next job at once (the
  snapshot to host memory is fast, CheckFreq's two-phase checkpoint), the
  write delays the job's own next start.
* **progress since the last periodic checkpoint**: a job checkpoints every
  ``I`` seconds of progress since its last start, and on a stop the
  progress made since the last of them is lost (redone after the restart).
  This is the conservative reading of a stop: the on-demand save is charged
  its write time *and* assumed not to cover the interval in flight (a save
  cut short by the stop's grace period).  ``I`` follows CheckFreq's rule
  (Mohan et al., "CheckFreq: Frequent, Fine-Grained DNN Checkpointing",
  FAST 2021): checkpoint as often as keeps the checkpoint overhead within
  3.5 % of run time, ``I = W / 0.035``, kept within
  [:data:`MIN_INTERVAL_S`, :data:`MAX_INTERVAL_S`] (no framework saves more
  than once a minute; an hour bounds the loss for the largest models).
  gpt2 (124 M parameters): I = 60 s; llama-2-7b: W = 81 s, I ≈ 39 min.
* **restart and load** (unchanged, ``has.speed.JobSpeed.restart_cost_s``):
  30 s start-up plus reading the checkpoint at 1 GB/s, on every placement.

The periodic checkpoints' own overhead while running (≤ 3.5 %) is the same
for every policy and is not modelled.  The live-scheduling issue is to set
these parameters from measurements; :class:`PreemptionModel` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzyd.has.speed import CHECKPOINT_BYTES_PER_PARAM

CHECKPOINT_WRITE_BYTES_S = 1e9
"""Checkpoint write bandwidth (bytes/s), the same 1 GB/s as the read in ``has.speed``."""
CHECKFREQ_OVERHEAD = 0.035
"""CheckFreq's bound on checkpoint overhead (FAST 2021): the interval is W / this."""
MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 3600.0


@dataclass(frozen=True, slots=True)
class PreemptionModel:
    """Checkpoint costs charged on every stop or move of a running job (see the module docstring).

    ``interval_s`` None: CheckFreq's rule per job; a number: that interval for
    every job.  ``write_bytes_s`` 0 or None-like values are refused; use
    :data:`FREE` for a model that charges nothing (the old simulator).
    """

    write_bytes_s: float = CHECKPOINT_WRITE_BYTES_S
    interval_s: float | None = None
    charge_write: bool = True
    charge_lost: bool = True

    def __post_init__(self) -> None:
        if self.write_bytes_s <= 0:
            raise ValueError("write_bytes_s must be positive (set charge_write=False to charge no write)")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError("interval_s must be positive seconds, or None for CheckFreq's rule")

    def write_s(self, params: int) -> float:
        """Seconds to write a checkpoint of a job with ``params`` parameters."""
        return CHECKPOINT_BYTES_PER_PARAM * params / self.write_bytes_s

    def checkpoint_interval_s(self, params: int) -> float:
        """Seconds of progress between periodic checkpoints."""
        if self.interval_s is not None:
            return self.interval_s
        return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, self.write_s(params) / CHECKFREQ_OVERHEAD))

    def stop_cost(self, params: int, progress_s: float) -> tuple[float, float]:
        """(seconds of progress lost, seconds of write delay) for a stop after ``progress_s`` of progress.

        ``progress_s`` counts from the job's last start (its restart cost
        paid), so a job stopped before any progress loses nothing.
        """
        lost = 0.0
        if self.charge_lost and progress_s > 0:
            lost = progress_s % self.checkpoint_interval_s(params)
        write = self.write_s(params) if self.charge_write else 0.0
        return lost, write


FREE = PreemptionModel(charge_write=False, charge_lost=False)
"""Charges nothing beyond the restart: a stopped job keeps all its progress (the simulator before #15)."""
DEFAULT = PreemptionModel()
