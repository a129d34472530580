"""``frenzy-client owner busy|idle [GPU]``: the workstation owner's word, sent to the local frenzyd."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from frenzy_client.cmd_jobs import _client, _common


def register(sub: Any) -> None:
    p = sub.add_parser(
        "owner",
        help="say that this workstation's owner needs a GPU (busy) or is done with it (idle)",
        description="The owner's own work always wins. 'busy' withholds the GPU (every GPU when none is "
                    "named) from the pool and stops Frenzy's ranks on it: SIGTERM, the grace to checkpoint "
                    "(min of [launcher] stop_grace_s and [owner] vacate_grace_s), then SIGKILL; their jobs "
                    "resume elsewhere from that checkpoint. 'idle' offers it again (after [owner] "
                    "idle_minutes). Allowed to the users in the node's [owner] users and the pool's admins.",
    )
    p.add_argument("state", choices=("busy", "idle"))
    p.add_argument("gpu", nargs="?", type=int, metavar="GPU", help="GPU index on this node (default: all)")
    _common(p)
    p.set_defaults(handler=_owner)


def _owner(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        async with _client(args) as client:
            return await client.owner(args.state, args.gpu)

    out = asyncio.run(go())
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    which = "every GPU" if args.gpu is None else f"GPU {args.gpu}"
    print(f"owner {args.state} on {which} (said by {out.get('by')})")
    for job in out.get("vacated") or ():
        print(f"  stopping job {job} here: it checkpoints and resumes elsewhere")
    for g in out.get("gpus") or ():
        print(f"  GPU {g['index']}: " + ("offered" if g.get("offered") else f"withheld: {g.get('reason')}"))
    return 0
