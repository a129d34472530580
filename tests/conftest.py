"""Shared fixtures: paths to the real data, and a guard that keeps tests off the network."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def root() -> Path:
    return ROOT
