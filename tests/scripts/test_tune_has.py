"""scripts/tune_has.py: the tuning harness scores a cell as --final does and never runs the test split."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import tune_has  # noqa: E402

from frenzyd.has import frenzy, frenzy_rules  # noqa: E402


def run(avg: float, p99: float, failed: int = 0, restarts: int = 0) -> dict[str, float]:
    return {"avg": avg, "p99": p99, "failed": failed, "restarts": restarts}


def window(**avgs: float) -> dict[str, dict[str, float]]:
    out = {name: run(a, 2 * a) for name, a in avgs.items()}
    for name in tune_has.OTHERS:
        out.setdefault(name, run(1e9, 2e9))
    return out


def test_a_cell_is_scored_on_means_over_windows_against_complete_baselines_only() -> None:
    others = [window(sia=100.0, fifo=10.0, srtf=90.0), window(sia=300.0, fifo=10.0, srtf=110.0)]
    others[1]["fifo"]["failed"] = 3  # fifo failed jobs in one window: never the best baseline
    ours = [run(80.0, 150.0), run(240.0, 500.0)]
    s = tune_has.score("lab-20:1:gpus", ours, others)
    assert s["best_baseline"] == "sia"
    assert s["vs_best"] == pytest.approx(160.0 / 200.0)
    assert s["p99_vs_best"] == pytest.approx(325.0 / 400.0)
    assert s["reference"] == "srtf"
    assert s["vs_reference"] == pytest.approx(160.0 / 100.0)


def test_the_test_split_and_unknown_constants_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        tune_has.main(["--split", "test"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="SHRINK_RATIO"):
        tune_has.parse_set(["NOT_A_KNOB=1"])
    with pytest.raises(SystemExit, match="not a number"):
        tune_has.parse_set(["SHRINK_RATIO=four"])
    # Bound as FrenzyPolicy's default argument at import: a --set would silently change nothing.
    with pytest.raises(SystemExit, match="--min-run-s"):
        tune_has.parse_set(["SHRINK_MIN_RUN_S=600"])


def test_a_set_constant_reaches_the_module_the_rules_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frenzy_rules, "SHRINK_TRIES", frenzy_rules.SHRINK_TRIES)
    monkeypatch.setattr(frenzy, "SHRINK_TRIES", frenzy.SHRINK_TRIES)
    tune_has.apply_set(tune_has.parse_set(["SHRINK_TRIES=7"]))
    assert frenzy_rules.SHRINK_TRIES == 7
    assert isinstance(frenzy_rules.SHRINK_TRIES, int)
    assert frenzy.SHRINK_TRIES == 7


def test_one_window_runs_caches_the_baselines_and_reuses_them(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache.json", tmp_path / "scores.json"
    args = ["--split", "validation", "--windows", "1", "--cells", "lab-20:1:gputime", "--processes", "1",
            "--cache", str(cache), "--json", str(out)]
    assert tune_has.main(args) == 0
    cached = json.loads(cache.read_text())
    assert cached["fingerprint"] == tune_has.baseline_fingerprint()
    assert list(cached["windows"]) == ["validation|0|lab-20:1:gputime"]
    assert set(cached["windows"]["validation|0|lab-20:1:gputime"]) == set(tune_has.OTHERS)
    first = json.loads(out.read_text())
    (cell,) = first["cells"]
    assert cell["best_baseline"] in tune_has.BASELINES
    assert cell["vs_best"] > 0.0
    assert cell["vs_reference"] > 0.0
    # The cache holds the baselines: a second run with a constant changed reads them back unchanged.
    before = cache.read_text()
    assert tune_has.main([*args, "--set", "SHRINK_RATIO=4.0"]) == 0
    assert cache.read_text() == before
    assert json.loads(out.read_text())["set"] == {"SHRINK_RATIO": 4.0}


def test_a_cache_built_for_other_code_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    now = tune_has.baseline_fingerprint()
    path.write_text(json.dumps({"fingerprint": "0" * 64, "windows": {"tune|0|lab-20:1:gpus": {}}}))
    assert tune_has.load_cache(path, now) == {"fingerprint": now, "windows": {}}
    path.write_text(json.dumps({"fingerprint": now, "windows": {"tune|0|lab-20:1:gpus": {}}}))
    assert tune_has.load_cache(path, now)["windows"] == {"tune|0|lab-20:1:gpus": {}}
    path.write_text("not json")
    assert tune_has.load_cache(path, now)["windows"] == {}


def test_the_fingerprint_covers_everything_a_simulated_run_imports() -> None:
    """Every ``frenzyd`` import in the simulated packages (at module level or inside a function) stays
    within ``SIMULATED``: a change anywhere else cannot change a baseline's result."""
    root = ROOT
    covered = {p.removesuffix(".py").replace("/", ".") for p in tune_has.SIMULATED}
    outside = []
    for part in tune_has.SIMULATED:
        files = (root / part).rglob("*.py") if (root / part).is_dir() else [root / part]
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    assert not node.level, f"{path}: a relative import this check does not resolve"
                    names = [node.module or ""]
                else:
                    continue
                outside += [f"{path.relative_to(root)}: {n}" for n in names
                            if n.startswith("frenzyd.") and not any(n == c or n.startswith(c + ".")
                                                                    for c in covered)]
    assert outside == []


def test_only_frenzy_imports_the_files_the_fingerprint_leaves_out() -> None:
    """A module of ``FRENZY_ONLY`` imported by a baseline (or the simulator) would change its results
    without changing the fingerprint, and a stale cache would be scored as fresh.  The registry imports
    Frenzy's class only to name it: a baseline's run executes none of its code."""
    only = {"frenzyd.has." + name.removesuffix(".py") for name in tune_has.FRENZY_ONLY}
    users = []
    for part in tune_has.SIMULATED:
        files = (ROOT / part).rglob("*.py") if (ROOT / part).is_dir() else [ROOT / part]
        for path in files:
            if path.parent.name == "has" and path.name in (*tune_has.FRENZY_ONLY, "registry.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in only:
                    users.append(f"{path.relative_to(ROOT)}: {node.module}")
                elif isinstance(node, ast.Import):
                    users += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in only]
    assert users == []
