"""Policy names: the built-ins (frenzy, sia, gavel, fifo, tiresias, srtf, srtf-wide) and ``module:attr``."""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable

from frenzyd.errors import SchedulerError
from frenzyd.has.fifo import FifoPolicy
from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.has.gavel import GavelPolicy
from frenzyd.has.interface import Decision, Policy, Snapshot
from frenzyd.has.sia import DEFAULT_TIME_LIMIT_S, SiaPolicy
from frenzyd.has.srtf import SrtfPolicy, SrtfWidePolicy
from frenzyd.has.tiresias import TiresiasPolicy

BUILTIN: dict[str, Callable[[], Policy]] = {
    "frenzy": FrenzyPolicy,
    "sia": SiaPolicy,
    "gavel": GavelPolicy,
    "fifo": FifoPolicy,
    "tiresias": TiresiasPolicy,
    "srtf": SrtfPolicy,
    "srtf-wide": SrtfWidePolicy,
}


class _Named:
    """An outside policy object with the name and round period the simulator reports and uses."""

    def __init__(self, inner: object, name: str, round_s: float | None) -> None:
        self._inner = inner
        self.name = name
        self.round_s = round_s

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        out = self._inner.decide(snapshot, rng)  # type: ignore[attr-defined]
        if not isinstance(out, Decision):
            raise SchedulerError(f"policy {self.name} returned {type(out).__name__}, not a Decision")
        return out


def load_policy(spec: str, *, sia_time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Policy:
    """A fresh policy for a built-in name or ``module:attr``.

    ``attr`` may be a policy object or a class (instantiated without
    arguments); it needs ``decide(snapshot, rng) -> Decision``.  It is reported
    under its ``name`` attribute, else under ``module:attr``; a missing
    ``round_s`` means events only.
    """
    if spec == "sia":
        return SiaPolicy(time_limit_s=sia_time_limit_s)
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if ":" not in spec:
        raise SchedulerError(
            f"unknown policy {spec!r}: use one of {', '.join(BUILTIN)} or module:attr for your own"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SchedulerError(f"cannot import policy module {module_name!r}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise SchedulerError(f"module {module_name!r} has no attribute {attr!r}")
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as exc:
            raise SchedulerError(f"policy class {spec} needs a no-argument constructor: {exc}") from exc
    if not callable(getattr(obj, "decide", None)):
        raise SchedulerError(f"{spec} has no decide(snapshot, rng) method: see frenzyd/has/README.md")
    name = getattr(obj, "name", None)
    round_s = getattr(obj, "round_s", None)
    if round_s is not None and (not isinstance(round_s, int | float) or round_s <= 0):
        raise SchedulerError(f"{spec}: round_s must be a positive number of seconds or None")
    return _Named(obj, name if isinstance(name, str) and name else spec, round_s)
