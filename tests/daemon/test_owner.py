"""The owner's policy (frenzyd.node.owner) and ``frenzy-client owner busy|idle`` on real daemons.

The real-daemon test is issue 14's: the owner says busy on the GPU a trainer job runs on; the job
checkpoints within its grace, moves to the other node, resumes from the checkpoint its submitter
keeps and completes with the right step count; a local user who is neither in ``[owner] users``
nor an admin is refused (the kernel names the caller: ``SO_PEERCRED``).
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from frenzyd.errors import ConfigError
from frenzyd.node.owner import ALL_GPUS, OwnerPolicy, Window, parse_windows

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, cli, full_mesh, make_pool, wait_until  # noqa: E402

MON = datetime(2026, 11, 30)  # a Monday


def test_windows_parse_and_pass_midnight() -> None:
    nights = Window.parse("Mon-Fri 19:00-08:00")
    assert nights.days == frozenset(range(5))
    assert nights.contains(MON.replace(hour=20))
    assert not nights.contains(MON.replace(hour=12))
    assert nights.contains(datetime(2026, 12, 1, 7, 59))  # Tuesday morning: Monday's night
    assert nights.contains(datetime(2026, 12, 5, 7, 0))  # Saturday morning: Friday's night
    assert not nights.contains(datetime(2026, 12, 6, 7, 0))  # Sunday morning: Saturday is not listed
    weekend = Window.parse("Sat,Sun 00:00-24:00")
    assert weekend.contains(datetime(2026, 12, 6, 23, 59))
    assert not weekend.contains(datetime(2026, 12, 7, 0, 0))
    assert Window.parse("22:00-06:00").days == frozenset(range(7))
    assert Window.parse("fri-mon 09:00-17:00").days == frozenset({4, 5, 6, 0})
    for bad in ("Mon-Fri", "Moo 10:00-11:00", "25:00-26:00", "10:60-11:00"):
        with pytest.raises(ConfigError, match=r"\[owner\] windows"):
            parse_windows([bad])


def test_the_owners_word_hours_and_idle_time_withhold_a_gpu() -> None:
    p = OwnerPolicy(max_utilization=0.5, idle_s=300.0, windows=(Window.parse("Mon-Fri 19:00-08:00"),))
    evening = MON.replace(hour=20)
    assert p.reason("g0", now=0.0, local=evening) is None
    assert "windows" in (p.reason("g0", now=0.0, local=MON.replace(hour=12)) or "")
    p.signal(True, ["g0"])
    assert "said busy" in (p.reason("g0", now=0.0, local=evening) or "")
    assert p.reason("g1", now=0.0, local=evening) is None
    p.observe("g0", owner_process=False, utilization=0.0, frenzy_holds=False, now=10.0)
    p.signal(False, ["g0"])
    assert "idle minutes" in (p.reason("g0", now=100.0, local=evening) or "")  # seen busy 90 s ago
    assert p.reason("g0", now=311.0, local=evening) is None
    # Utilisation counts only while no Frenzy rank holds the GPU.
    p.observe("g1", owner_process=False, utilization=0.9, frenzy_holds=True, now=400.0)
    assert p.reason("g1", now=401.0, local=evening) is None
    p.observe("g1", owner_process=False, utilization=0.9, frenzy_holds=False, now=400.0)
    assert p.reason("g1", now=401.0, local=evening) is not None
    p.signal(True, [ALL_GPUS])
    assert p.said_busy("g7")
    p.signal(False, [ALL_GPUS])
    assert not p.said_busy("g7")
    assert not p.busy


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _post_as(uid: int, gid: int, sock: Path, path: str, body: dict[str, Any]) -> int:
    """POST ``body`` to the daemon's unix socket from a child process running as ``uid``: the kernel
    then names that user to the daemon (SO_PEERCRED).  Returns the HTTP status."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, one raw HTTP request, write the status, exit
        try:
            os.close(r)
            os.chdir(sock.parent)  # reached by a relative path: no search right needed above it
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            data = json.dumps(body).encode()
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(20)
            s.connect(sock.name)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: frenzyd\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            head = s.recv(64).split(b" ")
            os.write(w, head[1] if len(head) > 1 else b"0")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return int(out or b"0")


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "attention_dropout": 0.0}


def _job(d: Daemon, job_id: str) -> dict[str, Any] | None:
    try:
        jobs = json.loads(cli("jobs", "--daemon", d.address, "--json", timeout=30))["jobs"]
    except (RuntimeError, ValueError):
        return None
    return next((j for j in jobs if j["id"] == job_id), None)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: sends a request as another local user")
def test_owner_busy_moves_a_trainer_job_through_its_checkpoint_and_refuses_strangers(tmp_path: Path) -> None:
    from frenzyd.trainer.corpus import write_corpus

    names = ["n0", "n1"]
    creds = make_pool(tmp_path / "pool", names)
    ports, webs = _free_ports(2), _free_ports(2)
    daemons = [
        Daemon(NodeConf(
            name=name, base=tmp_path / name, credentials=creds[name], devices=[("A100-80GB", 1)],
            listen=f"127.0.0.1:{ports[i]}", web=f"127.0.0.1:{webs[i]}", interfaces=["lo"], mdns=False,
            peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i], priority=10 if i == 0 else 0,
            heartbeat_s=0.5, peer_timeout_s=2.0, rendezvous_ports=(29700 + 20 * i, 29719 + 20 * i),
            extra_toml="[owner]\nidle_minutes = 0.0\n",
        ))
        for i, name in enumerate(names)
    ]
    work = tmp_path / "work"
    work.mkdir()
    write_corpus(work / "corpus.txt", 32 << 10)
    (work / "tiny.json").write_text(json.dumps(TINY))
    try:
        for d in daemons:
            d.start()
        wait_until(lambda: full_mesh(daemons), 60, "a full mesh")
        out = cli("run", "--daemon", daemons[0].address, "--model", "tiny.json", "--data", "corpus.txt",
                  "--seq-len", "16", "--global-batch", "8", "--steps", "2000", "--dtype", "fp32",
                  "--checkpoint-every", "10", "--detach", "--json", cwd=work, timeout=120)
        job_id = json.loads(out.strip().splitlines()[-1])["job"]
        running = wait_until(lambda: (j := _job(daemons[0], job_id)) and j["state"] == "running"
                             and (j.get("progress") or {}).get("step", 0) >= 20 and j, 180, "progress")
        ids = {(d.status() or {})["node"]["id"]: d for d in daemons}
        host = ids[running["ranks"][0]["peer"]]
        other = next(d for d in daemons if d is not host)
        nobody = pwd.getpwnam("nobody")
        os.chmod(host.conf.socket, 0o666)  # let the stranger reach the API: the daemon must refuse
        assert _post_as(nobody.pw_uid, nobody.pw_gid, host.conf.socket, "/v1/owner",
                        {"state": "busy", "gpu": 0}) == 403
        assert _job(daemons[0], job_id)["state"] == "running"  # type: ignore[index]
        said = json.loads(cli("owner", "busy", "0", "--daemon", host.address, "--json", timeout=60))
        assert said["vacated"] == [job_id]
        assert said["gpus"][0]["offered"] is False
        done = wait_until(lambda: (j := _job(daemons[0], job_id)) and j["state"] in
                          ("succeeded", "failed", "cancelled") and j, 300, "the job to finish")
        assert done["state"] == "succeeded", done
        assert done["attempt"] == 2
        assert ids[done["ranks"][0]["peer"]] is other
        results = tmp_path / "results"
        cli("results", job_id, "--daemon", daemons[0].address, "--out", str(results), timeout=120)
        summary = json.loads(next(results.rglob("summary.json")).read_text())
        assert summary["steps_done"] == 2000
        assert summary["resumed_from_steps"][0] >= 20  # from the checkpoint written when the owner came
        cli("owner", "idle", "--daemon", host.address, timeout=60)
        st = host.status()
        assert st is not None
        mine = next(p for p in st["peers"] if p["name"] == host.conf.name)
        assert all(g["offered"] for g in mine["gpus"])
    finally:
        for d in daemons:
            d.stop()
