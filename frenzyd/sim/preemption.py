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
running (≤ 3.5 %) is the same for every policy and is not modelled.

**Calibrated to a live pool** (``finish_step=True`` and ``start_s`` set;
issue 14, ``scripts/bench_live.py``): what the live built-in trainer does
instead.  A stopped job finishes the step in flight (nothing is lost) and
then writes its checkpoint, exits and is reported; its GPUs are free only
after that (the step's remainder plus ``handover_s``), and both the job's
own next start and any job placed on those GPUs wait for it.  Every
placement costs ``start_s`` (the coordinator's placement, process start,
rendezvous, model build), a resumed one ``load_s`` more (fetching and
loading the checkpoint), and a job is done ``finish_s`` after its last step
(final evaluation, export, exit report), its GPUs held until then.
:data:`LOOPBACK_STAND_IN` holds the figures measured on this project's
2-core machine.
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
    start_s: float | None = None
    """Seconds from a placement to the first step (None: ``has.speed``'s ``restart_cost_s``)."""
    load_s: float = 0.0
    """What a placement that resumes from a checkpoint adds to ``start_s`` (fetch and load)."""
    finish_s: float = 0.0
    """Seconds from a job's last step until it is done (its GPUs held meanwhile)."""
    handover_s: float = 0.0
    """With ``finish_step``: seconds from a stopped job's last step until its GPUs are free."""
    finish_step: bool = False
    """A stop lets the step in flight finish (the live trainer) instead of losing it."""
    host_cores: float | None = None
    """Every peer on one host with this many cores (a loopback pool; effective cores, calibrated, may be
    fractional): a start's ``start_s`` (plus
    ``load_s``) is CPU work of each of its ranks, at most one core a rank, and the host's cores are
    shared by every rank starting at once, so eight ranks starting together on two cores take four
    times as long as one alone.  None: a start takes its time whatever else starts."""

    def __post_init__(self) -> None:
        if self.write_bytes_s <= 0:
            raise ValueError("write_bytes_s must be positive bytes per second")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError("interval_s must be positive seconds, or None for CheckFreq's rule")
        if self.start_s is not None and self.start_s < 0:
            raise ValueError("start_s must be non-negative seconds, or None for has.speed's restart cost")
        if min(self.load_s, self.finish_s, self.handover_s) < 0:
            raise ValueError("load_s, finish_s and handover_s must be non-negative seconds")
        if self.host_cores is not None and (self.host_cores <= 0 or self.start_s is None):
            raise ValueError("host_cores must be a positive core count, and needs a calibrated start_s")
        if self.finish_step and not self.save_on_stop:
            raise ValueError("finish_step needs save_on_stop: a job that finishes its step then saves")

    def restart_s(self, speed_restart_s: float, *, resumed: bool) -> float:
        """Seconds from a placement until the job's first step there: the calibrated ``start_s``
        (plus ``load_s`` when it ``resumed`` from a checkpoint), else ``speed_restart_s``."""
        if self.start_s is None:
            return speed_restart_s
        return self.start_s + (self.load_s if resumed else 0.0)

    def shown_stop_s(self, params: int) -> float:
        """What a stop adds to a restart as the policies are told (``JobView.stop_cost_s``): the
        checkpoint write when a stop saves, or with ``finish_step`` the calibrated handover (the live
        coordinator's measured stop: checkpoint write, its copy, the exit report)."""
        if not self.charge:
            return 0.0
        if self.finish_step:
            return self.handover_s
        return self.write_s(params) if self.save_on_stop else 0.0

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
        if not self.charge or self.finish_step:  # finish_step: the simulator drains the step instead
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


LOOPBACK_STAND_IN = PreemptionModel(
    start_s=2.61, load_s=0.01, finish_s=0.72, handover_s=1.00, finish_step=True, host_cores=1.75
)
"""A live loopback pool of simulated GPUs running paced stand-ins, measured on this project's 2-core
machine with nothing else running on 2026-12-02 (15:20 UTC, at 9ef4f13 plus the 3-round core
calibration) by ``python scripts/bench_live.py --calibrate`` (``results/live-calibration.json``; a
2-daemon pool, one simulated A100-80GB, gpt2 stand-ins of one rank): ``start_s`` = median of 3 jobs
alone, submission to the first step's start (2.97, 2.61, 2.55 s: the coordinator's pass, lease,
rendezvous store, process start, torch import, rendezvous, model build in plain torch);
``finish_s`` = median, last step to succeeded (0.72, 0.72, 0.68 s: final evaluation, export, exit
report); ``handover_s`` = mean of 2 preemptions of a long job by a short one, the long job's last
step to the short job's first less ``start_s`` (1.04, 0.95 s: checkpoint write, its transfer to the
submitter, the exit report, the requeue); ``load_s`` = what the long job's resumed start took beyond
``start_s`` (−0.04, 0.06 s); ``host_cores`` = the median of 3 rounds' fits (1.75, 1.75, 1.8) of the
host model to 4 one-rank starts submitted at once to 4 one-GPU daemons (first steps 3.7-4.1 s):
the rest of the 2 cores goes to what the model does not count per rank (each attempt's rendezvous
store imports torch; the daemons).  Until 081834a a rank built its stand-in through transformers:
start 5.80 s, finish 1.69 s.  Used by ``scripts/bench_live.py --tiny``; a full run measures afresh
before its replay."""
