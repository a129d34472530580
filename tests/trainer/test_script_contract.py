"""The checkpoint contract for users' own loops: ``Checkpointable`` and the control channel's exec shim."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from frenzyd.errors import ConfigError
from frenzyd.trainer import Checkpointable, control
from frenzyd.trainer.script import MARKER, latest

ROOT = Path(__file__).resolve().parents[2]


def test_saving_makes_a_complete_checkpoint_keeps_only_the_newest_and_tells_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    monkeypatch.setenv("FRENZY_CONTROL_FD", str(w))
    monkeypatch.setenv("RANK", "0")
    control.reset_for_tests()
    try:
        ck = Checkpointable({"FRENZY_CHECKPOINT_DIR": str(tmp_path / "ck"), "FRENZY_STOP_GRACE_S": "7"},
                            handle_sigterm=False)
        assert ck.latest() is None
        assert ck.stop_grace_s == 7.0
        for step in (5, 10):
            with ck.saving(step) as d:
                (d / "state.txt").write_text(str(step))
        def fail_to_save() -> None:
            with ck.saving(15) as d:
                (d / "state.txt").write_text("15")
                raise RuntimeError("disk full")

        with pytest.raises(RuntimeError):  # a failed save keeps the previous checkpoint
            fail_to_save()
        found = ck.latest()
        assert found is not None
        assert found.step == 10
        assert (found.path / "state.txt").read_text() == "10"
        assert (found.path / MARKER).is_file()
        assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000010"]
        os.close(w)
        lines = [json.loads(x) for x in os.read(r, 10_000).decode().splitlines()]
    finally:
        os.close(r)
        control.reset_for_tests()
    assert [(m["type"], m["step"], m["path"]) for m in lines] == [
        ("checkpoint_complete", 5, str(tmp_path / "ck" / "step-00000005")),
        ("checkpoint_complete", 10, str(tmp_path / "ck" / "step-00000010"))]
    (tmp_path / "ck" / "step-00000020").mkdir()  # no COMPLETE marker: not a checkpoint
    assert latest(tmp_path / "ck").step == 10  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="--checkpointable"), \
            Checkpointable({}, handle_sigterm=False).saving(1):
        pass


def test_sigterm_sets_stop_requested() -> None:
    old = signal.getsignal(signal.SIGTERM)
    try:
        ck = Checkpointable({})
        assert not ck.stop_requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert ck.stop_requested
    finally:
        signal.signal(signal.SIGTERM, old)


def test_control_exec_hands_the_script_the_channel_as_FRENZY_CONTROL_FD(tmp_path: Path) -> None:
    """The rank host's named pipe, opened by the shim, reaches a Python script (``report``) and a
    shell command alike; a full pipe drops reports instead of blocking the rank."""
    fifo = tmp_path / "control"
    os.mkfifo(fifo)
    rd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # as the rank host holds it
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "FRENZY_JOB_ID": "j1",
               "FRENZY_ATTEMPT": "2"}
        script = tmp_path / "s.py"
        script.write_text("from frenzyd.trainer import report\nassert report(3, 1.5, steps=9)\n"
                          "import os\nprint(os.environ['FRENZY_CONTROL_FD'])\n")
        shim = [sys.executable, "-m", "frenzyd.trainer.control_exec", str(fifo), "--"]
        out = subprocess.run([*shim, str(script)], env=env, capture_output=True, text=True, timeout=60,
                             check=True)
        assert out.stdout.strip().isdigit()
        echo = 'echo \'{"type":"step","step":4,"loss":1.0}\' >&$FRENZY_CONTROL_FD'
        subprocess.run([*shim, "sh", "-c", echo], env=env, timeout=60, check=True)
        lines = [json.loads(x) for x in os.read(rd, 10_000).decode().splitlines()]
        assert lines == [{"type": "step", "step": 3, "loss": 1.5, "steps": 9, "rank": 1, "job": "j1",
                          "attempt": 2},
                         {"type": "step", "step": 4, "loss": 1.0}]
        flood = tmp_path / "flood.py"  # nobody reads: 64 KiB of pipe fill up, the rest is dropped
        flood.write_text("from frenzyd.trainer import control, report\n"
                         "sent = sum(report(i, 1.0, pad='x' * 900) for i in range(200))\n"
                         "assert 0 < sent < 200 and control.dropped() == 200 - sent, sent\n")
        subprocess.run([*shim, str(flood)], env=env, timeout=60, check=True)
        missing = subprocess.run([*shim[:3], str(tmp_path / "none"), "--", "true"], env=env,
                                 capture_output=True, text=True, timeout=60, check=True)
        assert "not opened" in missing.stderr  # it runs without the channel
    finally:
        os.close(rd)
