"""Daemon test fixtures: a pool with enrolled nodes (credentials on disk) and a fast config maker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from frenzyd.config import Config, config_from_dict
from frenzyd.net import auth


@pytest.fixture(scope="session")
def pool_creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, auth.Credentials]:
    """Nodes n1..n4 of pool "lab", and "alien" enrolled in another pool."""
    d = tmp_path_factory.mktemp("pool")
    auth.create_pool(d / "lab")
    auth.create_pool(d / "other")
    out = {n: auth.load_credentials(auth.add_node(d / "lab", n).out_dir) for n in ("n1", "n2", "n3", "n4")}
    out["alien"] = auth.load_credentials(auth.add_node(d / "other", "alien").out_dir)
    return out


def fast_config(tmp_path: Path, creds: auth.Credentials, priority: int = 0, **network: Any) -> Config:
    """A loopback config with shrunken timing (heartbeat 0.1 s, timeout 0.6 s, grace 0.4 s)."""
    raw = {
        "node": {"name": creds.node_name, "data_dir": str(tmp_path / creds.node_name), "priority": priority},
        "network": {"listen": "127.0.0.1:0", "mdns": False, **network},
        "pool": {"credentials": str(creds.node_cert.parent)},
        "timing": {
            "heartbeat_s": 0.1,
            "peer_timeout_s": 0.6,
            "election_grace_s": 0.4,
            "request_timeout_s": 2.0,
        },
    }
    return config_from_dict(raw, {}, base=tmp_path)
