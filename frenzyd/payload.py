"""A job's payload: its directory as a gzip'd tar of plain files, size-capped and hash-checked.

Packed by whoever may read the files -- ``frenzy-client``, running as the user (the daemon never
reads a path on a user's behalf, DESIGN.md §8) -- and by the launcher for rank 0's results;
unpacked by the launcher, which refuses, before writing anything, a wrong hash, an archive over
its cap, absolute or ``..`` paths, links, devices and anything else that is not a plain file or
directory.  Standard library only: the client and the daemon share it.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import IO, Final

from frenzyd.errors import LaunchError

SKIP_DIRS: Final = frozenset({"__pycache__", ".git", "frenzy-results"})
"""Never shipped: caches, git, and ``frenzy-client run``'s own results (./frenzy-results/JOB/)."""


class _CappedSink:
    """A write-only file that hashes and counts what goes through it and refuses to grow past
    ``max_bytes`` (so a payload over the cap fails while it is written, not after)."""

    def __init__(self, out: IO[bytes], max_bytes: int, what: str) -> None:
        self.out, self.max_bytes, self.what = out, max_bytes, what
        self.size = 0
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise LaunchError(f"archive of {self.what} is over the cap of {self.max_bytes} bytes")
        self.sha.update(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def pack_to(out: IO[bytes], path: Path, max_bytes: int, *, only: str | None = None,
            compresslevel: int = 6) -> tuple[int, str]:
    """Write the archive of the plain files under directory ``path`` to ``out`` (or, with
    ``only``, of the one file ``path/only``); return its size and sha256 hex.

    ``compresslevel`` 0 writes stored gzip blocks: still an archive :func:`unpack` reads, for
    tensors that deflate hardly shrinks (a checkpoint: 26 % smaller for 10x the CPU of a copy).

    Symlinks and special files are skipped, as are ``__pycache__``, ``.git`` and
    ``frenzy-results``.  Raises :class:`LaunchError` when the files (uncompressed) or the
    archive exceed ``max_bytes``, or a file cannot be read (with the reason: a directory of
    another user says "Permission denied").
    """
    root = Path(path)
    if not root.is_dir():
        raise LaunchError(f"{root} is not a directory (or you may not read it)")
    sink = _CappedSink(out, max_bytes, str(root / only) if only else str(root))
    total = 0
    try:
        with tarfile.open(fileobj=sink, mode="w:gz", compresslevel=compresslevel) as tar:  # type: ignore[call-overload]
            for full in _files(root, only):
                total += full.stat().st_size
                if total > max_bytes:
                    raise LaunchError(
                        f"{root} holds more than {max_bytes} bytes; ship a smaller directory "
                        "or raise [launcher] max_payload_bytes"
                    )
                info = tar.gettarinfo(str(full), arcname=str(full.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with full.open("rb") as fh:
                    tar.addfile(info, fh)
    except PermissionError as exc:
        raise LaunchError(f"cannot read {exc.filename or root}: permission denied (a job ships only "
                          "files its submitter may read)") from None
    except OSError as exc:
        raise LaunchError(f"cannot pack {root}: {exc}") from None
    return sink.size, sink.sha.hexdigest()


def _files(root: Path, only: str | None) -> list[Path]:
    if only is not None:
        full = root / only
        if "/" in only or only in ("", ".", "..") or full.is_symlink() or not full.is_file():
            raise LaunchError(f"{full} is not a plain file")
        return [full]
    out: list[Path] = []

    def fail(exc: OSError) -> None:
        raise exc

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not Path(dirpath, d).is_symlink())
        for name in sorted(filenames):
            full = Path(dirpath, name)
            if full.is_symlink() or not full.is_file():
                continue
            out.append(full)
    return out


def pack_dir(path: Path, max_bytes: int, *, compresslevel: int = 6) -> tuple[bytes, str]:
    """A gzip'd tar of the plain files under ``path`` and its sha256 hex (:func:`pack_to`, in memory)."""
    buf = io.BytesIO()
    _, sha = pack_to(buf, path, max_bytes, compresslevel=compresslevel)
    return buf.getvalue(), sha


def private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (a job's run directories are its own:
    other local users must not list or read them); an existing ``path`` is made 0700 too."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)


def unpack(data: bytes, sha256hex: str, dest: Path, max_bytes: int) -> list[Path]:
    """Check and extract a :func:`pack_dir` archive into ``dest``; return the files written.

    Rejects (with :class:`LaunchError`, before writing anything) a wrong hash, an
    archive or content over ``max_bytes``, absolute or ``..`` paths, links,
    devices and anything else that is not a plain file or directory.
    """
    if len(data) > max_bytes:
        raise LaunchError(f"payload of {len(data)} bytes is over the cap of {max_bytes}")
    if hashlib.sha256(data).hexdigest() != sha256hex:
        raise LaunchError("payload hash mismatch: the archive was altered or truncated in transit")
    dest = Path(dest)
    private_dir(dest)
    root = dest.resolve()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members: list[tarfile.TarInfo] = []
            total = 0
            for m in tar:  # headers as a stream: a bomb is refused at its first header over the cap
                members.append(m)
                if not (m.isfile() or m.isdir()):
                    raise LaunchError(f"payload entry {m.name!r} is not a plain file or directory")
                target = (root / m.name).resolve()
                if m.name.startswith("/") or ".." in Path(m.name).parts or not target.is_relative_to(root):
                    raise LaunchError(f"payload entry {m.name!r} points outside the job directory")
                total += m.size
                if total > max_bytes:
                    raise LaunchError(f"payload expands past the cap of {max_bytes} bytes")
            tar.extractall(root, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise LaunchError(f"payload is not a valid archive: {exc}") from exc
    return [root / m.name for m in members if m.isfile()]
