"""Structured logs: ``[log] format = "json"`` makes every line of a real frenzyd one JSON object, and
every line about a job carries its id (and attempt) as fields a log pipeline can select on."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from frenzyd import logs
from frenzyd.config import load_config
from frenzyd.errors import ConfigError
from frenzyd.net import auth

from .test_daemon_start import write_config

ROOT = Path(__file__).resolve().parents[2]


def _records(fmt: str, *calls: tuple[Any, ...], **extra: Any) -> list[str]:
    buf = io.StringIO()
    handler = logs.configure(fmt, logging.DEBUG, stream=buf)
    try:
        log = logging.getLogger("frenzyd.test")
        for msg, *args in calls:
            log.info(msg, *args, extra=extra or None)
    finally:
        logging.getLogger().removeHandler(handler)
    return buf.getvalue().splitlines()


def test_job_id_and_attempt_come_from_the_job_convention() -> None:
    lines = [json.loads(x) for x in _records(
        "json",
        ("job %s attempt %d: rank(s) here exited %s", "j-7", 3, {0: 0}),
        ("lease for job %s refused: %s", "j-8", "no GPU"),
        ("%s: %d%% done; job %s waits: %s", "pass", 50, "j-9", "no room"),
        ("coordinator for term %d: rebuilding the view", 4),
    )]
    assert [(x.get("job_id"), x.get("attempt")) for x in lines] == [
        ("j-7", 3), ("j-8", None), ("j-9", None), (None, None)]
    assert lines[2]["msg"] == "pass: 50% done; job j-9 waits: no room"
    assert {"ts", "level", "logger", "msg"} <= set(lines[0])
    assert (lines[0]["level"], lines[0]["logger"]) == ("info", "frenzyd.test")


def test_extra_fields_win_and_are_emitted() -> None:
    (line,) = _records("json", ("job %s: moved", "from-msg"), job_id="given", peer="abc123")
    rec = json.loads(line)
    assert (rec["job_id"], rec["peer"]) == ("given", "abc123")


def test_a_traceback_stays_inside_one_line() -> None:
    buf = io.StringIO()
    handler = logs.configure("json", logging.INFO, stream=buf)
    try:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            logging.getLogger("frenzyd.test").exception("job %s: task failed", "j-1")
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = buf.getvalue().splitlines()
    rec = json.loads(line)
    assert (rec["job_id"], rec["level"]) == ("j-1", "error")
    assert "ValueError: bad" in rec["exc"]


def test_text_format_is_unchanged_for_people() -> None:
    (line,) = _records("text", ("job %s attempt %d: started", "j-2", 1))
    assert line.endswith("INFO frenzyd.test: job j-2 attempt 1: started")


def test_config_keys_are_checked(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> None:
    cfg = write_config(tmp_path, pool_creds["n1"], listen="127.0.0.1:0", web="127.0.0.1:0")
    base = cfg.read_text()
    cfg.write_text(base + '[log]\nformat = "json"\nlevel = "warning"\n')
    c = load_config(cfg, {})
    assert (c.log.format, c.log.level) == ("json", "warning")
    cfg.write_text(base + '[log]\nformat = "xml"\n')
    with pytest.raises(ConfigError, match=r'\[log\] format .*"text", "json"'):
        load_config(cfg, {})


def test_a_real_daemon_logs_a_jobs_story_as_json(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg = write_config(tmp_path, pool_creds["n1"], listen="127.0.0.1:0", web="127.0.0.1:0")
    cfg.write_text(cfg.read_text() + '[log]\nformat = "json"\n[timing]\nheartbeat_s = 0.2\n'
                   'peer_timeout_s = 1.0\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INVOCATION_ID", None)
    daemon = subprocess.Popen([sys.executable, "-m", "frenzyd", "--config", str(cfg)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        sock = tmp_path / "client.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            assert time.monotonic() < deadline, "the daemon's client socket never appeared"
            time.sleep(0.2)
        work = tmp_path / "work"
        work.mkdir()
        (work / "hello.py").write_text("print('hello from rank 0')\n")
        run = subprocess.run(
            [sys.executable, "-m", "frenzy_client", "run", "--daemon", f"unix:{sock}", "--json",
             "--nproc", "1", "--mem-per-rank", "1MiB", "--", "hello.py"],
            env=env, capture_output=True, text=True, timeout=120, check=False, cwd=work)
        assert run.returncode == 0, run.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=60)
    lines = err.splitlines()
    events = [json.loads(x) for x in lines]  # every line is one JSON object
    job_lines = [e for e in events if e.get("job_id")]
    assert job_lines, lines
    assert len({e["job_id"] for e in job_lines}) == 1, "\n".join(json.dumps(e) for e in job_lines)
    job = job_lines[0]["job_id"]
    assert any(e.get("attempt") == 1 for e in job_lines)
    assert all(job in e["msg"] for e in job_lines)
    assert any(e["msg"].startswith(f"job {job} ") or e["msg"].startswith(f"job {job}:") for e in job_lines)
