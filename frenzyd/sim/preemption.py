"""What a preemption costs a job in the simulator: checkpoint write, lost progress, restart and load.

Every policy pays the same costs; the simulator charges them whenever a
running job is stopped or moved (a placement of a running job on other
GPUs, a shrink or growth included).  With ``P`` parameters, two modes:

* **save on stop** (default; what Gavel's lease expiry, Tiresias'
  checkpoint-preemption and Sia's checkpoint-restart do): the job is told to
  stop, abandons the step in flight (the progress since the last step
  boundary is lost: less than one step) and writes a checkpoint,
  ``W = 12·P / write_bw`` (fp32 weights and the two Adam moments, the 12
  bytes per parameter the restart reads back,
  ``has.speed.CHECKPOINT_BYTES_PER_PARAM``; ``write_bw`` =
  :data:`CHECKPOINT_WRITE_BYTES_S`, 1 GB/s like the read).  The write
  delays the job's own next start; its GPUs pass to the next job at once
  (the snapshot to host memory is fast: CheckFreq's two-phase checkpoint).
* **periodic checkpoints only** (``save_on_stop=False``: a job killed
  without warning): no write at the stop, but the progress since the last
  periodic checkpoint is lost and redone.  A job checkpoints every ``I``
  seconds of progress since its last start, ``I`` by CheckFreq's rule
  (Mohan et al., "CheckFreq: Frequent, Fine-Grained DNN Checkpointing",
  FAST 2021: checkpoint as often as keeps the overhead within 3.5 %),
  ``I = W / 0.035`` kept within [:data:`MIN_INTERVAL_S`,
  :data:`MAX_INTERVAL_S`]: gpt2 (124 M) 60 s, llama-2-7b (W = 81 s) ≈ 39 min.
  Not the default: a policy that moves a 7 B job every few minutes (Gavel's
  360 s rounds) would then lose all of its progress every round and never
  finish, which no real deployment of these schedulers accepts.

Both modes add the **restart and load** of every placement
(``has.speed.JobSpeed.restart_cost_s``: 30 s start-up plus reading the
checkpoint at 1 GB/s).  The periodic checkpoints' own overhead while
running (≤ 3.5 %) is the same for every policy and is not modelled.  The
live-scheduling issue is to set these parameters from measurements;
:class:`PreemptionModel` takes them.
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

    ``interval_s`` None: CheckFreq's rule per job; a number: that interval
    for every job (periodic mode only).  :data:`FREE` charges nothing (the
    simulator before issue 15: a stopped job kept all its progress).
    """

    write_bytes_s: float = CHECKPOINT_WRITE_BYTES_S
    save_on_stop: bool = True
    interval_s: float | None = None
    charge: bool = True

    def __post_init__(self) -> None:
        if self.write_bytes_s <= 0:
            raise ValueError("write_bytes_s must be positive bytes per second")
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

    def stop_cost(self, params: int, progress_s: float, step_s: float) -> tuple[float, float]:
        """(seconds of progress lost, seconds of write delay) for a stop after ``progress_s`` of progress.

        ``progress_s`` counts from the job's last start (its restart cost
        paid), ``step_s`` is its step time there; a job stopped before any
        progress loses nothing.
        """
        if not self.charge:
            return 0.0, 0.0
        if self.save_on_stop:
            lost = progress_s % step_s if progress_s > 0 and step_s > 0 else 0.0
            return lost, self.write_s(params)
        lost = progress_s % self.checkpoint_interval_s(params) if progress_s > 0 else 0.0
        return lost, 0.0


FREE = PreemptionModel(charge=False)
"""Charges nothing beyond the restart: a stopped job keeps all its progress (the simulator before #15)."""
DEFAULT = PreemptionModel()
PERIODIC = PreemptionModel(save_on_stop=False)
