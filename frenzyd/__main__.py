"""``frenzyd --config FILE``: run the daemon in the foreground; signals stop it; errors become exit codes."""

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
    p = argparse.ArgumentParser(prog="frenzyd", description="Frenzy pool daemon (runs in the foreground).")
    p.add_argument("--config", required=True, type=Path, help="TOML config file (see README: configuration)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeatable)")
    return p


async def _amain(config_path: Path) -> None:
    from frenzyd.config import load_config
    from frenzyd.daemon import Daemon

    config = load_config(config_path, os.environ)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Under systemd the journal adds timestamps; elsewhere keep them.
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("INVOCATION_ID") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO - 10 * min(args.verbose, 1), format=fmt, stream=sys.stderr)
    for noisy in ("aiohttp.access", "zeroconf"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        asyncio.run(_amain(args.config))
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
