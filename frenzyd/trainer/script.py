"""The checkpoint contract for a user's own training loop (``frenzy-client run --checkpointable``).

DESIGN.md §8: a checkpointable script is stopped with SIGTERM (preemption by
the scheduler, the GPU owner's reclaim, a daemon shutdown), has
``FRENZY_STOP_GRACE_S`` seconds to write a checkpoint under
``FRENZY_CHECKPOINT_DIR`` and exit, and is started again later - maybe on
other GPUs or nodes - with that checkpoint in its new ``FRENZY_CHECKPOINT_DIR``.
:class:`Checkpointable` is that contract in a few calls (no torch here: save
your state with whatever you like)::

    ck = Checkpointable()                    # SIGTERM now sets ck.stop_requested
    start = 0
    if (found := ck.latest()) is not None:   # a resumed attempt
        state = torch.load(found.path / "state.pt"); start = found.step
    for step in range(start, steps):
        ...train one step...
        ck.report(step + 1, loss)            # progress: the scheduler's remaining work
        if ck.stop_requested or (step + 1) % 50 == 0:
            with ck.saving(step + 1) as d:   # a fresh directory; complete when the block ends
                torch.save(state, d / "state.pt")
        if ck.stop_requested:
            raise SystemExit(ck.EXIT_STOPPED)

Layout (the daemon's): ``FRENZY_CHECKPOINT_DIR/step-NNNNNNNN/`` holding your
files and a ``COMPLETE`` marker written last; only the newest complete one is
kept and the rank host sends it to the job's submitter (a full disk or a bad
hash keeps the previous one).  With several ranks, the ranks must agree on when
to stop (e.g. all-reduce ``stop_requested`` each step, see
``frenzyd/examples/checkpointable_ddp.py``), and each host's ``LOCAL_RANK`` 0
must save (each host's directory is that host's part of the checkpoint; for
DDP, the replicated state).  Outside Frenzy (no ``FRENZY_CHECKPOINT_DIR``),
``latest`` is None and ``saving`` raises ``ConfigError``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzyd.errors import ConfigError
from frenzyd.trainer.control import checkpoint_complete
from frenzyd.trainer.control import report as report_progress

MARKER = "COMPLETE"
"""Written last in a checkpoint directory; the daemon sends only directories that have it."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: the step it holds and its directory."""

    step: int
    path: Path


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def latest(root: str | Path | None) -> Checkpoint | None:
    """The newest complete checkpoint under ``root`` (None when there is none)."""
    if root is None or not Path(root).is_dir():
        return None
    best: Checkpoint | None = None
    for p in Path(root).glob("step-*"):
        n = p.name.removeprefix("step-")
        if n.isdigit() and (p / MARKER).is_file() and (best is None or int(n) > best.step):
            best = Checkpoint(int(n), p)
    return best


class Checkpointable:
    """A script's side of the checkpoint contract (see the module docstring)."""

    EXIT_STOPPED = 143
    """The exit status of a rank stopped by SIGTERM (128 + 15), as the built-in trainer's."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, handle_sigterm: bool = True) -> None:
        env = os.environ if environ is None else environ
        root = env.get("FRENZY_CHECKPOINT_DIR")
        self.checkpoint_dir: Path | None = Path(root) if root else None
        grace = env.get("FRENZY_STOP_GRACE_S")
        try:
            self.stop_grace_s: float | None = float(grace) if grace else None
        except ValueError:
            raise ConfigError(f"FRENZY_STOP_GRACE_S={grace!r} is not a number of seconds") from None
        self.attempt = int(env.get("FRENZY_ATTEMPT", "1") or 1)
        self.local_rank = int(env.get("LOCAL_RANK", "0") or 0)
        self.stop_requested = False
        """Set by SIGTERM: checkpoint and exit within ``stop_grace_s``."""
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self.request_stop)

    def request_stop(self, *_: Any) -> None:
        """What SIGTERM does: the loop sees ``stop_requested`` at its next check."""
        self.stop_requested = True

    def latest(self) -> Checkpoint | None:
        """The checkpoint to resume from: the newest complete one in ``FRENZY_CHECKPOINT_DIR``."""
        return latest(self.checkpoint_dir)

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[Path]:
        """A fresh directory to write checkpoint ``step`` into; when the block ends without an
        error it becomes ``step-NNNNNNNN`` with its ``COMPLETE`` marker, older checkpoints are
        removed and the daemon is told (``checkpoint_complete``).  An error leaves the previous
        checkpoint as it was."""
        if self.checkpoint_dir is None:
            raise ConfigError("no FRENZY_CHECKPOINT_DIR: submit the script with 'frenzy-client run "
                              "--checkpointable' (outside Frenzy, save where you like)")
        if isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative integer, not {step!r}")
        root = self.checkpoint_dir
        root.mkdir(parents=True, exist_ok=True)
        final = root / step_dir_name(step)
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / MARKER).write_text(f"{step}\n")
        if final.exists():
            old = root / f".old-{final.name}-{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        for other in root.glob("step-*"):
            if other.name < final.name:
                shutil.rmtree(other, ignore_errors=True)
        checkpoint_complete(step, str(final))

    def report(self, step: int, loss: float, **extra: Any) -> bool:
        """Progress for the daemon (``frenzyd.trainer.report``): the scheduler counts the steps
        done against ``--steps``.  Call it on rank 0 (other ranks' reports are kept, not used)."""
        return report_progress(step, loss, **extra)
