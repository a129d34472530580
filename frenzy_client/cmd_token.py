"""``frenzy-client token issue|revoke USER`` and ``frenzy-client whoami``: per-user API tokens.

Over TCP (``[client] listen = "127.0.0.1:PORT"``) the daemon knows a user by their own token;
an admin (root, the daemon's user, a member of ``[client] admin_group``) issues it, and the user
keeps it in ``~/.config/frenzy/token`` (0600).  On the unix socket no token is needed: the
daemon asks the kernel who is calling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from frenzy_client.cmd_jobs import _client, _common


def register(sub: Any) -> None:
    p = sub.add_parser(
        "token", help="issue or revoke a user's API token for a TCP daemon (admins)",
        description="Issue (or replace) a local user's API token, or revoke it. Only admins may: root, "
                    "the daemon's user, or members of the daemon's [client] admin_group. Give the printed "
                    "token to the user, who keeps it in ~/.config/frenzy/token (mode 0600), e.g. "
                    "'frenzy-client token issue alice | sudo -u alice sh -c \"umask 077; mkdir -p "
                    "~/.config/frenzy && cat > ~/.config/frenzy/token\"'. The daemon keeps only its hash.",
    )
    p.add_argument("action", choices=("issue", "revoke"))
    p.add_argument("user", metavar="USER", help="a local user of the daemon's machine")
    _common(p)
    p.set_defaults(handler=_token)

    p = sub.add_parser("whoami", help="who the daemon takes you for (user, uid, admin or not)")
    _common(p)
    p.set_defaults(handler=_whoami)


def _token(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        async with _client(args) as client:
            if args.action == "issue":
                return await client.issue_token(args.user)
            return await client.revoke_token(args.user)

    out = asyncio.run(go())
    if args.json:
        print(json.dumps(out, indent=1))
    elif args.action == "issue":
        print(out["token"])
    else:
        print(f"revoked the API token of {out['user']}")
    return 0


def _whoami(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        async with _client(args) as client:
            return await client.whoami()

    out = asyncio.run(go())
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    role = "an admin" if out.get("admin") else "a user (your own jobs only)"
    print(f"{out.get('user')} (uid {out.get('uid')}), {role}, known by {out.get('how')}")
    return 0
