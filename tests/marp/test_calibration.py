"""Calibration from measured runs: each rule, the file format and its errors, its use by plans and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_client.cli import run_cli
from frenzyd.marp.calibration import (
    MAX_RUNS,
    MIN_RUNS,
    Calibration,
    CalibrationError,
    CalibrationKey,
    MeasuredRun,
    dump_calibration,
    fold_run,
    load_calibration,
    parse_calibration,
    torch_minor,
)
from frenzyd.marp.model import load_model
from frenzyd.marp.overhead import overhead_bytes
from frenzyd.marp.plans import feasible_plans
from frenzyd.marp.spec import GpuPool, TrainingSetup

GIB = 1024**3
PEAK = 10 * GIB


def run(
    shortfall: float,
    *,
    device: str = "cuda",
    gpu: str = "A100-80GB",
    family: str = "llama",
    torch: str = "2.13.0+cu128",
    ranks: int = 1,
) -> MeasuredRun:
    """A run whose NVML process bytes exceed the prediction (tensor peak + overhead) by ``shortfall``."""
    planned = PEAK + overhead_bytes(gpu, PEAK, ranks)
    return MeasuredRun(
        gpu_type=gpu,
        family=family,
        torch_version=torch,
        device=device,  # type: ignore[arg-type]
        predicted_peak_bytes=[PEAK] * ranks,
        measured_peak_bytes=[PEAK] * ranks,
        measured_process_bytes=[planned + int(shortfall * PEAK)] * ranks,
    )


def folded(*runs: MeasuredRun) -> Calibration:
    cal = Calibration()
    for r in runs:
        cal = fold_run(cal, r)
    return cal


def test_needs_at_least_three_runs() -> None:
    cal = folded(run(0.04), run(0.02))
    c = cal.correction("A100-80GB", "llama", "2.13")
    assert (c.applies, c.runs, c.extra_overhead_fraction) == (False, 2, 0.0)
    assert c.extra_bytes(PEAK) == 0
    c = fold_run(cal, run(0.01)).correction("A100-80GB", "llama", "2.13.1")
    assert (c.applies, c.runs) == (True, MIN_RUNS)
    assert c.extra_overhead_fraction == pytest.approx(0.04, abs=1e-9)  # the worst of the runs
    assert c.extra_bytes(PEAK) == pytest.approx(0.04 * PEAK, abs=2)


def test_only_raises_the_overhead() -> None:
    c = folded(run(-0.2), run(-0.1), run(-0.3)).correction("A100-80GB", "llama", "2.13")
    assert c.applies
    assert c.extra_overhead_fraction == 0.0  # runs that needed less lower nothing
    c = folded(run(-0.2), run(0.03), run(-0.3)).correction("A100-80GB", "llama", "2.13")
    assert c.extra_overhead_fraction == pytest.approx(0.03, abs=1e-9)


def test_cpu_runs_are_ignored_for_gpu_types_and_count_for_cpu() -> None:
    cal = folded(run(0.5, device="cpu"), run(0.5, device="cpu"), run(0.5, device="cpu"), run(0.01))
    c = cal.correction("A100-80GB", "llama", "2.13")
    assert (c.applies, c.runs, c.cpu_runs_ignored) == (False, 1, 3)
    cpu = folded(*(run(0.02, device="cpu", gpu="CPU") for _ in range(3))).correction("CPU", "llama", "2.13")
    assert cpu.applies
    assert cpu.extra_overhead_fraction == pytest.approx(0.02, abs=1e-9)


def test_kept_per_type_family_and_torch_minor() -> None:
    cal = folded(*(run(0.05) for _ in range(3)))
    assert cal.correction("A100-80GB", "llama", "2.13.0").applies
    assert not cal.correction("A100-80GB", "gpt2", "2.13").applies
    assert not cal.correction("A100-80GB", "llama", "2.14").applies
    assert not cal.correction("H100-80GB", "llama", "2.13").applies
    assert torch_minor("2.13.0+cu128") == "2.13"
    with pytest.raises(CalibrationError, match=r"MAJOR\.MINOR"):
        torch_minor("nightly")


def test_fold_takes_the_worst_rank_and_tensor_only_runs() -> None:
    gpu = "H100-80GB"
    r = MeasuredRun(
        gpu, "gpt2", "2.13", "cuda", predicted_peak_bytes=[PEAK, PEAK], measured_peak_bytes=[PEAK, PEAK + GIB]
    )
    (sample,) = fold_run(Calibration(), r).samples(CalibrationKey(gpu, "gpt2", "2.13"))
    assert sample.shortfall == pytest.approx(0.1)  # rank 1's tensors went 10 % beyond the prediction
    assert sample.ranks == 2


def test_keeps_the_latest_runs_only() -> None:
    cal = folded(run(0.9), *(run(0.01) for _ in range(MAX_RUNS)))
    assert len(cal.samples(CalibrationKey("A100-80GB", "llama", "2.13"))) == MAX_RUNS
    assert cal.correction("A100-80GB", "llama", "2.13").extra_overhead_fraction == pytest.approx(
        0.01, abs=1e-9
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"family": "bert"}, "family"),
        ({"device": "tpu"}, "device"),
        ({"measured_peak_bytes": [PEAK, PEAK]}, "one predicted and one measured peak per rank"),
        ({"predicted_peak_bytes": [0]}, "positive"),
        ({"gpu_type": ""}, "gpu_type"),
    ],
)
def test_fold_refuses_unusable_runs(bad: dict[str, object], message: str) -> None:
    base = {
        "gpu_type": "A100-80GB",
        "family": "llama",
        "torch_version": "2.13",
        "device": "cuda",
        "predicted_peak_bytes": [PEAK],
        "measured_peak_bytes": [PEAK],
    }
    with pytest.raises(CalibrationError, match=message):
        fold_run(Calibration(), MeasuredRun(**{**base, **bad}))  # type: ignore[arg-type]


def test_file_round_trip(tmp_path: Path) -> None:
    cal = folded(run(0.05), run(0.01, device="cpu"), run(0.02, gpu="RTX-3090", family="gpt2"))
    path = tmp_path / "cal.json"
    path.write_text(dump_calibration(cal))
    assert load_calibration(path) == cal
    doc = json.loads(path.read_text())
    assert doc["format"] == "frenzy-marp-calibration"
    assert doc["version"] == 1


def _doc(**entry: object) -> str:
    e = {"gpu_type": "A100-80GB", "family": "llama", "torch": "2.13", "runs": [], **entry}
    return json.dumps({"format": "frenzy-marp-calibration", "version": 1, "entries": [e]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "not JSON"),
        ("[]", "not a calibration file"),
        (json.dumps({"format": "frenzy-marp-calibration", "version": 2, "entries": []}), "newer frenzy"),
        (json.dumps({"format": "frenzy-marp-calibration", "version": 1}), "'entries' must be a list"),
        (_doc(family="t5"), r"entries\[0\].family"),
        (_doc(torch="latest"), "MAJOR.MINOR"),
        (
            _doc(runs=[{"device": "cuda", "shortfall": "big", "ranks": 1}]),
            r"entries\[0\].runs\[0\].shortfall",
        ),
        (_doc(runs=[{"device": "cuda", "shortfall": 1e9, "ranks": 1}]), "outside"),
        (_doc(runs=[{"device": "gpu", "shortfall": 0.1, "ranks": 1}]), r"runs\[0\].device"),
        (_doc(runs=[{"device": "cuda", "shortfall": 0.1, "ranks": 0}]), "ranks"),
    ],
)
def test_bad_files_are_refused_with_the_field(text: str, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        parse_calibration(text, source="cal.json")


def test_duplicate_entries_are_refused() -> None:
    doc = json.loads(_doc())
    doc["entries"].append(dict(doc["entries"][0]))
    with pytest.raises(CalibrationError, match="second entry"):
        parse_calibration(json.dumps(doc))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="does not exist"):
        load_calibration(tmp_path / "absent.json")


def test_plans_raise_only_the_calibrated_type() -> None:
    model = load_model("tiny-llama")
    setup = TrainingSetup(seq_len=256, micro_batch=1, dtype="bf16-mixed", global_batch=4)
    pools = [GpuPool("A100-80GB", 2, 80 * GIB, 3.0), GpuPool("RTX-3090", 2, 24 * GIB, 1.0)]
    cal = folded(*(run(0.25) for _ in range(3)))
    plain = {(p.gpu_type, p.gpus): p for p in feasible_plans(model, setup, pools)}
    raised = {(p.gpu_type, p.gpus): p for p in feasible_plans(model, setup, pools, calibration=cal)}
    assert plain.keys() == raised.keys()
    for k, p in plain.items():
        q = raised[k]
        if k[0] == "A100-80GB":
            assert q.bytes_per_gpu > p.bytes_per_gpu
        else:
            assert q.bytes_per_gpu == p.bytes_per_gpu
    # another torch minor version: not applied
    other = {
        (p.gpu_type, p.gpus): p
        for p in feasible_plans(model, setup, pools, calibration=cal, torch_version="2.12")
    }
    assert {k: p.bytes_per_gpu for k, p in other.items()} == {k: p.bytes_per_gpu for k, p in plain.items()}


PREDICT = ["predict", "--model", "tiny-llama", "--seq-len", "256", "--micro-batch", "1", "--dtype", "fp32"]


def test_cli_says_when_a_correction_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cal.json"
    cal = folded(
        *(run(0.05) for _ in range(3)), run(0.3, gpu="RTX-3090"), run(0.3, gpu="RTX-3090", device="cpu")
    )
    path.write_text(dump_calibration(cal))
    args = [
        *PREDICT,
        "--calibration",
        str(path),
        "--torch-version",
        "2.13.0",
        "--gpus",
        "A100-80GB:2,RTX-3090:2",
    ]
    assert run_cli([*args, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    by_type = {c["gpu_type"]: c for c in obj["calibration"]["corrections"]}
    assert by_type["A100-80GB"]["applies"] is True
    assert by_type["A100-80GB"]["runs"] == 3
    assert by_type["A100-80GB"]["extra_overhead_fraction"] == pytest.approx(0.05, abs=1e-9)
    assert by_type["RTX-3090"] == {
        "gpu_type": "RTX-3090",
        "applies": False,
        "runs": 1,
        "cpu_runs_ignored": 1,
        "extra_overhead_fraction": 0.0,
    }
    assert run_cli(args) == 0
    out = capsys.readouterr().out
    assert "correction applies, from 3 runs" in out
    assert "no correction: 1 GPU runs, 3 needed; 1 CPU runs ignored" in out


def test_cli_bad_calibration_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cal.json"
    path.write_text('{"format": "something-else"}')
    assert run_cli([*PREDICT, "--calibration", str(path)]) == 1
    err = capsys.readouterr().err
    assert "not a calibration file" in err
    assert "Traceback" not in err
