"""Rank isolation: slot accounts (real throwaway local users), per-job directories, cgroup v2
``cgroup.kill`` and the kill-by-uid fallback, setsid escapes, trainer-only nodes, secrets' modes,
rank log rotation.  Tests that need root (useradd, cgroups, setuid) skip when not root."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frenzy_client.cmd_jobs import render_status
from frenzyd.config import Config, HostPort, WebSection
from frenzyd.daemon import Daemon
from frenzyd.errors import ConfigError, InfeasibleError, LaunchError
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import offers_from_reports, place, versions_match
from frenzyd.net import auth
from frenzyd.node import cgroup, slots
from frenzyd.node.launcher import Launcher, RankLog, RankSpec, unpack

from .conftest import fast_config

REPO = Path(__file__).resolve().parents[2]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                               reason="needs root and useradd (CI runs as root)")


def _gpu_groups() -> str:
    return ",".join(g for g in slots.GPU_GROUPS if _group_exists(g))


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def slot_prefix() -> Iterator[str]:
    """Two throwaway slot accounts ``fzPREFIX-s1``, ``-s2`` (unique per run), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        if os.environ.get("FRENZY_REQUIRE_NETNS") == "1":  # CI: these must run, not skip
            pytest.fail("slot account tests need root and useradd")
        pytest.skip("needs root and useradd (CI runs as root)")
    prefix = f"fz{secrets.token_hex(3)}-s"
    made = []
    try:
        for i in (1, 2):
            name = f"{prefix}{i}"
            cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                   "--shell", "/usr/sbin/nologin"]
            if _gpu_groups():
                cmd += ["--groups", _gpu_groups()]
            subprocess.run([*cmd, name], check=True, capture_output=True)
            made.append(name)
        yield prefix
    finally:
        for name in made:
            with contextlib.suppress(KeyError, ValueError):
                slots.kill_uid(pwd.getpwnam(name).pw_uid)
            subprocess.run(["userdel", name], check=False, capture_output=True)
            subprocess.run(["groupdel", name], check=False, capture_output=True)


@pytest.fixture
def execute_dir() -> Iterator[Path]:
    """A directory the slot accounts can reach (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="frenzy-exec-", dir="/tmp"))
    d.chmod(0o711)
    yield d
    slots.remove_run_dir(d)


class Output:
    def __init__(self) -> None:
        self.data: dict[int, bytearray] = {}
        self.changed = asyncio.Event()

    def __call__(self, rank: int, stream: str, chunk: bytes) -> None:
        self.data.setdefault(rank, bytearray()).extend(chunk)
        self.changed.set()

    def text(self, rank: int) -> str:
        return self.data.get(rank, bytearray()).decode()

    async def wait_for(self, rank: int, pattern: str, limit_s: float = 30.0) -> re.Match[str]:
        async with asyncio.timeout(limit_s):
            while not (m := re.search(pattern, self.text(rank))):
                self.changed.clear()
                await self.changed.wait()
        return m


def rank(job: str, workdir: Path, argv: list[str], r: int = 0) -> RankSpec:
    return RankSpec(job_id=job, rank=r, local_rank=r, world_size=1, local_world_size=1,
                    master_addr="127.0.0.1", master_port=1, gpu_indices=(0,), argv=argv, workdir=workdir,
                    output_dir=workdir.parent / "output")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def gone(pid: int, limit_s: float = 15.0) -> bool:
    """Await a process's exit through a pidfd (no polling); True once it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    loop.add_reader(fd, ended.set)
    try:
        async with asyncio.timeout(limit_s):
            await ended.wait()
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return True


def prepared(launcher: Launcher, job: str, data: Path) -> Path:
    """The attempt's directory from the launcher, with a ``work`` dir holding a private file."""
    run_dir = launcher.run_dir(job, 1, data / "runs" / job / "a1")
    (run_dir / "work").mkdir(parents=True, exist_ok=True)
    (run_dir / "work" / "secret.txt").write_text(f"secret of {job}\n")
    return run_dir


PROBE = ("id -u; id -G; grep CapEff /proc/self/status; echo HOME=$HOME; cat secret.txt; "
         "ls {other} 2>&1 | head -1; cat {key} 2>&1 | head -1; echo READY; exec sleep 60")


@ROOT_ONLY
async def test_two_jobs_run_as_two_slots_and_cannot_touch_each_other_or_the_daemon(
    tmp_path: Path, slot_prefix: str, execute_dir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    key = data / "node.key"
    key.write_text("PRIVATE KEY\n")
    key.chmod(0o600)
    iso = slots.isolation(slot_prefix)
    assert iso.mode == "slots"
    assert [s.name for s in iso.slots] == [f"{slot_prefix}1", f"{slot_prefix}2"]
    launcher = Launcher(data, term_grace_s=1.0, lease_s=60.0, isolation=iso, execute_dir=execute_dir)
    out = Output()
    dirs = {job: prepared(launcher, job, data) for job in ("ja", "jb")}
    try:
        for i, (job, other) in enumerate((("ja", "jb"), ("jb", "ja"))):
            argv = ["/bin/sh", "-c", PROBE.format(other=dirs[other] / "work", key=key)]
            await launcher.launch(rank(job, dirs[job] / "work", argv, r=i), out)
        for i in (0, 1):
            await out.wait_for(i, "READY")
        uids = [int(out.text(i).split()[0]) for i in (0, 1)]
        assert uids[0] != uids[1]
        assert {uids[0], uids[1]} == {s.uid for s in iso.slots}
        assert os.geteuid() not in uids
        for i, job in enumerate(("ja", "jb")):
            text = out.text(i)
            assert "CapEff:\t0000000000000000" in text
            assert f"HOME={dirs[job]}" in text
            assert f"secret of {job}" in text
            assert "Permission denied" in text.split("secret of")[1]  # the other job's dir, node.key
            assert "PRIVATE KEY" not in text
            st = dirs[job].stat()
            assert stat.S_IMODE(st.st_mode) == 0o700
            assert st.st_uid == uids[i]
            groups = {int(g) for g in text.splitlines()[1].split()}
            assert set(slots.gpu_group_ids()) <= groups
            assert 0 not in groups
        # a third job while both slots are busy is refused, saying what to do
        third = prepared(launcher, "jc", data)
        with pytest.raises(LaunchError, match="slot accounts of this node are busy"):
            await launcher.launch(rank("jc", third / "work", ["/bin/true"]), out)
        assert iso.report()["slots_busy"] == 2
    finally:
        for job in ("ja", "jb", "jc"):
            await launcher.cancel(job, 1, grace_s=0.5)
            await asyncio.to_thread(launcher.release, job, 1)
    assert not any(p.exists() for p in dirs.values())
    assert iso.busy == {}
    assert not slots.uid_pids(iso.slots[0].uid)
    assert not slots.uid_pids(iso.slots[1].uid)
    await launcher.close()


ESCAPE = "setsid /bin/sh -c 'trap \"\" TERM; echo ESC $$; exec sleep 300' & sleep 0.3; echo UP; {tail}"
"""A rank whose child leaves its session and process group and ignores SIGTERM: only SIGKILL to the
whole job (cgroup.kill, or every process of the slot) ends it."""


@ROOT_ONLY
@pytest.mark.parametrize("mode", ["slots+cgroup", "slots+fallback", "own-user+cgroup"])
async def test_a_rank_that_escapes_with_setsid_dies_with_its_job(
    tmp_path: Path, execute_dir: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    """Cancel ends a setsid'd child (cgroup.kill, or every process of the slot account); so does the
    rank's own exit (its output pipes would otherwise stay open and its wait never return)."""
    use_slots = mode.startswith("slots")
    iso = slots.isolation(request.getfixturevalue("slot_prefix")) if use_slots else None
    data = tmp_path / "data"
    launcher = Launcher(data, term_grace_s=0.5, lease_s=60.0, isolation=iso, execute_dir=execute_dir,
                        cgroups=mode.endswith("cgroup"))
    if mode.endswith("cgroup"):
        if launcher.cgroups is None and os.environ.get("FRENZY_REQUIRE_NETNS") != "1":
            pytest.skip(f"no usable cgroup v2 here: {launcher.isolation.kill}")
        assert launcher.cgroups is not None, launcher.isolation.kill  # CI must test cgroup.kill
    else:
        assert launcher.cgroups is None
        assert "slot account" in launcher.isolation.kill
    for job, tail in (("cancelled", "exec sleep 300"), ("exits", "exit 0")):
        run_dir = prepared(launcher, job, data) if use_slots else data / "runs" / job
        (run_dir / "work").mkdir(parents=True, exist_ok=True)
        out = Output()
        argv = ["/bin/sh", "-c", ESCAPE.format(tail=tail)]
        h = await launcher.launch(rank(job, run_dir / "work", argv), out)
        esc = int((await out.wait_for(0, r"ESC (\d+)")).group(1))
        await out.wait_for(0, "UP")
        assert os.getsid(esc) == esc != h.pid  # it left the rank's session and process group
        assert esc in launcher.own_pids()  # owner protection still knows it is Frenzy's
        if job == "cancelled":
            await launcher.cancel(job, 1, grace_s=0.5)
        else:
            async with asyncio.timeout(20):
                assert await h.wait() == 0
        assert await gone(esc), f"{mode}: the escaped process {esc} survived"
        await asyncio.to_thread(launcher.release, job, 1)
    await launcher.close()
    if launcher.cgroups is not None:
        assert not launcher.cgroups.root.exists()


@ROOT_ONLY
async def test_an_expired_lease_kills_what_escaped_too(
    tmp_path: Path, slot_prefix: str, execute_dir: Path
) -> None:
    """The lease supervisor (the daemon frozen) kills the attempt's cgroup, not just process groups."""
    data = tmp_path / "data"
    launcher = Launcher(data, term_grace_s=0.5, lease_s=2.0, isolation=slots.isolation(slot_prefix),
                        execute_dir=execute_dir)
    run_dir = prepared(launcher, "lease", data)
    out = Output()
    argv = ["/bin/sh", "-c", ESCAPE.format(tail="exec sleep 300")]
    h = await launcher.launch(rank("lease", run_dir / "work", argv), out)
    esc = int((await out.wait_for(0, r"ESC (\d+)")).group(1))
    assert await gone(esc, 20.0)  # nobody renewed the 2 s lease
    async with asyncio.timeout(20):
        await h.wait()
    assert await launcher.unsupervise("lease", 1)
    await asyncio.to_thread(launcher.release, "lease", 1)
    await launcher.close()


@ROOT_ONLY
def test_a_daemon_that_cannot_switch_users_runs_only_its_users_jobs(slot_prefix: str) -> None:
    """The refusal is read from a real unprivileged process (a slot account's); such a daemon refuses
    another user's job at launch and its report says why."""
    pw = pwd.getpwnam(f"{slot_prefix}1")
    proc = subprocess.Popen(["/bin/sleep", "30"], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    try:
        why = slots.switch_users_refusal(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert why is not None
    assert f"runs as {pw.pw_name}, not root, without CAP_SETUID, CAP_SETGID, CAP_KILL" in why
    assert slots.switch_users_refusal() is None  # root
    iso = slots.isolation(slot_prefix, refusal=why)  # slots exist, but it could not switch to them
    me = slots.user_name(os.geteuid())
    assert (iso.mode, iso.only_own, iso.reason) == ("own-user", True, why)
    iso.admit("j1", None, trainer=False)  # a job submitted in-process
    iso.admit("j2", me, trainer=False)
    with pytest.raises(LaunchError, match=rf"runs only its own user's \({re.escape(me)}\) jobs because"):
        iso.admit("j3", "somebody-else", trainer=False)
    rep = iso.report()
    assert (rep["runs_as"], rep["only_jobs_of"], rep["reason"]) == ("own-user", me, why)


def test_a_daemon_without_slot_accounts_runs_every_job_as_itself_and_says_so() -> None:
    iso = slots.isolation("fz-none-", refusal=None)
    assert (iso.mode, iso.only_own) == ("own-user", False)
    assert "no slot accounts fz-none-1, fz-none-2, ... exist" in iso.reason
    iso.admit("j", "somebody-else", trainer=False)
    assert iso.report()["only_jobs_of"] is None
    assert slots.isolation(want_slots=False, refusal=None).reason == "[launcher] slots = false"


def _spec(trainer: bool) -> JobSpec:
    if trainer:
        return JobSpec(argv=(), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                       torch_version="2.13.0", trainer=True, data_name="d.txt", model="tiny-llama")
    return JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", nproc=1, mem_per_rank=1 << 30)


def test_a_trainer_only_node_gets_no_script_and_refuses_one_anyway() -> None:
    gpu = {"uuid": "g0", "index": 0, "type": "A10", "memory_bytes": 24 << 30, "free_bytes": 24 << 30,
           "offered": True}
    reports = {"vol": {"python": "3.11.7", "torch": "2.13.0", "gpus": [gpu],
                       "launcher": {"accept": "trainer-only", "runs_as": "slots"}}}
    offers = offers_from_reports(reports)
    assert offers[0].trainer_only
    assert versions_match(_spec(True), offers[0])
    assert not versions_match(_spec(False), offers[0])
    with pytest.raises(InfeasibleError, match="accept only built-in trainer jobs"):
        place(_spec(False), offers)
    reports["vol"]["launcher"]["accept"] = "any"
    assert place(_spec(False), offers_from_reports(reports)) is not None
    # the node itself refuses a script launch, whatever placed it there
    iso = slots.Isolation("own-user", slots.user_name(os.geteuid()), "test", accept="trainer-only")
    with pytest.raises(LaunchError, match="accepts only built-in trainer jobs"):
        iso.admit("j", None, trainer=False)
    iso.admit("j", None, trainer=True)


def test_a_node_whose_slots_are_all_busy_is_offered_no_gpu() -> None:
    """Its launches would be refused (all slots busy): placing there again each pass only made the
    job's attempt numbers climb. Its GPUs come back when a slot is free."""
    gpu = {"uuid": "g0", "index": 0, "type": "A10", "memory_bytes": 24 << 30, "free_bytes": 24 << 30,
           "offered": True}
    reports = {"ws": {"python": "3.11.7", "torch": "2.13.0", "gpus": [gpu],
                      "launcher": {"accept": "any", "runs_as": "slots", "slots": 2, "slots_busy": 2}}}
    assert not offers_from_reports(reports)[0].gpus[0].available
    assert place(_spec(False), offers_from_reports(reports)) is None  # waits; it can fit later
    reports["ws"]["launcher"]["slots_busy"] = 1
    assert place(_spec(False), offers_from_reports(reports)) is not None
    reports["ws"]["launcher"] = {"accept": "any", "runs_as": "own-user"}  # no slots: never full
    assert place(_spec(False), offers_from_reports(reports)) is not None


def test_secrets_must_be_private(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    key.write_text("k")
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"node\.key is mode 0644: .*`chmod 600 .*node\.key`"):
        slots.check_secrets([key, tmp_path / "absent"])
    key.chmod(0o600)
    slots.check_secrets([key, tmp_path / "absent"])
    if os.geteuid() == 0:
        os.chown(key, 65534, 65534)
        with pytest.raises(ConfigError, match="belongs to uid 65534"):
            slots.check_secrets([key])


def test_an_unreachable_execute_dir_is_a_config_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    with pytest.raises(ConfigError, match=r"execute_dir .* mode 0700, so the slot accounts cannot reach"):
        slots.check_execute_dir(tmp_path / "exec")


def test_cgroup_mount_is_found_through_proc_mounts(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup2 /sys/fs/my\\040cgroups cgroup2 rw 0 0\n")
    assert cgroup.find_mount(mounts) == Path("/sys/fs/my cgroups")
    mounts.write_text("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    assert cgroup.find_mount(mounts) is None
    tree, why = cgroup.open_tree(tmp_path, mounts=mounts)
    assert tree is None
    assert "no cgroup v2 mounted" in why


def test_rank_logs_rotate_at_their_cap_and_old_ones_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "j.a1.rank0.log"
    rl = RankLog(path, max_bytes=100, keep=2)
    for i in range(12):
        rl.write(f"{i:02d}".encode() * 20)  # 40 bytes a line
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["j.a1.rank0.log", "j.a1.rank0.log.1", "j.a1.rank0.log.2"]
    assert all(p.stat().st_size <= 100 for p in path.parent.iterdir())
    assert path.read_bytes().endswith(b"11" * 20)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    launcher = Launcher(tmp_path / "data", cgroups=False, rank_log_retention_s=3600.0)
    launcher.log_dir.mkdir(parents=True)
    old, new = launcher.log_dir / "old.rank0.log", launcher.log_dir / "new.rank0.log"
    old.write_text("x")
    new.write_text("y")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    launcher.reap_leftovers()
    assert not old.exists()
    assert new.exists()


async def _status_of(cfg: Config) -> dict[str, Any]:
    cfg = dataclasses.replace(cfg, web=WebSection(HostPort("127.0.0.1", 0)))
    d, stop = Daemon(cfg), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        return d.status()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _with_launcher(cfg: Config, **launcher: Any) -> Config:
    return dataclasses.replace(cfg, launcher=dataclasses.replace(cfg.launcher, **launcher))


async def test_the_status_says_who_ranks_run_as_and_what_the_node_accepts(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg = _with_launcher(fast_config(tmp_path, pool_creds["n3"]), slot_prefix="fz-none-",
                         accept="trainer-only")
    st = await _status_of(cfg)
    la = st["peers"][0]["launcher"]
    assert la["accept"] == "trainer-only"
    assert la["runs_as"] == "own-user"
    assert la["user"] == slots.user_name(os.geteuid())
    assert la["reason"]  # no slot accounts fz-none-N here (or, not root: cannot switch users)
    assert "kill" in la
    out = io.StringIO()
    render_status(st, out)
    assert "not as slot accounts" in out.getvalue() or "only" in out.getvalue()
    assert "accepts only built-in trainer jobs (no scripts)" in out.getvalue()


@ROOT_ONLY
async def test_the_status_shows_slot_accounts(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials], slot_prefix: str, execute_dir: Path
) -> None:
    cfg = _with_launcher(fast_config(tmp_path, pool_creds["n3"]), slot_prefix=slot_prefix,
                         execute_dir=execute_dir)
    la = (await _status_of(cfg))["peers"][0]["launcher"]
    assert (la["runs_as"], la["slots"], la["slots_busy"], la["accept"]) == ("slots", 2, 0, "any")


async def test_a_daemon_whose_key_others_can_read_does_not_start(tmp_path: Path) -> None:
    creds_dir = auth.add_node(auth.create_pool(tmp_path / "pool").pool_dir, "k1").out_dir
    creds = auth.load_credentials(creds_dir)
    creds.node_key.chmod(0o640)
    with pytest.raises(ConfigError, match=r"node\.key is mode 0640: group and other users can read"):
        await asyncio.wait_for(Daemon(fast_config(tmp_path, creds)).run(asyncio.Event()), 30)
    assert not (tmp_path / "k1" / "launcher").exists()  # refused before anything ran


RUN_SH = """\
id -u > "$FRENZY_OUTPUT_DIR/uid.txt"
echo "rank $RANK as $(id -un) home $HOME"
grep CapEff /proc/self/status
"""


@ROOT_ONLY
async def test_a_pool_job_runs_as_a_slot_and_leaves_nothing_behind(
    tmp_path: Path, slot_prefix: str, execute_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submit, place, launch, results and clean-up through real orchestrators: the rank host runs the
    job's rank as a slot, returns its output files, then removes its directory and frees the slot."""
    from . import orch_harness

    made: list[Launcher] = []

    class SlotLauncher(Launcher):
        def __init__(self, data_dir: Path, **kw: Any) -> None:
            super().__init__(data_dir, isolation=slots.isolation(slot_prefix), execute_dir=execute_dir, **kw)
            made.append(self)

    monkeypatch.setattr(orch_harness, "Launcher", SlotLauncher)
    pool = orch_harness.Pool(tmp_path)
    try:
        pool.add("a", 1)
        c = pool.add("c", 0)
        pool.coordinator = "a"
        pool.start()
        d = tmp_path / "job"
        d.mkdir()
        (d / "run.sh").write_text(RUN_SH)
        rec = await c.orch.submit({"workdir": str(d), "argv": ["/bin/sh", "run.sh"], "nproc": 1,
                                   "mem_per_rank": orch_harness.GIB})
        done = await orch_harness.wait_state(c, rec.id, {"succeeded", "failed", "cancelled"})
        assert done["state"] == "succeeded", done
        out = "".join(ev["data"] for ev in c.orch.store.read_output(rec.id))
        assert f"rank 0 as {slot_prefix}1 home {execute_dir}/{rec.id}.a1" in out
        assert "CapEff:\t0000000000000000" in out
        results = c.orch.store.results(rec.id)
        assert results is not None
        dest = tmp_path / "res"
        unpack(results, hashlib.sha256(results).hexdigest(), dest, 1 << 20)
        assert int((dest / "uid.txt").read_text()) == pwd.getpwnam(f"{slot_prefix}1").pw_uid
        host = made[0]
        await orch_harness.eventually(lambda: not host.isolation.busy)
        logged = await asyncio.to_thread((host.log_dir / f"{rec.id}.a1.rank0.log").read_text)
        assert f"rank 0 as {slot_prefix}1" in logged  # kept on the rank host too (rotated, bounded)
        assert await asyncio.to_thread(os.listdir, execute_dir) == []
        if host.cgroups is not None:
            assert not await asyncio.to_thread(host.cgroups.path(f"{rec.id}.a1").exists)
    finally:
        await pool.close()


CRASHING_DAEMON = """\
import asyncio, sys
from pathlib import Path
from frenzyd.node import slots
from frenzyd.node.launcher import Launcher, RankSpec

async def main() -> None:
    data, ex, prefix, cgroups = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    launcher = Launcher(data, isolation=slots.isolation(prefix), execute_dir=ex, lease_s=600.0,
                        cgroups=cgroups)
    run_dir = launcher.run_dir("j-crash", 1, data / "runs")
    (run_dir / "work").mkdir()
    escape = "setsid /bin/sh -c 'trap \\"\\" TERM; echo ESC $$; exec sleep 300' & exec sleep 300"
    spec = RankSpec(job_id="j-crash", rank=0, local_rank=0, world_size=1, local_world_size=1,
                    master_addr="127.0.0.1", master_port=1, gpu_indices=(0,), argv=["/bin/sh", "-c", escape],
                    workdir=run_dir / "work", output_dir=run_dir / "output")
    out = sys.stdout.buffer
    await launcher.launch(spec, lambda rank, stream, chunk: (out.write(chunk), out.flush()))
    await asyncio.sleep(600)

asyncio.run(main())
"""


@ROOT_ONLY
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "fallback"])
async def test_a_killed_daemon_leaves_no_escaped_rank_and_its_successor_cleans_up(
    tmp_path: Path, slot_prefix: str, execute_dir: Path, cgroups: bool
) -> None:
    """SIGKILL the daemon: its ranks' supervisor ends the job's cgroup (or slot) at once, a setsid'd
    child that ignores SIGTERM included; the next daemon removes the job's directory."""
    data = tmp_path / "data"
    script = tmp_path / "daemon.py"
    script.write_text(CRASHING_DAEMON)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(data), str(execute_dir), slot_prefix, "1" if cgroups else "0",
        stdout=subprocess.PIPE, env=env)
    assert daemon.stdout is not None
    async with asyncio.timeout(60):
        line = await daemon.stdout.readline()
    esc = int(line.split()[1])
    assert os.getsid(esc) == esc
    daemon.kill()
    await daemon.wait()
    assert await gone(esc, 20.0), "the escaped process outlived its daemon"
    assert (execute_dir / "j-crash.a1").exists()
    successor = Launcher(data, isolation=slots.isolation(slot_prefix), execute_dir=execute_dir,
                         cgroups=cgroups)
    successor.reap_leftovers()
    assert await asyncio.to_thread(os.listdir, execute_dir) == []
    for s in successor.isolation.slots:
        assert not slots.uid_pids(s.uid)
    if successor.cgroups is not None:
        assert not await asyncio.to_thread(successor.cgroups.root.exists)


async def test_a_trainer_only_node_refuses_a_script_even_when_placed_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator that does not see the node's ``accept`` (the harness's view leaves the launcher
    report out) places a script job there: the node refuses the launch, nothing runs, and the job
    stays queued saying why."""
    from . import orch_harness

    class TrainerOnly(Launcher):
        def __init__(self, data_dir: Path, **kw: Any) -> None:
            iso = slots.Isolation("own-user", slots.user_name(os.geteuid()), "test", accept="trainer-only")
            super().__init__(data_dir, isolation=iso, **kw)

    monkeypatch.setattr(orch_harness, "Launcher", TrainerOnly)
    pool = orch_harness.Pool(tmp_path)
    try:
        pool.add("a", 1)
        c = pool.add("c", 0)
        pool.coordinator = "a"
        pool.start()
        d = tmp_path / "job"
        d.mkdir()
        (d / "run.sh").write_text("touch /tmp/should-not-run\n")
        rec = await c.orch.submit({"workdir": str(d), "argv": ["/bin/sh", "run.sh"], "nproc": 1,
                                   "mem_per_rank": orch_harness.GIB})
        await orch_harness.eventually(
            lambda: "accepts only built-in trainer jobs" in (c.orch.store.get(rec.id).message or ""))
        assert c.orch.store.get(rec.id).state == "queued"
        assert not c.orch.store.read_output(rec.id)  # no rank ever started
    finally:
        await pool.close()


UNIT_CAPS = "setuid,setgid,kill,dac_read_search,chown"
"""The ambient capabilities systemd/frenzyd.service gives frenzyd (tests/test_systemd_unit.py checks them)."""

NON_ROOT_DAEMON = """\
import asyncio, json, os, sys
from pathlib import Path
from frenzyd.node import slots
from frenzyd.node.launcher import Launcher, RankSpec, collect_results, unpack

async def main() -> None:
    data, ex, prefix = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    launcher = Launcher(data, isolation=slots.isolation(prefix), execute_dir=ex, term_grace_s=1.0)
    run_dir = launcher.run_dir("j-caps", 1, data / "runs")
    (run_dir / "work").mkdir()
    probe = ("id -u; grep CapEff /proc/self/status; echo secret > $FRENZY_OUTPUT_DIR/r.txt; "
             "chmod 000 $FRENZY_OUTPUT_DIR/r.txt $FRENZY_OUTPUT_DIR")
    spec = RankSpec(job_id="j-caps", rank=0, local_rank=0, world_size=1, local_world_size=1,
                    master_addr="127.0.0.1", master_port=1, gpu_indices=(0,), argv=["/bin/sh", "-c", probe],
                    workdir=run_dir / "work", output_dir=run_dir / "output")
    out = bytearray()
    handle = await launcher.launch(spec, lambda rank, stream, chunk: out.extend(chunk))
    code = await handle.wait()
    results = collect_results(run_dir / "output", 1 << 20)  # a 000 file in a 000 directory of the slot
    import hashlib, tempfile
    got = Path(tempfile.mkdtemp())
    unpack(results, hashlib.sha256(results).hexdigest(), got / "r", 1 << 20)
    await launcher.cancel("j-caps", 1)
    launcher.release("j-caps", 1)
    print(json.dumps({"uid": os.geteuid(), "mode": launcher.isolation.mode, "kill": launcher.isolation.kill,
                      "cgroup": None if launcher.cgroups is None else str(launcher.cgroups.root),
                      "code": code, "rank": out.decode(), "result": (got / "r" / "r.txt").read_text(),
                      "left": os.listdir(ex)}))

asyncio.run(main())
"""


@ROOT_ONLY
@pytest.mark.parametrize("delegated", [True, False], ids=["delegated-cgroup", "no-cgroup"])
def test_a_non_root_daemon_with_the_units_capabilities_runs_ranks_as_slots(
    tmp_path: Path, slot_prefix: str, execute_dir: Path, delegated: bool
) -> None:
    """frenzyd as an ordinary user holding only the systemd unit's ambient capabilities (setpriv, as
    systemd would start it): ranks run as a slot with no capabilities, the daemon reads a result the
    slot made unreadable, and takes the directory back to remove it.  ``delegated``: started in a
    cgroup given to its user, as ``Delegate=yes`` does, it keeps its jobs in cgroups below it; else
    it falls back to killing the slot's processes."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    mount = cgroup.find_mount()
    if delegated and (mount is None or not os.access(mount, os.W_OK)):
        if os.environ.get("FRENZY_REQUIRE_NETNS") == "1":
            pytest.fail(f"no writable cgroup v2 to delegate ({mount})")
        pytest.skip("no writable cgroup v2 to delegate")
    name = f"{slot_prefix}d"  # not a slot: no number after the prefix
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        base = Path(tempfile.mkdtemp(prefix="frenzy-nonroot-", dir="/tmp"))
        os.chown(base, pw.pw_uid, pw.pw_gid)
        os.chown(execute_dir, pw.pw_uid, pw.pw_gid)
        script = base / "daemon.py"
        script.write_text(NON_ROOT_DAEMON)
        enter: list[str] = []
        if delegated:
            assert mount is not None
            deleg = mount / f"{slot_prefix}deleg"
            deleg.mkdir()
            # what systemd's Delegate=yes hands the service's user
            for f in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
                os.chown(deleg / f, pw.pw_uid, pw.pw_gid)
            enter = ["/bin/sh", "-c", f'echo $$ > {deleg}/cgroup.procs && exec "$@"', "enter"]
        res = subprocess.run(
            [*enter, "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
             f"--inh-caps=+{UNIT_CAPS.replace(',', ',+')}", f"--ambient-caps=+{UNIT_CAPS.replace(',', ',+')}",
             "--", sys.executable, str(script), str(base / "data"), str(execute_dir), slot_prefix],
            capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        assert res.returncode == 0, res.stderr[-3000:]
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["uid"] == pw.pw_uid
        assert got["mode"] == "slots"
        assert got["code"] == 0
        uid_line, cap_line = got["rank"].splitlines()[:2]
        assert int(uid_line) == pwd.getpwnam(f"{slot_prefix}1").pw_uid
        assert cap_line.split() == ["CapEff:", "0000000000000000"]  # the daemon's capabilities stop at it
        assert got["result"] == "secret\n"
        assert got["left"] == []
        if delegated:
            assert got["cgroup"].startswith(f"{deleg}/frenzy."), got["kill"]
            assert not list(deleg.glob("frenzy.*"))  # its subtree went with the job
        else:
            assert got["cgroup"] is None
            assert "every process of its slot account" in got["kill"]
    finally:
        with contextlib.suppress(NameError, OSError):
            deleg.rmdir()
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)
        with contextlib.suppress(NameError):
            shutil.rmtree(base, ignore_errors=True)
