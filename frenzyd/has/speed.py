"""The speed and scaling model: how long a training step takes on a placement (HAS and the simulator use it).

Fixed before any scheduling policy was tuned (DESIGN.md §4); every policy is
judged by it and every policy sees the same estimates.  Changing a constant
needs a reason in the commit message and a rerun of every table.

Model (per optimizer step of a job with ``P`` parameters, global batch ``B``
sequences of ``s`` tokens, ``L`` layers, hidden ``h``; plan ``dp × tp × pp`` on
``n = dp·tp·pp`` GPUs of relative speed ``v`` (V100 = 1.0), spread over
``peers`` peers):

* work: ``W = B·s·(6·P + 6·L·s·h)`` FLOPs (Kaplan et al. 2020, "Scaling Laws
  for Neural Language Models", §2.1: ``C ≈ 6N`` per token plus the attention
  context term ``6·n_layer·n_ctx·d_model``), × 8/6 with full activation
  recompute (one more forward pass; Korthikanti et al. 2022).
* compute: ``W / (n · v · F_V100) / e_tp · (1 + (pp − 1)/m)`` with
  ``F_V100 = 39 TFLOP/s`` sustained per V100 (Shoeybi et al. 2019,
  Megatron-LM: 39 TFLOP/s on one V100, 30 % of peak), tensor-parallel
  efficiency ``e_tp = 0.77^(log2(tp)/3)`` (Megatron-LM: 77 % weak-scaling
  efficiency at 8-way tensor parallelism inside one DGX-2H node) and the 1F1B
  pipeline bubble ``(pp − 1)/m`` for ``m`` micro-batches per step
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM", §2.2.1).
* gradient synchronisation (dp > 1): a ring all-reduce of the rank's fp32
  gradients ``4·P/(tp·pp)`` bytes moves ``2·(dp − 1)/dp`` times that volume
  (Patarasuk & Yuan 2009) at the bus bandwidth of the slowest link: inside one
  peer ``12 GB/s`` (NCCL ``all_reduce_perf`` bus bandwidth over PCIe 3/4 x16,
  no NVLink: workstation GPUs), between peers ``1.1 GB/s`` (10 GbE, 90 %
  efficiency: a lab LAN).  ZeRO-3 moves 1.5× the data-parallel volume
  (Rajbhandari et al. 2020, "ZeRO", §7); ZeRO-1/2 the same as plain dp.
  DDP overlaps the all-reduce with the backward pass of the last micro-batch
  (Li et al. 2020, "PyTorch Distributed", §3.2.3): only
  ``max(0, comm − (2/3)·compute/m)`` is exposed.
* restart cost (every re-placement): ``30 s`` start-up plus reading a
  checkpoint of ``12·P`` bytes (fp32 weights and two Adam moments) at
  ``1 GB/s``; 30–130 s for our presets, inside the 25–250 s Sia reports for
  its workloads (Jayaram Subramanya et al. 2023, §6.1).

GPU relative speeds are the cited per-type scalars of ``frenzyd.gpu_types``
(``../shared/data/README.md``).  One scalar per type is a simplification:
speed-ups are model dependent (Gavel measured a V100 at 0.43x-1.8x a P100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frenzyd.marp.spec import Plan

V100_SUSTAINED_FLOPS = 39e12
"""Sustained training FLOP/s of one V100 (Shoeybi et al. 2019)."""
TP_EFFICIENCY_AT_8 = 0.77
"""Tensor-parallel efficiency at 8-way inside one node (Shoeybi et al. 2019)."""
INTRA_PEER_BUS_BYTES_S = 12e9
"""NCCL all-reduce bus bandwidth between GPUs of one peer over PCIe (no NVLink)."""
INTER_PEER_BUS_BYTES_S = 1.1e9
"""All-reduce bus bandwidth between peers: 10 GbE at 90 % efficiency."""
ZERO3_COMM_FACTOR = 1.5
"""ZeRO-3 communication volume relative to data parallelism (Rajbhandari et al. 2020)."""
GRAD_BYTES_PER_PARAM = 4
"""fp32 gradients: the reference step keeps fp32 parameters under bf16 autocast (DESIGN.md §3)."""
BACKWARD_SHARE = 2.0 / 3.0
"""Backward share of a micro-step's compute, the window the all-reduce overlaps with."""
RESTART_BASE_S = 30.0
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINT_READ_BYTES_S = 1e9


@dataclass(frozen=True, slots=True)
class JobSpeed:
    """What the speed model needs to know about one job; all times in seconds."""

    params: int
    flops_per_step: float
    """Training FLOPs of one optimizer step (whole global batch)."""

    @property
    def grad_bytes(self) -> float:
        return float(GRAD_BYTES_PER_PARAM * self.params)

    @property
    def restart_cost_s(self) -> float:
        """Seconds lost each time the job is (re)started on a new placement."""
        return RESTART_BASE_S + CHECKPOINT_BYTES_PER_PARAM * self.params / CHECKPOINT_READ_BYTES_S

    def step_time_s(self, plan: Plan, gpu_speed: float, peers: int) -> float:
        """Seconds per optimizer step of ``plan`` on GPUs of speed ``gpu_speed`` over ``peers`` peers.

        ``peers`` ≥ 1; tensor parallelism is assumed inside one peer (HAS
        guarantees it), so only data-parallel traffic crosses peers.
        """
        if plan.gpus <= 0 or gpu_speed <= 0:
            raise ValueError("a plan needs at least one GPU of positive speed")
        m = max(1, plan.grad_accum)
        tp_eff = TP_EFFICIENCY_AT_8 ** (math.log2(plan.tp) / 3.0) if plan.tp > 1 else 1.0
        bubble = 1.0 + (plan.pp - 1) / m
        compute = self.flops_per_step / (plan.gpus * gpu_speed * V100_SUSTAINED_FLOPS) / tp_eff * bubble
        if plan.dp <= 1:
            return compute
        bw = INTER_PEER_BUS_BYTES_S if peers > 1 else INTRA_PEER_BUS_BYTES_S
        volume = 2.0 * (plan.dp - 1) / plan.dp * self.grad_bytes / (plan.tp * plan.pp)
        if plan.zero >= 3:
            volume *= ZERO3_COMM_FACTOR
        comm = volume / bw
        exposed = max(0.0, comm - BACKWARD_SHARE * compute / m)
        return compute + exposed


def flops_per_step(
    params: int, layers: int, hidden: int, seq_len: int, global_batch: int, *, recompute: bool = False
) -> float:
    """Training FLOPs of one optimizer step: ``B·s·(6P + 6·L·s·h)`` (Kaplan et al. 2020).

    Full activation recompute runs the forward pass twice: ``8/6`` of that
    (Korthikanti et al. 2022, §3: recompute adds one forward, ~33 %).
    """
    base = float(global_batch * seq_len * (6 * params + 6 * layers * seq_len * hidden))
    return base * (8.0 / 6.0) if recompute else base
