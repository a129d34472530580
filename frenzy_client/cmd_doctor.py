"""frenzy-client doctor: check this node's setup and say what is wrong and the fix."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path("/etc/frenzy/frenzyd.toml")
MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def register(sub: Any) -> None:
    """Add ``doctor`` to the client's sub-commands."""
    p = sub.add_parser(
        "doctor",
        help="check this node: config, certificate, interfaces, multicast, peers, clocks, GPUs, disk, ports",
        description="Check this node's setup and print what is wrong and how to fix it. Reads the daemon's "
        "config and credentials (run as root or as the daemon's user), browses mDNS, and reads the daemon's "
        "status from its web port. Exit status 1 when a check fails.",
    )
    p.add_argument("--config", type=Path, default=None,
                   help=f"the daemon's config (default: $FRENZY_CONFIG, else {DEFAULT_CONFIG})")
    p.add_argument("--status-url", metavar="URL",
                   help="the daemon's status JSON (default: http://[web] listen/api/v1/status)")
    p.add_argument("--mdns-seconds", type=float, default=3.0, help="how long to listen for mDNS answers")
    p.add_argument("--json", action="store_true", help='print {"ok": bool, "checks": [...]}')
    p.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from frenzy_client.doctor import run_checks

    config = args.config or Path(os.environ.get("FRENZY_CONFIG") or DEFAULT_CONFIG)
    findings = run_checks(config, status_url=args.status_url, mdns_seconds=args.mdns_seconds)
    failed = any(f.status == "fail" for f in findings)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [f.to_json() for f in findings]}, indent=1))
    else:
        for f in findings:
            print(f"[{MARK.get(f.status, f.status)}] {f.area}: {f.detail}")
            if f.fix and f.status in ("warn", "fail"):
                print(f"       fix: {f.fix}")
        bad = [f for f in findings if f.status in ("warn", "fail")]
        print(f"{len(findings)} checks: {sum(f.status == 'fail' for f in bad)} failed, "
              f"{sum(f.status == 'warn' for f in bad)} warnings")
    return 1 if failed else 0
