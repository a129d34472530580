"""frenzy-client pool: create a pool's trust root, enrol and remove nodes.

``init`` and ``add-node`` are offline.  ``remove-node`` signs a new revocation list offline, then
hands it to a daemon (``--daemon``, default the local one), which passes it to every member;
``push-revocations`` hands an existing list to a daemon (from a machine that is not a member)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from frenzyd.net import auth, bundle


def register(sub: Any) -> None:
    """Add ``pool init`` and ``pool add-node`` to the client's sub-commands."""
    p = sub.add_parser("pool", help="create the pool CA and enrol nodes (run once, by the lab admin)")
    psub = p.add_subparsers(dest="pool_command", metavar="POOL_COMMAND", required=True)

    init = psub.add_parser(
        "init",
        help="create a new pool CA in DIR",
        description="Create the pool's trust root (an Ed25519 CA) in DIR: ca.pem (public, copied to "
        "every node) and ca.key (secret: keep it on the admin's machine, not on the peers).",
    )
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument("--name", help="pool name written into the CA certificate (default: DIR's name)")
    init.add_argument("--json", action="store_true", help="print the result as JSON")
    init.set_defaults(handler=_init)

    add = psub.add_parser(
        "add-node",
        help="enrol node NAME: write its key and certificate",
        description="Create a key and a CA-signed certificate for node NAME. The output directory "
        "(ca.pem, node.pem, node.key, node.json) is what the node's [pool] credentials points to; "
        "copy it to the node (e.g. /etc/frenzy/node, readable only by the frenzyd user).",
    )
    add.add_argument("dir", type=Path, metavar="DIR", help="the pool directory made by 'pool init'")
    add.add_argument("name", metavar="NAME", help="node name, e.g. ws-01 (letters, digits, . _ -)")
    add.add_argument("--out", type=Path, metavar="PATH", help="output directory (default: DIR/nodes/NAME)")
    add.add_argument("--bundle", type=Path, metavar="FILE",
                     help="also write the credentials as one file (mode 0600) to copy to the node and "
                     "install there with 'sudo frenzyd enroll FILE'")
    add.add_argument("--days", type=int, default=auth.NODE_VALID_DAYS,
                     help=f"certificate lifetime in days (default {auth.NODE_VALID_DAYS}; renew it with "
                     "'pool renew-node')")
    add.add_argument("--json", action="store_true", help="print the result as JSON")
    add.set_defaults(handler=_add_node)

    renew = psub.add_parser(
        "renew-node",
        help="re-issue a node's certificate for the same key (it keeps its node id)",
        description="Issue a new certificate for the key of NODE_CERT (a node.pem, or the credentials "
        "directory holding it; an expired one is fine), valid --days from now, and write it in place "
        "of the old one (or to --out). Only the public key is read: the node's private key never leaves "
        "the node. Copy the new node.pem into the node's [pool] credentials directory and restart "
        "frenzyd there.",
    )
    renew.add_argument("dir", type=Path, metavar="DIR",
                       help="the pool directory made by 'pool init' (ca.key)")
    renew.add_argument("node_cert", type=Path, metavar="NODE_CERT", help="node.pem or its directory")
    renew.add_argument("--out", type=Path, metavar="FILE", help="write the new certificate here instead")
    renew.add_argument("--days", type=int, default=auth.NODE_VALID_DAYS,
                       help=f"lifetime in days (default {auth.NODE_VALID_DAYS})")
    renew.add_argument("--json", action="store_true", help="print the result as JSON")
    renew.set_defaults(handler=_renew_node)

    rm = psub.add_parser(
        "remove-node",
        help="revoke node NODE: sign a new revocation list and give it to the pool",
        description="Remove NODE from the pool: add it to the CA-signed revocation list in "
        "DIR/revocations.json (version + 1), then give the list to the daemon (--daemon, default the "
        "local one), which passes it to every member. Every member then refuses the node's TLS "
        "connections and messages and forgets it. NODE is the name given to add-node (every "
        "certificate issued under it), a node id, or the path of its node.pem.",
    )
    rm.add_argument("dir", type=Path, metavar="DIR", help="the pool directory made by 'pool init' (ca.key)")
    rm.add_argument("nodes", nargs="+", metavar="NODE", help="node name, node id, or path of its node.pem")
    rm.add_argument("--no-push", action="store_true",
                    help="only write DIR/revocations.json (give it to a member later with push-revocations)")
    _daemon_args(rm)
    rm.set_defaults(handler=_remove_node)

    push = psub.add_parser(
        "push-revocations",
        help="give a revocation list (revocations.json) to a daemon, which passes it on",
        description="Hand FILE, a revocation list written by 'pool remove-node', to a member's daemon. "
        "The list is signed by the pool CA: a daemon takes it only if it is newer than its own.",
    )
    push.add_argument("file", type=Path, metavar="FILE")
    _daemon_args(push)
    push.set_defaults(handler=_push)


def _daemon_args(p: argparse.ArgumentParser) -> None:
    from frenzy_client.cmd_jobs import _common

    _common(p)


def _init(args: argparse.Namespace) -> int:
    info = auth.create_pool(args.dir, name=args.name)
    if args.json:
        out = {"pool_dir": str(info.pool_dir), "pool_id": info.pool_id, "ca_cert": str(info.ca_cert)}
        print(json.dumps(out))
    else:
        print(f"created pool {info.pool_id[:16]}… in {info.pool_dir}")
        print(f"  CA certificate: {info.ca_cert}")
        print(f"  CA key:         {info.pool_dir / auth.CA_KEY_FILE}  (secret; keep it off the peers)")
        print(f"next: frenzy-client pool add-node {info.pool_dir} NODE_NAME")
    return 0


def _add_node(args: argparse.Namespace) -> int:
    if args.bundle is not None and args.bundle.exists():  # before a key is made for nothing
        raise bundle.BundleError(f"{args.bundle} exists; choose another --bundle file")
    auth.check_valid_days(args.days)
    node = auth.add_node(args.dir, args.name, args.out, valid_days=args.days)
    bundle_path = bundle.write_bundle(node.out_dir, args.bundle) if args.bundle is not None else None
    if args.json:
        out = {"node_id": node.node_id, "node_name": node.node_name, "pool_id": node.pool_id,
               "credentials": str(node.out_dir), "bundle": str(bundle_path) if bundle_path else None}
        print(json.dumps(out))
    else:
        print(f"enrolled node {node.node_name} (id {node.node_id}) in pool {node.pool_id[:16]}…")
        print(f"  credentials: {node.out_dir}  (copy to the node; set [pool] credentials to it)")
        if bundle_path is not None:
            print(f"  bundle:      {bundle_path}  (secret; copy it to {node.node_name}, then there: "
                  f"sudo frenzyd enroll {bundle_path.name}; delete it afterwards)")
    return 0


def _check_not_removed(pool_dir: Path, node_cert: Path) -> None:
    """ConfigError when the pool's revocation list names the node: renewing would not bring it back."""
    from frenzyd.errors import AuthError, ConfigError
    from frenzyd.net import revocation

    path = node_cert / auth.NODE_CERT_FILE if node_cert.is_dir() else node_cert
    try:
        ca = (pool_dir / auth.CA_FILE).read_bytes()
        removed = revocation.read_file(ca, pool_dir / revocation.REVOCATIONS_FILE)
        node_id, name = auth.verify_node_cert(ca, path.read_bytes())
    except (OSError, AuthError):
        return  # renew_node says what is wrong with the pool directory or the certificate
    if removed is not None and removed.revokes(node_id):
        raise ConfigError(f"node {name} ({node_id}) was removed from the pool (revocation list version "
                          f"{removed.version}): a certificate for its key would be refused too; enrol it "
                          f"again under a new key: frenzy-client pool add-node {pool_dir} NAME")


def _renew_node(args: argparse.Namespace) -> int:
    _check_not_removed(args.dir, args.node_cert)
    cert = auth.renew_node(args.dir, args.node_cert, out=args.out, valid_days=args.days)
    if args.json:
        print(json.dumps({"node_id": cert.node_id, "node_name": cert.node_name, "certificate": str(cert.path),
                          "not_after": cert.not_after.isoformat()}))
    else:
        print(f"renewed the certificate of node {cert.node_name} (id {cert.node_id}, unchanged): "
              f"{cert.path}, valid until {cert.not_after:%Y-%m-%d}")
        print(f"next: copy it to the node's [pool] credentials directory as {auth.NODE_CERT_FILE} and "
              "restart frenzyd there")
    return 0


def _push_list(args: argparse.Namespace, data: bytes) -> dict[str, Any]:
    from frenzy_client.cmd_jobs import _client

    doc = json.loads(data)

    async def go() -> dict[str, Any]:
        async with _client(args) as client:
            return await client.push_revocations(doc)

    return asyncio.run(go())


def _remove_node(args: argparse.Namespace) -> int:
    from frenzyd.errors import FrenzyError
    from frenzyd.net import revocation

    lst = revocation.revoke(args.dir, args.nodes)
    path = args.dir / revocation.REVOCATIONS_FILE
    pushed: dict[str, Any] | None = None
    push_error = None
    if not args.no_push:
        try:
            pushed = _push_list(args, lst.file_bytes())
        except FrenzyError as exc:
            push_error = str(exc)
    if args.json:
        print(json.dumps({"version": lst.version, "file": str(path),
                          "removed": [n.to_dict() for n in lst.nodes], "pushed": pushed,
                          "push_error": push_error}))
    else:
        print(f"revocation list version {lst.version} written to {path}; removed from the pool:")
        for n in lst.nodes:
            print(f"  {n.name or '?':<20} {n.node_id}  (since {n.revoked_at})")
        if pushed is not None:
            print(f"given to the daemon (its list is now version {pushed.get('version')}); it passes it "
                  "to every member")
        elif args.no_push:
            print(f"next: frenzy-client pool push-revocations {path} --daemon ADDRESS (on any member)")
    if push_error is not None:
        print(f"could not give the list to a daemon: {push_error}\nthe list is written; give it to any "
              f"member with: frenzy-client pool push-revocations {path} [--daemon ADDRESS]")
        return 1
    return 0


def _push(args: argparse.Namespace) -> int:
    from frenzyd.errors import ConfigError

    try:
        data = args.file.read_bytes()
        json.loads(data)
    except OSError as exc:
        raise ConfigError(f"cannot read {args.file}: {exc.strerror}") from None
    except ValueError:
        raise ConfigError(f"{args.file} is not a revocation list (not JSON)") from None
    out = _push_list(args, data)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"the daemon's revocation list is now version {out.get('version')} "
              f"({'adopted' if out.get('adopted') else 'it had this one or a newer one already'})")
    return 0
