"""Child process hosting one job's torch.distributed rendezvous store, bound to one address.

Run by :class:`frenzyd.node.launcher.Launcher` as ``python -m frenzyd.node.rendezvous_store --host H
[--port-min A --port-max B]``.  A ``TCPStore`` given a host name still listens on
every interface, so the socket is bound here and handed over through
``master_listen_fd``.  Ranks connect as clients (``TORCHELASTIC_USE_AGENT_STORE=True``,
as under torchrun's agent; see ``torch/distributed/rendezvous.py:_create_c10d_store``).
The process prints ``PORT <n>`` once listening and lives until its stdin closes
or its parent dies (parent-death signal).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import errno
import os
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent kills us explicitly
        return


def _bind(host: str, port_min: int, port_max: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ports = [0] if port_min == 0 else list(range(port_min, port_max + 1))
    last: OSError | None = None
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno == errno.EADDRINUSE:
                continue
            raise
        sock.listen(1024)
        return sock
    raise OSError(errno.EADDRINUSE, f"no free port in {port_min}-{port_max} on {host}: {last}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frenzyd.node.rendezvous_store")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port-min", type=int, default=0)
    parser.add_argument("--port-max", type=int, default=0)
    parser.add_argument("--expected-parent", type=int, default=0)
    args = parser.parse_args(argv)
    _die_with_parent()
    if args.expected_parent and os.getppid() != args.expected_parent:
        return 3  # the launcher died before the signal was armed
    try:
        sock = _bind(args.host, args.port_min, args.port_max)
    except OSError as exc:
        print(f"ERROR cannot bind the rendezvous store on {args.host}: {exc}", flush=True)
        return 2
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    port = sock.getsockname()[1]
    store = TCPStore(
        args.host,
        port,
        None,
        True,
        datetime.timedelta(seconds=60),
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    print(f"PORT {port}", flush=True)
    # Block until the launcher closes our stdin (job done) or kills us.
    while sys.stdin.buffer.read(4096):
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
