"""A node's enrolment as one file: made by ``pool add-node --bundle``, installed by ``frenzyd enroll``.

The bundle is JSON (mode 0600: it holds the node's private key)::

    {"format": "frenzy-node-bundle", "version": 1,
     "node_name": str, "node_id": str, "pool_id": str,
     "files": {"ca.pem": str, "node.pem": str, "node.key": str, "node.json": str}}

Installing it writes the credentials directory of DESIGN §6 (``[pool] credentials``): the
directory 0700 and every file 0600, owned by the daemon's user.  Every check that can fail says
what to do: not a bundle, a certificate the bundled CA did not sign, a key that is not the
certificate's, an expired or not yet valid certificate, or a bundle of another pool than the one
the destination (or ``expect_pool``) belongs to.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from frenzyd.errors import AuthError, ConfigError
from frenzyd.net import auth

BUNDLE_FORMAT: Final = "frenzy-node-bundle"
BUNDLE_VERSION: Final = 1
MAX_BUNDLE_BYTES: Final = 1 << 20
FILES: Final = (auth.CA_FILE, auth.NODE_CERT_FILE, auth.NODE_KEY_FILE, auth.NODE_INFO_FILE)
MAKE_ONE: Final = ("make one with 'frenzy-client pool add-node POOL_DIR NAME --bundle FILE' on the admin's "
                   "machine")


class BundleError(ConfigError):
    """A bundle that cannot be installed; the message says why and what to do."""


@dataclass(frozen=True)
class NodeBundle:
    """A checked bundle: ids, validity, and the files to write."""

    node_name: str
    node_id: str
    pool_id: str
    not_before: dt.datetime
    not_after: dt.datetime
    files: dict[str, bytes] = field(repr=False)


def bundle_bytes(cred_dir: Path) -> bytes:
    """The bundle of a credentials directory written by :func:`auth.add_node` (checked first)."""
    creds = auth.load_credentials(cred_dir)
    files = {name: (Path(cred_dir) / name).read_text() for name in FILES}
    doc = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "node_name": creds.node_name,
           "node_id": creds.node_id, "pool_id": creds.pool_id, "files": files}
    return (json.dumps(doc, indent=1) + "\n").encode()


def write_bundle(cred_dir: Path, path: Path) -> Path:
    """Write the bundle of ``cred_dir`` to ``path`` (mode 0600; never over an existing file)."""
    data = bundle_bytes(cred_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise BundleError(f"{path} exists; choose another --bundle file (it holds a private key: "
                          "delete old bundles once they are installed)") from exc
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(path)


def parse_bundle(data: bytes, *, source: str = "the bundle", now: dt.datetime | None = None,
                 expect_pool: str | None = None) -> NodeBundle:
    """Check a bundle's bytes; raise :class:`BundleError` saying what is wrong and what to do."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{source} is {len(data)} bytes, not a Frenzy node bundle ({MAKE_ONE})")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{source} is not a Frenzy node bundle (not JSON); {MAKE_ONE}") from exc
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{source} is not a Frenzy node bundle (no \"format\": \"{BUNDLE_FORMAT}\"); "
                          f"{MAKE_ONE}")
    if doc.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{source} is a version {doc.get('version')!r} bundle; this frenzyd reads "
                          f"version {BUNDLE_VERSION}: enrol with the same Frenzy release on both machines")
    raw = doc.get("files")
    if not isinstance(raw, dict) or not all(isinstance(raw.get(f), str) for f in FILES):
        raise BundleError(f"{source} lacks some of {', '.join(FILES)}; {MAKE_ONE}")
    files = {f: str(raw[f]).encode() for f in FILES}
    ca, cert, key = files[auth.CA_FILE], files[auth.NODE_CERT_FILE], files[auth.NODE_KEY_FILE]
    try:
        pool_id = auth.pool_id_of(ca)
        node_id, name = auth.verify_node_cert(ca, cert)
    except AuthError as exc:
        raise BundleError(f"{source}: the node certificate does not belong to the CA in the bundle "
                          f"({exc}); it was altered or put together from two pools: {MAKE_ONE}") from exc
    if not auth.key_matches_cert(key, cert):
        raise BundleError(f"{source}: node.key is not the key of node.pem (the bundle was altered or "
                          f"assembled from two enrolments); {MAKE_ONE}")
    try:
        info = json.loads(files[auth.NODE_INFO_FILE])
    except json.JSONDecodeError as exc:
        raise BundleError(f"{source}: node.json is not JSON; {MAKE_ONE}") from exc
    info = info if isinstance(info, dict) else {}
    claimed = (doc.get("node_id"), doc.get("pool_id"), info.get("node_id"), info.get("pool_id"))
    if claimed != (node_id, pool_id, node_id, pool_id):
        raise BundleError(f"{source}: its node/pool ids do not match its certificates; {MAKE_ONE}")
    not_before, not_after = auth.certificate_dates(cert)
    now = now or dt.datetime.now(dt.UTC)
    if now > not_after:
        raise BundleError(f"{source}: the certificate of node {name} expired on "
                          f"{not_after:%Y-%m-%d %H:%M} UTC; enrol the node again: {MAKE_ONE}")
    if now < not_before:
        raise BundleError(f"{source}: the certificate of node {name} is valid only from "
                          f"{not_before:%Y-%m-%d %H:%M} UTC; check this machine's clock (timedatectl)")
    if expect_pool is not None and expect_pool != pool_id:
        raise BundleError(f"{source} is for pool {pool_id[:16]}…, but this node belongs to pool "
                          f"{expect_pool[:16]}…: enrol it with the CA of its own pool, or pass --force "
                          "to move the node to the bundle's pool")
    return NodeBundle(node_name=name, node_id=node_id, pool_id=pool_id, not_before=not_before,
                      not_after=not_after, files=files)


def read_bundle(path: Path, *, now: dt.datetime | None = None, expect_pool: str | None = None) -> NodeBundle:
    """Read and check the bundle at ``path`` (see :func:`parse_bundle`)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except FileNotFoundError as exc:
        raise BundleError(f"no bundle at {path}; {MAKE_ONE}") from exc
    except IsADirectoryError as exc:
        raise BundleError(f"{path} is a directory: point [pool] credentials at it, or pass the bundle "
                          "file that 'pool add-node --bundle' wrote") from exc
    except PermissionError as exc:
        raise BundleError(f"cannot read {path}: run 'frenzyd enroll' as root (sudo)") from exc
    return parse_bundle(data, source=str(path), now=now, expect_pool=expect_pool)


def installed_pool(dest: Path) -> str | None:
    """The pool id of the credentials already in ``dest`` (None when there are none)."""
    try:
        return auth.pool_id_of((Path(dest) / auth.CA_FILE).read_bytes())
    except (FileNotFoundError, NotADirectoryError, AuthError):
        return None


def install_bundle(bundle: NodeBundle, dest: Path, *, owner: tuple[int, int] | None = None,
                   force: bool = False) -> Path:
    """Write ``bundle`` as the credentials directory ``dest`` (0700, files 0600, owned by ``owner``).

    Refuses to replace a directory that already holds a node key unless ``force`` (the node
    would get a new id); the new directory is complete before it takes the old one's place.
    """
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"{dest} exists and is not a directory; choose another --dest")
    if (dest / auth.NODE_KEY_FILE).exists() and not force:
        raise BundleError(f"{dest} already holds a node's credentials; pass --force to replace them "
                          "(the node gets the bundle's id)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name, data in bundle.files.items():
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if owner is not None:
                os.chown(tmp / name, *owner)
        os.chmod(tmp, 0o700)
        if owner is not None:
            os.chown(tmp, *owner)
        auth.load_credentials(tmp)  # what the daemon will do at start
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
