"""``frenzy-client predict``: per-GPU training memory of a model and the feasible plans over a GPU list."""

from __future__ import annotations

import argparse
import json
from typing import Any

from frenzyd.errors import ConfigError, FrenzyError
from frenzyd.gpu_types import GPU_TYPES
from frenzyd.marp.analytic import predict as analytic_predict
from frenzyd.marp.calibration import MIN_RUNS, Calibration, OverheadCorrection, load_calibration
from frenzyd.marp.model import fmt_params, load_model
from frenzyd.marp.plans import CALIBRATED_TORCH, DEFAULT_HEADROOM, require_plans
from frenzyd.marp.spec import (
    DTYPE_MODES,
    OPTIMIZERS,
    PHASES,
    RECOMPUTES,
    GpuPool,
    Plan,
    Prediction,
    TrainingSetup,
)
from frenzyd.marp.validate import validate

GIB = 1024**3
DEFAULT_GPUS_PER_PEER = 8
"""A ``--gpus TYPE:N`` entry without ``/PER_PEER`` is taken as peers of at most this many GPUs."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="predict per-GPU training memory and the feasible GPU plans (offline)",
        description=(
            "Predict the peak tensor memory of the worst rank for one training step of a model "
            "(no runtime overhead), and with --gpus list the plans that fit, fastest first."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", required=True, help="a preset name (e.g. llama-3-8b) or a HF config.json path")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, required=True, help="sequences per rank per micro-step")
    p.add_argument(
        "--dtype",
        choices=DTYPE_MODES,
        required=True,
        help="fp32; bf16 (bf16 params and optimizer state); bf16-mixed (fp32 master + autocast)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="sequences per optimizer step (default micro-batch x dp); reached by accumulation",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument(
        "--recompute",
        choices=RECOMPUTES,
        default="none",
        help="full = HF gradient checkpointing per decoder layer",
    )
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO/FSDP stage")
    p.add_argument("--dp", type=int, default=1, help="data-parallel degree")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (inside one peer)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (1F1B)")
    p.add_argument(
        "--method",
        choices=("analytic", "trace"),
        default="analytic",
        help="analytic: closed form (ms); trace: the step under FakeTensorMode (seconds)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="whose kernels/autocast the analytic method models (compare a prediction only with a run "
        "on the same device: e.g. fp32 with grouped K/V heads takes SDPA's math kernel on CUDA, "
        "the flash kernel on the CPU); the trace method always runs the CPU path",
    )
    p.add_argument(
        "--gpus",
        default=None,
        help='GPU inventory, e.g. "A100-80GB:4,RTX-3090:8" (TYPE:COUNT[/PER_PEER], '
        f"PER_PEER default min(COUNT, {DEFAULT_GPUS_PER_PEER}))",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        help="a plan fits when bytes_per_gpu x (1 + headroom) <= GPU memory",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="a MARP calibration file (frenzyd.marp.calibration): raises a GPU type's runtime overhead "
        f"where at least {MIN_RUNS} GPU runs of this model family and torch version were measured",
    )
    p.add_argument(
        "--torch-version",
        default=None,
        help="torch version whose calibration applies (default: the installed torch, else "
        f"{CALIBRATED_TORCH})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_run)


def parse_gpus(text: str) -> list[GpuPool]:
    """Parse ``"A100-80GB:4,RTX-3090:8/4"`` into pools; unknown types and bad counts raise ConfigError."""
    by_lower = {name.lower(): name for name in GPU_TYPES}
    pools: dict[str, GpuPool] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, count_text = item.rpartition(":")
        if not sep or not name:
            raise ConfigError(f"--gpus entry {item!r} is not TYPE:COUNT (e.g. A100-80GB:4)")
        canonical = by_lower.get(name.strip().lower())
        if canonical is None:
            raise ConfigError(
                f"unknown GPU type {name.strip()!r} in --gpus: use one of {', '.join(GPU_TYPES)}"
            )
        count_part, _, per_part = count_text.partition("/")
        try:
            count = int(count_part)
            per_peer = int(per_part) if per_part else min(count, DEFAULT_GPUS_PER_PEER)
        except ValueError:
            raise ConfigError(f"--gpus entry {item!r}: COUNT (and /PER_PEER) must be integers") from None
        if count < 1 or per_peer < 1:
            raise ConfigError(f"--gpus entry {item!r}: counts must be positive")
        info = GPU_TYPES[canonical]
        if canonical in pools:
            prev = pools[canonical]
            count += prev.count
            per_peer = max(per_peer, prev.gpus_per_node or 0)
        pools[canonical] = GpuPool(canonical, count, info.memory_bytes, info.speed, min(per_peer, count))
    if not pools:
        raise ConfigError("--gpus is empty: give TYPE:COUNT entries, e.g. A100-80GB:4,RTX-3090:8")
    return list(pools.values())


def _setup(args: argparse.Namespace) -> TrainingSetup:
    if not 0.0 <= args.headroom < 10.0:
        raise ConfigError(f"--headroom {args.headroom} must be a fraction in [0, 10), e.g. 0.1")
    return TrainingSetup(
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        dtype=args.dtype,
        global_batch=args.global_batch,
        optimizer=args.optimizer,
        recompute=args.recompute,
        zero=args.zero,
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
    )


def _predict(args: argparse.Namespace, model: Any, setup: TrainingSetup) -> Prediction:
    if args.method == "analytic":
        return analytic_predict(model, setup, device=args.device, per_rank=True)
    try:
        from frenzyd.marp.trace import predict_trace
    except ImportError as exc:
        raise FrenzyError(
            f"--method trace is not available in this build ({exc}); use --method analytic"
        ) from exc
    result: Prediction = predict_trace(model, setup)
    return result


def _torch_version(args: argparse.Namespace) -> str:
    if args.torch_version:
        return str(args.torch_version)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return CALIBRATED_TORCH


def corrections(
    cal: Calibration, model: Any, torch_version: str, pools: list[GpuPool] | None
) -> list[OverheadCorrection]:
    """The calibration's verdict per GPU type: those of ``--gpus``, else every type the file knows."""
    if pools is not None:
        types = [p.gpu_type for p in pools]
    else:
        types = sorted({k.gpu_type for k in cal.calibrated_keys() if k.family == model.family})
    return [cal.correction(t, model.family, torch_version) for t in types]


def calibration_json(path: str, corr: list[OverheadCorrection], family: str, torch: str) -> dict[str, Any]:
    return {
        "file": path,
        "family": family,
        "torch": torch,
        "corrections": [
            {
                "gpu_type": c.key.gpu_type,
                "applies": c.applies,
                "runs": c.runs,
                "cpu_runs_ignored": c.cpu_runs_ignored,
                "extra_overhead_fraction": c.extra_overhead_fraction,
            }
            for c in corr
        ],
    }


def calibration_lines(path: str, corr: list[OverheadCorrection], family: str, torch: str) -> list[str]:
    lines = ["", f"calibration {path} ({family}, torch {torch}):"]
    if not corr:
        lines.append("  no entries for this model family and torch version: no correction applies")
    for c in corr:
        ignored = f"; {c.cpu_runs_ignored} CPU runs ignored" if c.cpu_runs_ignored else ""
        if c.applies:
            lines.append(
                f"  {c.key.gpu_type:<12} correction applies, from {c.runs} runs: runtime overhead raised by "
                f"{100 * c.extra_overhead_fraction:.1f} % of the tensor peak{ignored}"
            )
        else:
            lines.append(
                f"  {c.key.gpu_type:<12} no correction: {c.runs} GPU runs, {MIN_RUNS} needed{ignored}"
            )
    return lines


def to_json(pred: Prediction, plans: list[Plan] | None, *, device: str = "cuda") -> dict[str, Any]:
    """The DESIGN.md §6 object (``plans`` only when a GPU list was given).

    Beyond §6: ``device`` (whose kernels were modelled), ``method`` and
    ``per_rank_peak_bytes``, one peak per rank of the plan (rank = (stage x dp
    + d) x tp + t), so that a prediction can be compared rank by rank with a run
    on the same device.
    """
    bd = pred.breakdown
    out: dict[str, Any] = {
        "model": pred.model,
        "params": pred.params,
        "device": device,
        "method": pred.method,
        "peak_bytes": pred.peak_bytes,
        "per_rank_peak_bytes": list(pred.rank_peaks) if pred.rank_peaks else [pred.peak_bytes],
        "peak_phase": pred.peak_phase,
        "breakdown": {
            "parameters": bd.parameters,
            "gradients": bd.gradients,
            "optimizer": bd.optimizer,
            "activations": bd.activations,
            "temporaries": bd.temporaries,
        },
    }
    if plans is not None:
        out["plans"] = [
            {
                "gpu_type": p.gpu_type,
                "gpus": p.gpus,
                "dp": p.dp,
                "tp": p.tp,
                "pp": p.pp,
                "zero": p.zero,
                "micro_batch": p.micro_batch,
                "grad_accum": p.grad_accum,
                "bytes_per_gpu": p.bytes_per_gpu,
                "gpu_memory_bytes": p.gpu_memory_bytes,
                "step_time_s": p.step_time_s,
            }
            for p in plans
        ]
    return out


def _gib(n: int) -> str:
    return f"{n / GIB:8.2f}"


def render(
    pred: Prediction, setup: TrainingSetup, plans: list[Plan] | None, headroom: float, device: str = "cuda"
) -> str:
    """A readable report: breakdown at the peak, per-phase peaks, plans table."""
    bd = pred.breakdown
    lines = [
        f"model {pred.model}: {fmt_params(pred.params)} parameters ({pred.params:,})",
        f"plan dp={setup.dp} tp={setup.tp} pp={setup.pp} zero={setup.zero}  "
        f"micro-batch {setup.micro_batch} x "
        f"grad-accum {setup.grad_accum}  seq {setup.seq_len}  {setup.dtype}  {setup.optimizer}  "
        f"recompute {setup.recompute}  [{pred.method}, {device} kernels]",
        f"peak tensor memory of the worst rank: {pred.peak_bytes / GIB:.2f} GiB at {pred.peak_phase} "
        "(no runtime overhead)",
        "",
        "  component        GiB",
    ]
    for name in ("parameters", "gradients", "optimizer", "activations", "temporaries"):
        lines.append(f"  {name:<12} {_gib(getattr(bd, name))}")
    lines.append(f"  {'total':<12} {_gib(bd.total)}")
    ranks = pred.rank_peaks
    if len(ranks) > 1:
        per_stage = len(ranks) // setup.pp
        lines += ["", "  per-rank peaks   GiB"]
        for k in range(setup.pp):
            first, last = k * per_stage, (k + 1) * per_stage - 1
            who = f"rank {first}" if first == last else f"ranks {first}-{last}"
            stage = f" (stage {k})" if setup.pp > 1 else ""
            lines.append(f"  {who + stage:<24} {_gib(ranks[first])}")
    if pred.phases:
        lines += ["", "  phase peaks      GiB"]
        for ph in PHASES:
            if ph in pred.phases:
                mark = "  <- peak" if ph == pred.peak_phase else ""
                lines.append(f"  {ph:<12} {_gib(pred.phases[ph])}{mark}")
    if plans is not None:
        lines += [
            "",
            f"feasible plans (fit with {headroom:.0%} headroom, runtime overhead included), best first:",
        ]
        if not plans:
            lines.append("  none")
        else:
            lines.append("  gpu_type      gpus  dp  tp  pp zero micro accum  GiB/gpu  of GiB   step_s")
            for p in plans:
                lines.append(
                    f"  {p.gpu_type:<12} {p.gpus:>5} {p.dp:>3} {p.tp:>3} {p.pp:>3} {p.zero:>4} "
                    f"{p.micro_batch:>5} "
                    f"{p.grad_accum:>5} {p.bytes_per_gpu / GIB:>8.2f} {p.gpu_memory_bytes / GIB:>7.1f} "
                    f"{p.step_time_s:>8.3f}"
                )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    setup = _setup(args)
    validate(model, setup)
    pools = parse_gpus(args.gpus) if args.gpus is not None else None
    cal = load_calibration(args.calibration) if args.calibration is not None else None
    torch_version = _torch_version(args)
    pred = _predict(args, model, setup)
    plans = (
        require_plans(
            model, setup, pools, headroom=args.headroom, calibration=cal, torch_version=torch_version
        )
        if pools is not None
        else None
    )
    device = args.device if args.method == "analytic" else "cpu"
    corr = corrections(cal, model, torch_version, pools) if cal is not None else None
    if args.json:
        obj = to_json(pred, plans, device=device)
        if corr is not None:
            obj["calibration"] = calibration_json(args.calibration, corr, model.family, torch_version)
        print(json.dumps(obj))
    else:
        text = render(pred, setup, plans, args.headroom, device)
        if corr is not None:
            text += "\n" + "\n".join(calibration_lines(args.calibration, corr, model.family, torch_version))
        print(text)
    return 0
