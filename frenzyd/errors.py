"""Frenzy's one exception tree: every error a user or a peer can cause is a FrenzyError.

Dependency owners (wire, auth, discovery, inventory, trace) map their libraries'
exceptions into this tree at the boundary, so callers never catch a third-party
exception type.  Messages say what to do, not just what went wrong.
"""

from __future__ import annotations


class FrenzyError(Exception):
    """Root of every error Frenzy raises on purpose."""


class ConfigError(FrenzyError, ValueError):
    """A config file, flag or model description is invalid; the message says how to fix it."""


class ModelConfigError(ConfigError):
    """A model description (preset or HF config.json) is unknown or impossible."""


class PlanError(ConfigError):
    """A parallel plan does not fit the model (degrees do not divide layers/heads, ...)."""


class InfeasibleError(FrenzyError):
    """No plan of the given pool can hold the job."""


class WireError(FrenzyError):
    """A message could not be decoded: malformed, oversized, wrong version or kind."""


class AuthError(FrenzyError):
    """A peer, signature or credential failed verification; ``reason`` names the check."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ElectionError(FrenzyError):
    """An order carried a stale term or came from a node that is not the coordinator."""


class LeaseError(FrenzyError):
    """A GPU lease was refused (already leased, owner busy, stale term)."""


class SchedulerError(FrenzyError):
    """A scheduling policy misbehaved or could not be loaded."""


class LaunchError(FrenzyError):
    """Rank processes could not be started or the job payload was rejected."""


class InventoryError(FrenzyError):
    """GPU discovery failed (NVML errors are mapped here)."""


class DaemonUnreachable(FrenzyError):
    """The client could not reach a daemon; the message names the address tried."""


class PeerError(FrenzyError):
    """A request to a peer failed or was refused; ``reason`` names why (``unreachable``, ``timeout``, ...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class JobStateError(FrenzyError):
    """A job lifecycle move the state machine forbids, or an unknown job id."""


class TraceError(FrenzyError):
    """A real or fake-tensor run of the reference step failed in torch (mapped by ``marp.trace``)."""
