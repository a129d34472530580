"""What Frenzy derives from a job's plan set (fastest step, plans per type, cost rankings), computed once."""

from __future__ import annotations

from frenzyd.has.interface import JobView
from frenzyd.marp.spec import Plan


class PlanShape:
    """What Frenzy derives from one plan set: grouped once, everything else computed on first use."""

    __slots__ = (
        "_asc_step",
        "_desc",
        "_fastest_on",
        "_groups",
        "_preferred",
        "_ranked",
        "_types",
        "fastest",
        "plans",
    )

    def __init__(self, plans: tuple[Plan, ...]) -> None:
        self.plans = plans
        self.fastest = min([p.step_time_s for p in plans], default=float("inf"))  # packed step time
        self._groups: tuple[tuple[str, int, tuple[Plan, ...]], ...] | None = None
        self._ranked: dict[float, tuple[tuple[float, Plan], ...]] = {}
        self._preferred: dict[float, dict[str, int]] = {}
        self._desc: dict[str, tuple[Plan, ...]] = {}
        self._types: frozenset[str] | None = None
        self._fastest_on: dict[str, float] | None = None
        self._asc_step: dict[str, tuple[Plan, ...]] = {}

    @property
    def groups(self) -> tuple[tuple[str, int, tuple[Plan, ...]], ...]:
        """Per type, by name: (type, fewest GPUs of any of its plans, its plans).

        One linear pass on first use (a fresh policy object pays O(K) per plan
        set it looks at, no sort).
        """
        if self._groups is None:
            by_type: dict[str, list[Plan]] = {}
            least: dict[str, int] = {}
            for p in self.plans:
                t = p.gpu_type
                same = by_type.get(t)
                if same is None:
                    by_type[t] = [p]
                    least[t] = p.gpus
                else:
                    same.append(p)
                    least[t] = min(least[t], p.gpus)
            self._groups = tuple((t, least[t], tuple(by_type[t])) for t in sorted(by_type))
        return self._groups

    @property
    def types(self) -> frozenset[str]:
        """The GPU types the plan set has a plan on."""
        if self._types is None:
            self._types = frozenset(t for t, _, _ in self.groups)
        return self._types

    def fastest_on(self) -> dict[str, float]:
        """Per type: the fastest packed step time of its plans (read only)."""
        if self._fastest_on is None:
            self._fastest_on = {t: min(p.step_time_s for p in of_type) for t, _, of_type in self.groups}
        return self._fastest_on

    def fastest_first(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type``, fastest packed step first (ties: fewer GPUs)."""
        asc = self._asc_step.get(gpu_type)
        if asc is None:
            asc = self._asc_step[gpu_type] = tuple(
                sorted(self._of_type(gpu_type), key=lambda p: (p.step_time_s, p.gpus))
            )
        return asc

    def _of_type(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type`` as :attr:`groups` holds them (none: empty)."""
        return next((g for t, _, g in self.groups if t == gpu_type), ())

    def most_gpus_first(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type``, most GPUs first (at most one per count)."""
        desc = self._desc.get(gpu_type)
        if desc is None:
            desc = self._desc[gpu_type] = tuple(sorted(self._of_type(gpu_type), key=lambda p: -p.gpus))
        return desc

    def ranking(self, gamma: float) -> tuple[tuple[float, Plan], ...]:
        """Every (cost, plan), ``cost = step_time × gpus^gamma`` (packed), cheapest first.

        Ties: type, then GPU count.
        """
        ranked = self._ranked.get(gamma)
        if ranked is None:
            ranked = self._ranked[gamma] = tuple((c, p) for c, _, _, p in sorted(_costed(self.plans, gamma)))
        return ranked

    def cheapest_per_type(self, gamma: float) -> tuple[tuple[float, Plan], ...]:
        """Each type's cheapest (cost, plan) (packed cost as :meth:`ranking`), cheapest first."""
        key = -gamma - 1.0  # its own slot in the cache: gammas are >= 0
        ranked = self._ranked.get(key)
        if ranked is None:
            scale = powers(gamma)
            best = [
                min((p.step_time_s * pow_of(scale, p.gpus, gamma), t, p.gpus, p) for p in of_type)
                for t, _, of_type in self.groups
            ]
            ranked = self._ranked[key] = tuple((c, p) for c, _, _, p in sorted(best))
        return ranked

    def preferred(self, gamma: float) -> dict[str, int]:
        """Per type, the GPU count of the cheapest plan at ``gamma`` (the policy's: a job's un-grown size)."""
        pref = self._preferred.get(gamma)
        if pref is None:
            scale = powers(gamma)
            pref = self._preferred[gamma] = {
                t: min(of_type, key=lambda p: (p.step_time_s * pow_of(scale, p.gpus, gamma), p.gpus)).gpus
                for t, _, of_type in self.groups
            }
        return pref


def pow_of(scale: list[float], n: int, gamma: float) -> float:
    """``n**gamma`` from the table :func:`powers` returned for ``gamma`` (computed past its end)."""
    return scale[n] if n < 257 else float(n**gamma)


def _costed(plans: tuple[Plan, ...], gamma: float) -> list[tuple[float, str, int, Plan]]:
    """(packed cost, type, GPU count, plan) per plan: sortable, the plan never compared (type and count
    are unique per plan)."""
    scale = powers(gamma)
    return [(p.step_time_s * pow_of(scale, p.gpus, gamma), p.gpu_type, p.gpus, p) for p in plans]


_POWERS: dict[float, list[float]] = {}


def powers(gamma: float) -> list[float]:
    """``n**gamma`` for n < 257 (GPU counts), per gamma."""
    table = _POWERS.get(gamma)
    if table is None:
        table = _POWERS[gamma] = [n**gamma for n in range(257)]
    return table


class Shapes:
    """Plan shapes kept across rounds, keyed by the identity of a job's ``plans`` tuple.

    The entry keeps the tuple alive, so the id cannot be reused: jobs of one
    shape (the simulator shares one tuple per model, sequence and batch) share
    the work, one lookup per job.
    """

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, PlanShape] = {}

    def of(self, job: JobView) -> PlanShape:
        """The shape of ``job``'s plan set."""
        plans = job.plans
        shape = self._by_id.get(id(plans))
        if shape is not None and shape.plans is plans:
            return shape
        if len(self._by_id) > 100_000:
            self._by_id.clear()
        shape = self._by_id[id(plans)] = PlanShape(plans)
        return shape
