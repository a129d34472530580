"""bench_marp's "trainer" table: MARP's per-rank prediction against the built-in trainer's own measurement.

Rows are fixed here, in advance, and never used for fitting: the analytic
method runs with its default constants (``DEFAULT_CONSTANTS``, no per-GPU
calibration), ``device="cpu"``, ``per_rank=True``.  Each row runs for real:
``frenzyd.trainer`` on the plan (``frenzyd.marp.combos``), gloo, one torch
thread per rank, one process group per world size (``scripts/_trainer_group``),
``STEPS`` optimizer steps; the measured peak of a rank is the trainer's own
``PeakMemory`` record (CPU: profiler allocator events plus the tensors alive
when the window opens, over its first ``WINDOW_STEPS`` steps).

Per row: accuracy ``1 - |pred - measured| / measured`` on every rank, the
worst rank reported; ``under`` is the most negative ``(pred - measured) /
measured``.  Targets: every row >= 97 %, no rank under-predicted by more
than 3 %.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _trainer_group import run_group

TARGET_ACCURACY = 0.97
TARGET_UNDER = -0.03
STEPS = 3
"""The trainer measures over its first 3 steps (``frenzyd.trainer.memory.WINDOW_STEPS``)."""

TINY_MODEL = "tiny-llama"  # preset: 7.4 M parameters, GQA LLaMA (8 heads, 2 key/value heads, 4 layers)
BIG_MODEL = "gpt2"  # preset: 124 M parameters, GPT-2 small as published (dropout 0.1)


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    dtype: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 2
    grad_accum: int = 1
    seq_len: int = 64

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.dp * self.grad_accum

    @property
    def name(self) -> str:
        shape = " ".join(f"{k}{v}" for k, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp)) if v > 1)
        z = f" zero{self.zero}" if self.zero else ""
        return (f"{self.model} {shape}{z} {self.dtype} s{self.seq_len} b{self.micro_batch}"
                f" g{self.global_batch}")

    def plan(self, data: str) -> dict[str, Any]:
        return {"model": self.model, "data": data, "seq_len": self.seq_len, "global_batch": self.global_batch,
                "micro_batch": self.micro_batch, "steps": STEPS, "dtype": self.dtype, "dp": self.dp,
                "tp": self.tp, "pp": self.pp, "zero": self.zero, "lr": 1e-4, "seed": 0,
                "checkpoint_every": 0}


def _r(model: str, dtype: str, **kw: int) -> Row:
    if kw.get("pp", 1) > 1:
        kw.setdefault("grad_accum", kw["pp"])  # 1F1B needs at least pp micro-batches
    if model == BIG_MODEL:
        kw.setdefault("micro_batch", 1)
    return Row(model, dtype, **kw)


T, B = TINY_MODEL, BIG_MODEL
TINY_ROWS: tuple[Row, ...] = (
    _r(T, "fp32", dp=2),
    _r(T, "bf16-mixed", dp=2, zero=3),
    _r(T, "fp32", tp=2),
    _r(T, "bf16-mixed", pp=2),
)
"""``--tiny``: one process group of 2 ranks, the tiny model only."""

FULL_ROWS: tuple[Row, ...] = (
    # world size 2
    _r(T, "fp32", dp=2),
    _r(T, "fp32", dp=2, micro_batch=1, grad_accum=2),
    _r(T, "bf16-mixed", dp=2, zero=1),
    _r(T, "fp32", dp=2, zero=2),
    _r(T, "bf16-mixed", dp=2, zero=3),
    _r(T, "bf16", dp=2, zero=3),
    _r(T, "fp32", tp=2),
    _r(T, "bf16", tp=2),
    _r(T, "fp32", tp=2, zero=3),
    _r(T, "bf16-mixed", pp=2),
    _r(T, "fp32", pp=2, zero=2),
    _r(B, "fp32", dp=2),
    _r(B, "bf16-mixed", dp=2, zero=1),
    _r(B, "fp32", dp=2, zero=2),
    _r(B, "bf16-mixed", dp=2, zero=3),
    _r(B, "fp32", tp=2),
    _r(B, "bf16-mixed", pp=2),
    # world size 3
    _r(T, "fp32", dp=3, zero=3),
    _r(T, "bf16-mixed", dp=3, zero=1),
    _r(T, "bf16-mixed", dp=3, zero=2),
    # world size 4
    _r(T, "fp32", dp=4),
    _r(T, "bf16-mixed", dp=2, tp=2),
    _r(T, "fp32", dp=2, tp=2, zero=1),
    _r(T, "bf16-mixed", dp=2, tp=2, zero=2),
    _r(T, "fp32", dp=2, tp=2, zero=3),
    _r(T, "fp32", dp=2, pp=2),
    _r(T, "bf16-mixed", dp=2, pp=2, zero=1),
    _r(T, "fp32", dp=2, pp=2, zero=2),
    _r(T, "bf16-mixed", dp=2, pp=2, zero=3),
    _r(T, "fp32", tp=2, pp=2),
    _r(T, "bf16-mixed", pp=4),
    _r(B, "fp32", dp=2, tp=2, zero=3),
    _r(B, "bf16-mixed", dp=2, pp=2),
    _r(B, "fp32", tp=2, pp=2),
    _r(B, "bf16-mixed", dp=4, zero=3),
    # world size 8: the 3-D meshes (pp, dp, tp), every ZeRO stage, the tiny model only (GPT-2 124 M
    # on 8 ranks would hold 8 replicas' worth of processes on a 2-core machine)
    _r(T, "fp32", dp=2, tp=2, pp=2),
    _r(T, "bf16-mixed", dp=2, tp=2, pp=2, zero=1),
    _r(T, "fp32", dp=2, tp=2, pp=2, zero=2),
    _r(T, "bf16-mixed", dp=2, tp=2, pp=2, zero=3),
)
"""The full table: every entry of ``frenzyd.marp.combos`` but ``single``, world sizes 2-4 (the 3-D
meshes at 8, the least they take)."""


def predict(row: Row) -> Any:
    """MARP's analytic prediction for ``row`` on the CPU, per rank, default constants (no calibration)."""
    from frenzyd.marp import analytic
    from frenzyd.trainer.plan import resolve

    plan = resolve(row.plan(data="-"))
    return analytic.predict(plan.spec(), plan.setup(), constants=analytic.DEFAULT_CONSTANTS, device="cpu",
                            per_rank=True)


def score(pred: list[int], measured: list[int]) -> dict[str, Any]:
    """Per-rank accuracy and signed error; the row's worst rank."""
    if len(pred) != len(measured):
        raise ValueError(f"{len(pred)} predicted ranks vs {len(measured)} measured")
    accs = [1 - abs(p - m) / m for p, m in zip(pred, measured, strict=True)]
    errs = [(p - m) / m for p, m in zip(pred, measured, strict=True)]
    worst_under = min(errs)
    return {
        "accuracy_per_rank": accs,
        "error_per_rank": errs,
        "accuracy": min(accs),
        "worst_under": min(0.0, worst_under),
        "under_gt_3pct": worst_under < TARGET_UNDER,
        "meets_target": min(accs) >= TARGET_ACCURACY and worst_under >= TARGET_UNDER,
    }


class TrainerTable:
    """The table's measurement, started in a background thread (it waits on subprocesses) so that
    ``bench_marp`` can run its other tables meanwhile; :meth:`finish` joins, scores and prints."""

    def __init__(self, *, tiny: bool, workdir: Path | None = None,
                 worlds: frozenset[int] | None = None) -> None:
        rows = TINY_ROWS if tiny else FULL_ROWS
        self.rows = rows if worlds is None else tuple(r for r in rows if r.world in worlds)
        if not self.rows:
            raise ValueError(f"no {'tiny ' if tiny else ''}row has a world size in {sorted(worlds or ())}")
        self.tiny = tiny
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-marp-trainer-")
        self.work = Path(workdir) if workdir else Path(self._tmp.name)
        self.work.mkdir(parents=True, exist_ok=True)
        self.measured: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, str] = {}
        self._t0 = time.perf_counter()
        self._pool = ThreadPoolExecutor(1)
        self._future = self._pool.submit(self._measure)

    def _measure(self) -> None:
        from frenzyd.trainer.corpus import write_corpus

        data = str(write_corpus(self.work / "corpus.txt", 256 << 10))
        by_world: dict[int, list[Row]] = {}
        for r in self.rows:
            by_world.setdefault(r.world, []).append(r)
        for world, group in sorted(by_world.items()):
            g0 = time.perf_counter()
            print(f"  trainer: {len(group)} plan(s) in one group of {world} gloo ranks ...", flush=True)
            res = run_group(world, [{"name": r.name, "plan": r.plan(data)} for r in group], self.work)
            self.measured.update(res.summaries)
            print(f"  trainer: world size {world} done in {time.perf_counter() - g0:.0f} s", flush=True)
            if res.error is not None:
                print(f"  trainer: group of {world} FAILED: {res.error[:3000]}", flush=True)
                for r in group:
                    if r.name not in res.summaries:
                        self.errors[r.name] = res.error[:400]

    def finish(self) -> dict[str, Any]:
        """Wait for the runs, score every row, print the table; the table's JSON."""
        try:
            self._future.result()
        finally:
            self._pool.shutdown()
            self._tmp.cleanup()
        return score_rows(self.rows, self.measured, self.errors, tiny=self.tiny,
                          wall=time.perf_counter() - self._t0)


def run_table(*, tiny: bool, workdir: Path | None = None) -> dict[str, Any]:
    """Measure every row for real, predict it, score it; print the table; return its JSON."""
    return TrainerTable(tiny=tiny, workdir=workdir).finish()


def score_rows(rows: tuple[Row, ...], measured: dict[str, dict[str, Any]], errors: dict[str, str], *,
               tiny: bool, wall: float) -> dict[str, Any]:
    out_rows = []
    for r in rows:
        d: dict[str, Any] = {"row": r.name, **dataclasses.asdict(r), "world": r.world,
                             "global_batch": r.global_batch}
        p = predict(r)
        d["predicted_per_rank"] = list(p.rank_peaks)
        d["predicted_phase"] = p.peak_phase
        d["predicted_breakdown"] = dataclasses.asdict(p.breakdown)
        d["params"] = p.params
        s = measured.get(r.name)
        if s is None:
            d["error"] = errors.get(r.name, "not measured")
        else:
            mem = sorted(s["memory"], key=lambda m: m["rank"])
            d["measured_per_rank"] = [int(m["peak_tensor_bytes"]) for m in mem]
            d["measured_baseline_per_rank"] = [int(m["baseline_bytes"]) for m in mem]
            d["measure_method"] = mem[0]["method"] if mem else None
            d["losses"] = s["losses"]
            d.update(score(d["predicted_per_rank"], d["measured_per_rank"]))
        out_rows.append(d)
    ok = [d for d in out_rows if "accuracy" in d]
    summ = {
        "n": len(out_rows),
        "measured": len(ok),
        "meeting_target": sum(d["meets_target"] for d in ok),
        "min_accuracy": min((d["accuracy"] for d in ok), default=None),
        "mean_accuracy": sum(d["accuracy"] for d in ok) / len(ok) if ok else None,
        "worst_under": min((d["worst_under"] for d in ok), default=None),
        "under_gt_3pct": sum(d["under_gt_3pct"] for d in ok),
    }
    summ["targets_met"] = bool(ok) and len(ok) == len(out_rows) and summ["meeting_target"] == len(ok)
    print_table(out_rows, summ)
    print(f"  trainer table: {wall:.0f} s")
    return {
        "targets": {"min_accuracy": TARGET_ACCURACY, "worst_under": TARGET_UNDER},
        "method": "analytic, DEFAULT_CONSTANTS, device=cpu, per_rank=True (no calibration, never fitted)",
        "steps": STEPS,
        "tiny": tiny,
        "summary": summ,
        "wall_s": wall,
        "rows": out_rows,
    }


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def print_table(rows: list[dict[str, Any]], summ: dict[str, Any]) -> None:
    print()
    print("trainer table: MARP per-rank prediction (analytic, cpu, default constants) vs the trainer's "
          "measured peak per rank")
    hdr = (f"{'row':52s} {'phase':9s} {'predicted MiB (per rank)':>30s} {'measured MiB (per rank)':>30s} "
           f"{'acc (worst)':>11s} {'worst under':>11s} {'ok':>3s}")
    print(hdr)
    print("-" * len(hdr))
    for d in rows:
        pred = "/".join(_mib(v) for v in d["predicted_per_rank"])
        if "error" in d:
            print(f"{d['row']:52s} {d['predicted_phase']:9s} {pred:>30s} FAILED: {d['error'][:60]}")
            continue
        meas = "/".join(_mib(v) for v in d["measured_per_rank"])
        flag = "yes" if d["meets_target"] else ("UND" if d["under_gt_3pct"] else "no")
        print(f"{d['row']:52s} {d['predicted_phase']:9s} {pred:>30s} {meas:>30s} "
              f"{100 * d['accuracy']:10.2f}% {100 * d['worst_under']:10.2f}% {flag:>3s}")
    if summ["measured"]:
        print(f"rows {summ['n']}, measured {summ['measured']}, meeting the target {summ['meeting_target']}; "
              f"min accuracy {100 * summ['min_accuracy']:.2f}%, mean {100 * summ['mean_accuracy']:.2f}%, "
              f"worst under-prediction {100 * summ['worst_under']:.2f}%, rows under-predicted > 3 %: "
              f"{summ['under_gt_3pct']} (targets: every row >= 97 %, none under > 3 %: "
              f"{'met' if summ['targets_met'] else 'NOT met'})")


def markdown(table: dict[str, Any]) -> str:
    lines = [
        "",
        "Trainer table (MARP analytic, cpu, default constants, per rank; measured: the trainer's PeakMemory, "
        "gloo ranks):",
        "",
        "| plan | predicted MiB per rank | measured MiB per rank | accuracy (worst rank) | worst under "
        "| target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for d in table["rows"]:
        pred = " / ".join(_mib(v) for v in d["predicted_per_rank"])
        if "error" in d:
            lines.append(f"| `{d['row']}` | {pred} | FAILED | | | |")
            continue
        meas = " / ".join(_mib(v) for v in d["measured_per_rank"])
        ok = "met" if d["meets_target"] else ("under > 3 %" if d["under_gt_3pct"] else "missed")
        lines.append(f"| `{d['row']}` | {pred} | {meas} | {100 * d['accuracy']:.2f}% "
                     f"| {100 * d['worst_under']:.2f}% | {ok} |")
    s = table["summary"]
    if s["measured"]:
        lines += ["", f"{s['meeting_target']} of {s['n']} rows meet the target; min accuracy "
                  f"{100 * s['min_accuracy']:.2f}%, worst under-prediction {100 * s['worst_under']:.2f}%."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python scripts/_marp_trainer.py --world 8 [--out F.json] [--markdown F.md]``: only the rows of
    the given world sizes (the full table is ``bench_marp.py --trainer-only``)."""
    import argparse

    from benchmeta import provenance, write_results

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--world", type=int, action="append", required=True, help="a world size (repeatable)")
    ap.add_argument("--out", type=Path, help="results JSON")
    ap.add_argument("--markdown", type=Path, help="results table in Markdown")
    args = ap.parse_args(argv)
    prov = provenance()
    try:
        table = TrainerTable(tiny=False, worlds=frozenset(args.world)).finish()
    except ValueError as e:
        ap.error(str(e))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(table))
    if args.out:
        write_results(args.out, {"trainer": table}, prov)
    return 0 if table["summary"]["measured"] == table["summary"]["n"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
