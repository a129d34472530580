"""``python -m frenzyd.trainer.control_exec CHANNEL -- COMMAND...``: run a command with its control channel.

The rank host of a checkpointable script job (``run --checkpointable``) makes
CHANNEL, a named pipe it already reads, and starts each rank through this
module: it opens the pipe for writing (non-blocking: a daemon that reads
behind drops progress, it never stalls a rank), exports the descriptor as
``FRENZY_CONTROL_FD`` and ``exec``s COMMAND in its place (a leading ``*.py``
runs under this Python, as the launcher does).  The descriptor survives any
``exec`` the script does, so a shell script can ``echo`` JSON lines to it too.
When the pipe cannot be opened the command runs without the channel (a
warning on stderr): its reports are lost, its checkpoints still travel.
"""

from __future__ import annotations

import os
import sys


def open_channel(path: str) -> int | None:
    """The write end of the pipe at ``path``, non-blocking and inheritable; None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        print(f"frenzyd.trainer.control_exec: control channel {path} not opened ({exc}); progress and "
              "checkpoint reports go nowhere", file=sys.stderr, flush=True)
        return None
    os.set_inheritable(fd, True)
    return fd


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m frenzyd.trainer.control_exec CHANNEL -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    path, command = argv[0], argv[2:]
    fd = open_channel(path)
    if fd is not None:
        os.environ["FRENZY_CONTROL_FD"] = str(fd)
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"frenzyd.trainer.control_exec: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
