"""Launcher: real rank processes with gloo on loopback, env contract, cancel, parent death, payloads."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzyd.errors import LaunchError
from frenzyd.node.launcher import Launcher, RankSpec, collect_results, pack_dir, rank_env, unpack

ROOT = Path(__file__).resolve().parents[2]
DDP_TINY = ROOT / "frenzyd" / "examples" / "ddp_tiny.py"


class Output:
    """Collects each rank's streams; lets a test await a pattern."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, str], bytearray] = {}
        self.changed = asyncio.Event()

    async def __call__(self, rank: int, stream: str, chunk: bytes) -> None:
        self.data.setdefault((rank, stream), bytearray()).extend(chunk)
        self.changed.set()

    def text(self, rank: int, stream: str = "stdout") -> str:
        return self.data.get((rank, stream), bytearray()).decode()

    async def wait_for(self, rank: int, pattern: str, limit_s: float = 60.0) -> re.Match[str]:
        async with asyncio.timeout(limit_s):
            while True:
                m = re.search(pattern, self.text(rank))
                if m:
                    return m
                self.changed.clear()
                await self.changed.wait()


def spec(
    job: str, rank: int, world: int, port: int, workdir: Path, argv: list[str], **kw: object
) -> RankSpec:
    return RankSpec(
        job_id=job, rank=rank, local_rank=rank, world_size=world, local_world_size=world,
        master_addr="127.0.0.1", master_port=port, gpu_indices=tuple(range(world)), argv=argv,
        workdir=workdir, output_dir=workdir / f"out{rank}", **kw,  # type: ignore[arg-type]
    )


async def wait_pid_gone(pid: int, limit_s: float = 30.0) -> None:
    """Await a process's exit through a pidfd (no polling); fine when it is already gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    loop.add_reader(fd, gone.set)
    try:
        async with asyncio.timeout(limit_s):
            await gone.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_two_rank_ddp_job_over_gloo_loss_falls(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "data")
    port = await launcher.start_store("job1", 1, "127.0.0.1")
    out = Output()
    work = tmp_path / "work"
    work.mkdir()
    argv = [str(DDP_TINY), "--steps", "25"]
    handles = [
        await launcher.launch(spec("job1", r, 2, port, work, argv, socket_ifname="lo"), out) for r in range(2)
    ]
    codes = await asyncio.gather(*(h.wait() for h in handles))
    await launcher.stop_store("job1", 1)
    await launcher.unsupervise("job1", 1)
    assert codes == [0, 0], out.text(0, "stderr") + out.text(1, "stderr")
    losses = [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", out.text(0))]
    assert len(losses) == 25
    assert losses[-1] < 0.5 * losses[0]
    assert "rank 1/2" in out.text(1)
    result = json.loads((work / "out0" / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["losses"] == pytest.approx(losses, abs=2e-6)
    # rank 0's output files come back as a checked archive
    data = collect_results(work / "out0", 1 << 20)
    files = unpack(data, hashlib.sha256(data).hexdigest(), tmp_path / "client", 1 << 20)
    assert [f.name for f in files] == ["result.json"]
    assert not list((tmp_path / "data" / "launcher" / "pids").iterdir())


ENV_DUMP = textwrap.dedent(
    """
    import json, os
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
            "TORCHELASTIC_USE_AGENT_STORE", "FRENZY_OUTPUT_DIR", "FRENZY_JOB_ID", "EXTRA"]
    print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "cwd": os.getcwd(),
                      "pgid": os.getpgid(0), "pid": os.getpid()}))
    """
)


async def test_env_contract(tmp_path: Path) -> None:
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    launcher = Launcher(tmp_path / "data")
    out = Output()
    s = RankSpec(
        job_id="j-env", rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="10.77.0.2",
        master_port=29511, gpu_indices=(2, 5), argv=["dump.py"], workdir=tmp_path,
        output_dir=tmp_path / "o", env={"EXTRA": "x", "RANK": "99"}, backend="nccl", socket_ifname="veth7",
    )
    h = await launcher.launch(s, out)
    assert await h.wait() == 0, out.text(3, "stderr")
    got = json.loads(out.text(3))
    assert got["env"] == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.77.0.2", "MASTER_PORT": "29511", "CUDA_VISIBLE_DEVICES": "2,5",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "GLOO_SOCKET_IFNAME": "veth7", "NCCL_SOCKET_IFNAME": "veth7",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "FRENZY_OUTPUT_DIR": str(tmp_path / "o"),
        "FRENZY_JOB_ID": "j-env", "EXTRA": "x",
    }
    assert Path(got["cwd"]) == tmp_path
    assert got["pgid"] == got["pid"]  # its own process group, so cancel can kill the group
    await launcher.close()  # ends the attempt's lease supervisor


async def test_launch_errors_are_launch_errors(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "data")
    with pytest.raises(LaunchError, match="empty command"):
        await launcher.launch(spec("j", 0, 1, 1, tmp_path, []))
    with pytest.raises(LaunchError, match="does not exist"):
        await launcher.launch(spec("j", 0, 1, 1, tmp_path / "nope", ["x.py"]))
    h = await launcher.launch(spec("j", 0, 1, 1, tmp_path, ["/nonexistent/binary"]))
    assert await h.wait() != 0
    await launcher.close()


async def test_store_listens_only_on_its_address(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "data")
    port = await launcher.start_store("j-store", 1, "127.0.0.1")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
        pid = next(iter(launcher._stores.values())).pid
        assert pid in launcher.own_pids()
    finally:
        await launcher.stop_store("j-store", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


async def test_store_ignores_a_frenzyd_in_the_daemons_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an old checkout in the working directory must not shadow the running frenzyd (python -m puts cwd first)
    (tmp_path / "old" / "frenzyd").mkdir(parents=True)
    (tmp_path / "old" / "frenzyd" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path / "old")
    launcher = Launcher(tmp_path / "data")
    port = await launcher.start_store("j-cwd", 1, "127.0.0.1")
    await launcher.stop_store("j-cwd", 1)
    assert port > 0


async def test_store_on_foreign_address_fails_clearly(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "data")
    with pytest.raises(LaunchError, match=r"rendezvous store did not start on 192\.0\.2\.1"):
        await launcher.start_store("j-bad", 1, "192.0.2.1")


FAMILY = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    print(os.getpid(), child.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("mode", ["polite", "stubborn"])
async def test_cancel_kills_the_process_group(tmp_path: Path, mode: str) -> None:
    (tmp_path / "family.py").write_text(FAMILY)
    launcher = Launcher(tmp_path / "data", term_grace_s=1.0)
    out = Output()
    h = await launcher.launch(spec("j-c", 0, 1, 1, tmp_path, ["family.py", mode]), out)
    m = await out.wait_for(0, r"(\d+) (\d+)\n")
    rank_pid, child_pid = int(m.group(1)), int(m.group(2))
    assert {rank_pid, child_pid} <= launcher.own_pids()
    await launcher.cancel("j-c", 1)
    code = await h.wait()
    assert code == (-signal.SIGTERM if mode == "polite" else -signal.SIGKILL)
    await wait_pid_gone(child_pid, 10)
    assert not alive(child_pid)


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from frenzyd.node.launcher import Launcher, RankSpec

    async def main():
        tmp = Path(sys.argv[1])
        launcher = Launcher(tmp / "data")
        printed = asyncio.Event()
        def out(rank, stream, chunk):
            sys.stdout.write(chunk.decode()); sys.stdout.flush()
        spec = RankSpec("j-pd", 0, 0, 1, 1, "127.0.0.1", 1, (), ["family.py", "stubborn"], tmp, tmp / "o")
        await launcher.launch(spec, out)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


async def test_ranks_die_with_their_daemon_and_leftovers_are_reaped(tmp_path: Path) -> None:
    (tmp_path / "family.py").write_text(FAMILY)
    (tmp_path / "parent.py").write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = await asyncio.create_subprocess_exec(
        sys.executable, str(tmp_path / "parent.py"), str(tmp_path), stdout=subprocess.PIPE, env=env,
    )
    assert parent.stdout is not None
    async with asyncio.timeout(60):
        line = await parent.stdout.readline()
    rank_pid, child_pid = map(int, line.split())
    assert alive(rank_pid)
    assert alive(child_pid)
    pid_files = list((tmp_path / "data" / "launcher" / "pids").glob("*.pid"))
    assert sorted(p.name for p in pid_files) == ["j-pd.a1.rank0.pid", "j-pd.a1.supervisor.pid"]
    parent.kill()  # SIGKILL: the daemon gets no chance to clean up
    await parent.wait()
    await wait_pid_gone(rank_pid, 10)  # parent-death signal
    assert not alive(rank_pid)
    # the rank's own child outlived it (it was not armed); a restarted daemon reaps the group via pid files
    relaunched = Launcher(tmp_path / "data")
    relaunched.reap_leftovers()
    await wait_pid_gone(child_pid, 10)
    assert not alive(child_pid)
    assert not list((tmp_path / "data" / "launcher" / "pids").glob("*.pid"))


async def test_reap_kills_a_group_whose_leader_is_already_reaped(tmp_path: Path) -> None:
    # a rank killed by the parent-death signal and reaped by init leaves its children in its group
    code = (
        "import subprocess,sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                     stdout=subprocess.DEVNULL)\n"
        "print(c.pid)\n"
    )
    leader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    async with asyncio.timeout(30):
        child_pid = int(await leader.stdout.readline())
    launcher = Launcher(tmp_path / "data")
    launcher._write_pid("old.rank0", leader.pid)
    assert await leader.wait() == 0  # the leader is gone and reaped; its child lives on in its group
    assert alive(child_pid)
    assert launcher.reap_leftovers() == [leader.pid]
    await wait_pid_gone(child_pid, 10)
    assert not alive(child_pid)


async def test_reap_ignores_recycled_pids(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "data")
    # a pid file whose pid now belongs to another process (different start time): left alone
    (launcher.pid_dir / "old.rank0.pid").write_text(json.dumps({"pid": os.getpid(), "start": 1}))
    (launcher.pid_dir / "junk.pid").write_text("not json")
    assert launcher.reap_leftovers() == []
    assert not list(launcher.pid_dir.iterdir())


async def test_rank_exit_is_seen_and_its_strays_killed(tmp_path: Path) -> None:
    # the rank exits but leaves a child holding its stdout: wait() still returns, the child is killed
    (tmp_path / "stray.py").write_text(
        "import subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(c.pid, flush=True)\n"
    )
    launcher = Launcher(tmp_path / "data")
    out = Output()
    h = await launcher.launch(spec("j-s", 0, 1, 1, tmp_path, ["stray.py"]), out)
    child = int((await out.wait_for(0, r"(\d+)\n")).group(1))
    async with asyncio.timeout(30):
        assert await h.wait() == 0
    await wait_pid_gone(child, 10)
    assert not alive(child)


async def test_output_callback_failure_does_not_block_the_rank(tmp_path: Path) -> None:
    (tmp_path / "loud.py").write_text("import sys\nfor i in range(20000): print('x' * 100)\n")
    launcher = Launcher(tmp_path / "data")

    def bad(rank: int, stream: str, chunk: bytes) -> None:
        raise RuntimeError("consumer bug")

    h = await launcher.launch(spec("j-o", 0, 1, 1, tmp_path, ["loud.py"]), bad)
    async with asyncio.timeout(60):
        assert await h.wait() == 0


# ---- payloads --------------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "data.bin").write_bytes(os.urandom(3000))
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (root / "link").symlink_to("/etc/passwd")


def test_pack_unpack_round_trip(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    data, digest = pack_dir(tmp_path / "src", 1 << 20)
    files = unpack(data, digest, tmp_path / "dst", 1 << 20)
    assert sorted(str(f.relative_to(tmp_path / "dst")) for f in files) == ["pkg/data.bin", "train.py"]
    src_bytes = (tmp_path / "src" / "pkg" / "data.bin").read_bytes()
    assert (tmp_path / "dst" / "pkg" / "data.bin").read_bytes() == src_bytes
    assert not (tmp_path / "dst" / "link").exists()


@pytest.mark.parametrize(("local", "base", "want"), [
    (1, {}, "1"),  # torchrun --nproc-per-node 1 leaves it unset; a shared node's lone rank gets 1
    (2, {}, "1"),  # several ranks on one node: one thread each, as torchrun sets
    (1, {"OMP_NUM_THREADS": "3"}, "3"),  # the daemon's own setting reaches its ranks (ENV_ALLOW)
    (4, {"OMP_NUM_THREADS": "3"}, "3"),
])
def test_rank_threads(local: int, base: dict[str, str], want: str) -> None:
    spec = RankSpec(job_id="j", rank=0, local_rank=0, world_size=local, local_world_size=local,
                    master_addr="127.0.0.1", master_port=29500, gpu_indices=(0,), argv=["x"],
                    workdir=Path("/tmp"), output_dir=Path("/tmp"))
    assert rank_env(spec, base=base).get("OMP_NUM_THREADS") == want


def test_a_rank_hosts_archives_are_stored_not_deflated(tmp_path: Path) -> None:
    """Results and checkpoint parts are packed while (or right after) ranks run: stored gzip blocks,
    which the submitter's unpack reads as before (deflating tensors took 10x the CPU for 26 %)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "zeros.bin").write_bytes(bytes(1 << 20))
    data = collect_results(out, 2 << 20)
    assert len(data) > 1 << 20  # level 6 makes 1 MiB of zeros about 1 KiB
    files = unpack(data, hashlib.sha256(data).hexdigest(), tmp_path / "dst", 2 << 20)
    assert [f.read_bytes() for f in files] == [bytes(1 << 20)]
    packed, _ = pack_dir(out, 2 << 20)  # a job's payload (the client's pack_to) still deflates
    assert len(packed) < 1 << 14


def test_pack_is_deterministic_in_content(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    a, _ = pack_dir(tmp_path / "src", 1 << 20)
    b, _ = pack_dir(tmp_path / "src", 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(a)) as ta, tarfile.open(fileobj=io.BytesIO(b)) as tb:
        assert ta.getnames() == tb.getnames()


def test_pack_size_cap(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    with pytest.raises(LaunchError, match="max_payload_bytes"):
        pack_dir(tmp_path / "src", 1000)
    with pytest.raises(LaunchError, match="not a directory"):
        pack_dir(tmp_path / "missing", 1000)


def test_unpack_rejects_bad_hash_and_oversize(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    data, digest = pack_dir(tmp_path / "src", 1 << 20)
    with pytest.raises(LaunchError, match="hash mismatch"):
        unpack(data[:-1] + bytes([data[-1] ^ 1]), digest, tmp_path / "d1", 1 << 20)
    with pytest.raises(LaunchError, match="over the cap"):
        unpack(data, digest, tmp_path / "d2", len(data) - 1)
    # a zip bomb in miniature: a small archive whose content is over the cap
    (tmp_path / "bomb").mkdir()
    (tmp_path / "bomb" / "zeros").write_bytes(bytes(200_000))
    bomb, bomb_digest = pack_dir(tmp_path / "bomb", 1 << 20)
    assert len(bomb) < 10_000
    with pytest.raises(LaunchError, match="expands past the cap"):
        unpack(bomb, bomb_digest, tmp_path / "d3", 100_000)
    assert not list((tmp_path / "d3").iterdir())


def _evil_tar(entries: list[tarfile.TarInfo], payload: bytes = b"pwned") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in entries:
            if info.isfile():
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([_info("../escape.txt")], "outside"),
        ([_info("a/../../escape.txt")], "outside"),
        ([_info("/tmp/abs.txt")], "outside"),
        ([_info("ln", tarfile.SYMTYPE, "/etc")], "not a plain file"),
        ([_info("hard", tarfile.LNKTYPE, "/etc/passwd")], "not a plain file"),
        ([_info("dev", tarfile.CHRTYPE)], "not a plain file"),
        ([_info("ok.txt"), _info("fifo", tarfile.FIFOTYPE)], "not a plain file"),
    ],
)
def test_unpack_rejects_traversal_and_special_files(
    tmp_path: Path, entries: list[tarfile.TarInfo], message: str
) -> None:
    data = _evil_tar(entries)
    dest = tmp_path / "job"
    with pytest.raises(LaunchError, match=message):
        unpack(data, hashlib.sha256(data).hexdigest(), dest, 1 << 20)
    assert not (tmp_path / "escape.txt").exists()
    assert not list(dest.iterdir())  # nothing written before the checks passed


def test_unpack_rejects_garbage(tmp_path: Path) -> None:
    for data in (b"", b"not a tarball at all", _evil_tar([_info("f")])[:40]):
        with pytest.raises(LaunchError, match="not a valid archive"):
            unpack(data, hashlib.sha256(data).hexdigest(), tmp_path / "g", 1 << 20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(
        st.lists(
            st.from_regex(r"[a-zA-Z0-9_.-]{1,12}", fullmatch=True).filter(lambda s: s not in {".", ".."}),
            min_size=1, max_size=3,
        ).map("/".join),
        st.binary(max_size=200),
        max_size=6,
    )
)
def test_pack_unpack_property(tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes]) -> None:
    src = tmp_path_factory.mktemp("src")
    written: dict[str, bytes] = {}
    for rel, content in files.items():
        path = src / rel
        with contextlib.suppress(OSError):  # a name that is both a file and a directory: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            written[rel] = content
    written = {k: v for k, v in written.items() if (src / k).is_file()}
    data, digest = pack_dir(src, 1 << 20)
    dst = tmp_path_factory.mktemp("dst")
    got = unpack(data, digest, dst, 1 << 20)
    assert {str(p.relative_to(dst)): p.read_bytes() for p in got} == written


async def test_a_lease_expiry_is_reported_even_when_stopping_the_other_ranks_ended_the_supervisor(
    tmp_path: Path,
) -> None:
    """Found by scripts/bench_chaos.py: the supervisor's SIGTERM kills a rank first; the rank host
    stops the attempt's other ranks (torchrun's semantics), which ends the supervisor too.  Asked
    afterwards, the launcher must still say the lease expired, or the attempt is reported as the
    job's own failure (``rank 0 exited -15``) instead of being requeued."""
    launcher = Launcher(tmp_path / "data", term_grace_s=0.5, lease_s=1.5)
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    h = await launcher.launch(spec("j-exp", 0, 1, 1, tmp_path, ["sleep.py"]))
    assert await asyncio.wait_for(h.wait(), 30) == -signal.SIGTERM  # never renewed: killed by the lease
    await launcher.cancel("j-exp", 1)  # the rank host stops the others when a rank dies
    assert await launcher.unsupervise("j-exp", 1)
    assert not await launcher.unsupervise("j-exp", 1)  # told once
    await launcher.close()
