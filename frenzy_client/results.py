"""Unpacking a job's results on the client: rank 0's files, from a peer, checked before one is written.

The archive comes from rank 0's host, another machine; its compressed size is capped by the
daemons (``[launcher] max_result_bytes``), its expanded size is not.  :func:`extract_results`
reads the tar headers as a stream and refuses, before writing anything, an archive that would
expand past ``max(MIN_EXPANDED_CAP, EXPANSION_RATIO x its size)`` or hold more than ``MAX_FILES``
entries (a 1 MiB gzip of zeros that expands to 1 GiB, a million empty files); links, devices and
paths outside the destination are never written (tarfile's ``data`` filter).  A refused archive
is kept beside the destination, unextracted, for whoever trusts it.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Final

from frenzyd.errors import FrenzyError

MIN_EXPANDED_CAP: Final = 256 * 1024 * 1024
"""Any result archive may expand to this many bytes."""
EXPANSION_RATIO: Final = 16
"""... or to this many times its own size, when that is more (text and logs compress well)."""
MAX_FILES: Final = 100_000
"""Most files and directories one result archive may hold."""
_TAR_BLOCK: Final = 512


class ResultsRefused(FrenzyError):
    """A result archive would expand past its cap or holds too many entries (nothing was written)."""


def expanded_cap(archive_bytes: int) -> int:
    """The most bytes an archive of ``archive_bytes`` may expand to."""
    return max(MIN_EXPANDED_CAP, EXPANSION_RATIO * archive_bytes)


def extract_results(
    data: bytes, dest: Path, *, max_expanded: int | None = None, max_files: int = MAX_FILES
) -> int:
    """Check, then unpack, rank 0's result archive into ``dest``; return the number of files.

    Raises :class:`ResultsRefused` (the archive is saved as ``DEST.refused.tar.gz``) when the
    entries' sizes add up to more than ``max_expanded`` (default :func:`expanded_cap`) or there are
    more than ``max_files`` entries, and :class:`FrenzyError` for an archive that is not one.
    """
    cap = expanded_cap(len(data)) if max_expanded is None else max_expanded
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            kept: list[tarfile.TarInfo] = []
            total = entries = 0
            for m in tf:  # headers as a stream: stop at the first entry over a cap
                entries += 1
                total += _TAR_BLOCK + m.size
                if entries > max_files or total > cap:
                    break
                if m.isfile() or m.isdir():
                    kept.append(m)
            else:
                dest.mkdir(parents=True, exist_ok=True)
                tf.extractall(dest, members=kept, filter="data")
                return sum(1 for m in kept if m.isfile())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FrenzyError(f"result files could not be unpacked into {dest}: {exc}") from None
    kept_at = dest.with_name(dest.name + ".refused.tar.gz")
    try:
        kept_at.parent.mkdir(parents=True, exist_ok=True)
        kept_at.write_bytes(data)
        where = f"; the archive is kept, unextracted, at {kept_at}"
    except OSError:
        where = ""
    what = (f"more than {max_files} entries" if entries > max_files
            else f"more than {cap} bytes from a {len(data)}-byte archive")
    raise ResultsRefused(f"the job's result files were not unpacked: they would expand to {what}{where}")
