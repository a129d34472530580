"""frenzy-client pool: create a pool's trust root and enrol nodes (offline; no daemon needed)."""

from __future__ import annotations

import argparse
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
    add.add_argument("--json", action="store_true", help="print the result as JSON")
    add.set_defaults(handler=_add_node)


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
    node = auth.add_node(args.dir, args.name, args.out)
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
