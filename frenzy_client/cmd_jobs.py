"""frenzy-client jobs commands (scaffold: replaced by the issue that builds them)."""

from __future__ import annotations

import argparse
from typing import Any

from frenzyd.errors import FrenzyError


def register(sub: Any) -> None:
    p = sub.add_parser("jobs", help="(not built yet)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    raise FrenzyError("'jobs' is not built yet")
