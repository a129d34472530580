"""``frenzyd --config FILE``: run the daemon in the foreground; signals stop it; errors become exit codes.

``frenzyd enroll BUNDLE``: install a node's credentials bundle (``pool add-node --bundle``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from frenzyd.errors import FrenzyError

EXIT_CONFIG = 2
EXIT_ERROR = 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="frenzyd", description="Frenzy pool daemon (runs in the foreground). 'frenzyd enroll BUNDLE' "
        "installs a node's credentials (see 'frenzyd enroll -h').")
    p.add_argument("--config", required=True, type=Path, help="TOML config file (see README: configuration)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeatable)")
    return p


async def _amain(config_path: Path, verbose: int = 0) -> None:
    from frenzyd import logs
    from frenzyd.config import load_config
    from frenzyd.daemon import Daemon

    config = load_config(config_path, os.environ)
    # From here on, lines take the config's format ([log] format = "json": one object per event).
    logs.configure(config.log.format, logging.DEBUG if verbose else logs.LEVELS[config.log.level],
                   timestamps=not os.environ.get("INVOCATION_ID"))
    daemon = Daemon(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            logging.getLogger("frenzyd").info("%s: stopping", signal.Signals(signum).name)
            stop.set()
        else:  # a second signal: stop now, without the graceful part
            logging.getLogger("frenzyd").warning("second signal: exiting at once")
            os._exit(130)

    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, on_signal, s)
    await daemon.run(stop)


DEFAULT_CREDENTIALS = Path("/etc/frenzy/node")


def _enroll_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="frenzyd enroll",
        description="Install a node bundle made by 'frenzy-client pool add-node POOL NAME --bundle FILE' "
        "as this node's credentials directory (0700, files 0600, owned by the daemon's user).")
    p.add_argument("bundle", type=Path, metavar="BUNDLE")
    p.add_argument("--dest", type=Path, metavar="DIR",
                   help="credentials directory (default: [pool] credentials of --config, "
                   "else /etc/frenzy/node)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the daemon's config, for its [pool] credentials")
    p.add_argument("--owner", metavar="USER",
                   help="owner of the files (default as root: the 'frenzy' user when it exists; else you)")
    p.add_argument("--force", action="store_true",
                   help="replace existing credentials, also those of another pool")
    return p


def _enroll(argv: Sequence[str]) -> int:
    import pwd
    import tomllib

    from frenzyd.net import bundle

    args = _enroll_parser().parse_args(argv)
    dest: Path = args.dest or DEFAULT_CREDENTIALS
    if args.dest is None and args.config is not None:
        try:
            doc = tomllib.loads(args.config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            print(f"frenzyd enroll: error: cannot read {args.config}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        dest = Path(str(doc.get("pool", {}).get("credentials", DEFAULT_CREDENTIALS)))
    owner: tuple[int, int] | None = None
    user = args.owner or ("frenzy" if os.geteuid() == 0 else None)
    if user is not None:
        try:
            pw = pwd.getpwnam(user)
            owner = (pw.pw_uid, pw.pw_gid)
        except KeyError:
            if args.owner is not None:
                print(f"frenzyd enroll: error: no user {user!r} (the daemon's user; see scripts/install)",
                      file=sys.stderr)
                return EXIT_CONFIG
    try:
        current = bundle.installed_pool(dest)
        b = bundle.read_bundle(args.bundle, expect_pool=None if args.force else current)
        bundle.install_bundle(b, dest, owner=owner, force=args.force)
    except FrenzyError as exc:
        print(f"frenzyd enroll: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except PermissionError as exc:
        print(f"frenzyd enroll: error: {exc}: run it as root (sudo frenzyd enroll ...)", file=sys.stderr)
        return EXIT_ERROR
    who = f"owned by {user}" if owner is not None else "owned by you"
    if owner is None and os.geteuid() == 0:
        who += ": no 'frenzy' user here; if frenzyd runs as another user, run again with --owner USER --force"
    print(f"installed node {b.node_name} (id {b.node_id}) of pool {b.pool_id[:16]}… in {dest} ({who}; "
          f"certificate valid until {b.not_after:%Y-%m-%d})")
    print(f"next: set [pool] credentials = \"{dest}\" in the config, then: systemctl restart frenzyd; "
          "delete the bundle file")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["enroll"]:
        return _enroll(argv[1:])
    args = _parser().parse_args(argv)
    from frenzyd import logs

    # Until the config is read: text lines. Under systemd the journal adds timestamps.
    logs.configure("text", logging.DEBUG if args.verbose else logging.INFO,
                   timestamps=not os.environ.get("INVOCATION_ID"))
    try:
        asyncio.run(_amain(args.config, args.verbose))
    except FrenzyError as exc:
        return _report(exc)
    except BaseExceptionGroup as group:
        # Raised inside the daemon's task group: our errors get one line each, no traceback.
        leaves = _leaves(group)
        if not all(isinstance(exc, FrenzyError) for exc in leaves):
            raise
        return max(_report(exc) for exc in leaves if isinstance(exc, FrenzyError))
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # the environment refused something at start (a directory, a file)
        logging.getLogger("frenzyd").debug("start-up failed", exc_info=True)
        print(f"frenzyd: error: {exc} (run with -v for the traceback)", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _report(exc: FrenzyError) -> int:
    print(f"frenzyd: error: {exc}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(exc, ValueError) else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
