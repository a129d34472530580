"""Argument parsing for ``frenzy-client``: one sub-command module per area, errors mapped once."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from frenzyd.errors import FrenzyError

# Each module exposes ``register(subparsers)``, which adds its sub-commands and
# sets ``handler`` (args -> exit code) on each.
_COMMAND_MODULES = (
    "frenzy_client.cmd_predict",
    "frenzy_client.cmd_simulate",
    "frenzy_client.cmd_pool",
    "frenzy_client.cmd_doctor",
    "frenzy_client.cmd_jobs",
    "frenzy_client.cmd_owner",
    "frenzy_client.cmd_token",
)

EXIT_ERROR = 1
EXIT_USAGE = 2
"""argparse's status for a bad command line; also flags that do not go together (``UsageError``)."""


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="frenzy-client",
        description=(
            "Frenzy: train language models on a lab's pooled, mixed GPUs. "
            "predict and simulate run offline; run/status/jobs/logs/cancel talk to the local frenzyd."
        ),
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def run_cli(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from frenzy_client.trainer_job import UsageError

    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit (where it would print a traceback)
    except BrokenPipeError:
        return _stdout_closed()
    except UsageError as exc:
        print(f"frenzy-client {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FrenzyError as exc:
        print(f"frenzy-client: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("frenzy-client: interrupted", file=sys.stderr)
        return 130
    return code


EXIT_PIPE = 128 + 13
"""The reader of stdout went away (``status | head``): exit as a process killed by SIGPIPE would."""


def _stdout_closed() -> int:
    """Quietly end a command whose stdout reader closed the pipe: point stdout at /dev/null so the
    interpreter's final flush does not fail again, and exit with SIGPIPE's status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE
