"""One process's run of the reference training step, real or under fake tensors, measured per phase.

The single-process half of MARP's torch boundary (``frenzyd.marp.trace.dist``
builds the data-parallel runs on it; ``frenzyd.marp.trace.api`` chooses
between them).  torch and transformers are imported lazily inside functions:
importing this module imports neither.  Both methods run the literal reference
step of DESIGN.md §3 on the CPU device under torch's ``MemTracker`` (a
``TorchDispatchMode`` that sees every tensor storage the step allocates) and
report the per-phase peak tensor bytes of a steady-state step (the second
optimizer step, when the optimizer state exists) with a breakdown.  torch and
transformers exceptions are mapped into Frenzy's error tree here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from frenzyd.errors import ConfigError, FrenzyError, ModelConfigError, PlanError, TraceError
from frenzyd.marp.spec import PHASES, Breakdown, ModelSpec, Phase, Prediction, TrainingSetup

__all__ = [
    "SDPA_BACKENDS",
    "STEPS",
    "Measurement",
    "ModelLike",
    "StepResult",
    "build_hf_config",
    "build_optimizer",
    "hf_dict",
    "measure_real_single",
    "model_name",
    "run_reference_step",
    "runs_distributed",
    "to_measurement",
    "torch_errors",
    "trace_measurement_single",
    "validate_setup",
]

ModelLike = ModelSpec | dict[str, Any]
Mode = Literal["real", "fake"]

STEPS = 2
"""Optimizer steps run; the last one is measured (the optimizer state exists by then)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """Peak tensor bytes of one reference step on the worst rank, measured or traced.

    ``phases`` maps each phase of DESIGN.md §3 to its peak; ``breakdown`` is the
    composition at the overall peak and sums to ``peak_bytes``.  ``rank_peaks``
    lists every rank's peak for multi-process runs.
    """

    model: str
    params: int
    peak_bytes: int
    peak_phase: Phase
    breakdown: Breakdown
    phases: dict[str, int]
    method: Literal["real", "trace"]
    world_size: int = 1
    rank_peaks: tuple[int, ...] = ()
    wall_s: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def to_prediction(self) -> Prediction:
        """The same numbers as a ``Prediction`` (method ``trace``).

        ``rank_peaks``: every rank's peak where every rank was run, else the
        measured rank's peak for each rank (data-parallel ranks are symmetric).
        """
        ranks = self.rank_peaks
        if len(ranks) != self.world_size:
            ranks = (self.peak_bytes,) * self.world_size
        return Prediction(
            model=self.model,
            params=self.params,
            peak_bytes=self.peak_bytes,
            peak_phase=self.peak_phase,
            breakdown=self.breakdown,
            method="trace",
            phases=dict(self.phases),
            rank_peaks=tuple(ranks),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (for benchmark caches)."""
        b = self.breakdown
        return {
            "model": self.model,
            "params": self.params,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "breakdown": {
                "parameters": b.parameters,
                "gradients": b.gradients,
                "optimizer": b.optimizer,
                "activations": b.activations,
                "temporaries": b.temporaries,
            },
            "phases": dict(self.phases),
            "method": self.method,
            "world_size": self.world_size,
            "rank_peaks": list(self.rank_peaks),
            "wall_s": self.wall_s,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        """Inverse of ``to_json``."""
        return cls(
            model=str(d["model"]),
            params=int(d["params"]),
            peak_bytes=int(d["peak_bytes"]),
            peak_phase=d["peak_phase"],
            breakdown=Breakdown(**{k: int(v) for k, v in d["breakdown"].items()}),
            phases={str(k): int(v) for k, v in d["phases"].items()},
            method=d["method"],
            world_size=int(d.get("world_size", 1)),
            rank_peaks=tuple(int(x) for x in d.get("rank_peaks", ())),
            wall_s=float(d.get("wall_s", 0.0)),
            notes=tuple(str(x) for x in d.get("notes", ())),
        )


# --------------------------------------------------------------------------- config


def model_name(model: ModelLike) -> str:
    if isinstance(model, ModelSpec):
        return model.name
    return str(model.get("_name_or_path") or model.get("name") or model.get("model_type", "model"))


def hf_dict(model: ModelLike) -> dict[str, Any]:
    if isinstance(model, ModelSpec):
        if not model.hf_config:
            raise ModelConfigError(
                f"model {model.name!r} carries no Hugging Face config (ModelSpec.hf_config is empty); "
                "load it with frenzyd.marp.model.load_model so the trace can build the same HF model"
            )
        return dict(model.hf_config)
    if not isinstance(model, dict):
        raise ModelConfigError("model must be a ModelSpec or a Hugging Face config dict")
    return dict(model)


def build_hf_config(model: ModelLike) -> Any:
    """The ``transformers`` config object for ``model`` (``ModelConfigError`` if it cannot be built)."""
    from transformers import AutoConfig

    d = hf_dict(model)
    model_type = d.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ModelConfigError(
            "the Hugging Face config has no 'model_type' (e.g. \"llama\" or \"gpt2\"); add it to config.json"
        )
    for k in ("architectures", "transformers_version", "_name_or_path", "name", "torch_dtype", "dtype"):
        d.pop(k, None)
    try:
        return AutoConfig.for_model(model_type, **d)
    except Exception as e:  # transformers/huggingface_hub raise many types; all mean a bad config
        detail = " ".join(str(e).split())
        raise ModelConfigError(f"cannot build a {model_type!r} config from the given fields: {detail}") from e


def validate_setup(setup: TrainingSetup) -> None:
    if setup.seq_len < 1 or setup.micro_batch < 1:
        raise ConfigError("seq_len and micro_batch must be positive integers")
    if setup.tp != 1 or setup.pp != 1:
        raise PlanError(
            "the trace/real methods run data parallelism and ZeRO only; use tp=1 and pp=1 "
            "(tensor and pipeline parallelism are predicted by the analytic method)"
        )
    if setup.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero must be 0, 1, 2 or 3, not {setup.zero}")
    if setup.dp < 1:
        raise ConfigError(f"dp must be >= 1, not {setup.dp}")
    g = setup.effective_global_batch
    if g % (setup.micro_batch * setup.dp) != 0:
        raise ConfigError(
            f"global batch {g} is not a multiple of micro_batch x dp = {setup.micro_batch * setup.dp}; "
            "pick a global batch that is"
        )


# --------------------------------------------------------------------------- tracker


def _make_tracker(fsdp_root: Any = None, optimizer: Any = None) -> Any:
    """A ``MemTracker`` (``FSDPMemTracker`` for an FSDP2 root) keeping the peak of each phase of the step."""
    from copy import copy

    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    _UPDATE_REF = _UpdateType.REF
    to_copy = torch.ops.aten._to_copy.default

    base: Any = MemTracker
    if fsdp_root is not None:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        base = FSDPMemTracker

    class PhaseMemTracker(base):  # type: ignore[misc]
        """Torch's tracker whose peak statistics are per phase of the reference step.

        Module-wise peaks are not needed here; skipping them makes each op O(1).
        Tensors allocated in the ``loss`` phase count as temporaries.
        """

        def __init__(self) -> None:
            if fsdp_root is not None:
                super().__init__(fsdp_root, optimizer)
            else:
                super().__init__()
            self.phase: str | None = None
            self.recording = False
            self.phase_peak: dict[str, int] = {}
            self.phase_snap: dict[str, dict[str, int]] = {}

        def _current(self) -> tuple[int, dict[str, int]]:
            total = 0
            merged: dict[str, int] = {}
            for dev_snap in self._curr_mem_snap.values():
                for k, v in dev_snap.items():
                    key = str(getattr(k, "value", k))
                    merged[key] = merged.get(key, 0) + v
                total += dev_snap.get("Total", 0)
            return total, merged

        def _record(self) -> None:
            if not self.recording or self.phase is None:
                return
            total, merged = self._current()
            if total > self.phase_peak.get(self.phase, -1):
                self.phase_peak[self.phase] = total
                self.phase_snap[self.phase] = copy(merged)

        def set_phase(self, phase: str | None) -> None:
            self.phase = phase
            self._record()

        def _update_peak_stats(self, peak_state: Any) -> None:
            self._record()

        def gradient_infos(self, module: Any) -> list[Any]:
            """Tracking records of the storages now holding ``module``'s gradients (no references kept)."""
            infos = []
            for p in module.parameters():
                g = p.grad
                if g is None or not hasattr(g, "untyped_storage"):
                    continue
                try:
                    st = g.untyped_storage()
                except (RuntimeError, NotImplementedError):  # e.g. DTensor gradients of FSDP
                    continue
                entry = self._WINFO.get(st)
                if entry is not None:
                    infos.append(entry)
            return infos

        def retag_as_gradients(self, infos: list[Any]) -> None:
            """Count still-alive gradient storages (DDP buckets survive ``zero_grad``) as gradients."""
            grad = self._ref_class("Gradient") if "Gradient" in {r.value for r in self._ref_class} else None
            if grad is None:
                return
            for winfo, w_st in infos:
                if w_st() is not None and winfo.reftype != grad:
                    old = winfo.reftype
                    winfo.reftype = grad
                    self._update_snap(_UPDATE_REF, winfo, old_reftype=old)

        def _track(self, reftype: Any, t: Any) -> None:
            if self.phase == "loss" and reftype.value == "Activation":
                reftype = self._ref_class("Temp")
            super()._track(reftype, t)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            res = super().__torch_dispatch__(func, types, args, kwargs)
            # autocast's casts of weights (cached for the whole forward) are weight copies:
            # count them with the parameters, not with the activations.
            is_cast = func is to_copy and args and isinstance(args[0], torch.Tensor)
            if is_cast and isinstance(res, torch.Tensor):
                src = self._WINFO.get(args[0].untyped_storage())
                if src is not None and src[0].reftype.value in _PARAM_KINDS:
                    dst = self._WINFO.get(res.untyped_storage())
                    kind = self._ref_class("Unsharded Param" if fsdp_root is not None else "Parameter")
                    if dst is not None and dst[0].reftype != kind:
                        old = dst[0].reftype
                        dst[0].reftype = kind
                        self._update_snap(_UPDATE_REF, dst[0], old_reftype=old)
            return res

    return PhaseMemTracker()


_PARAM_KINDS = frozenset({"Parameter", "Sharded Param", "Unsharded Param"})

# MemTracker / FSDPMemTracker categories (their ``.value`` strings) -> Breakdown fields.
_CATEGORY = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "All Gather": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Reduce Scatter": "gradients",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "temporaries",
    "Inputs": "temporaries",
}


def _breakdown_from_snap(snap: dict[str, int]) -> Breakdown:
    acc = dict.fromkeys(("parameters", "gradients", "optimizer", "activations", "temporaries"), 0)
    for k, v in snap.items():
        if k == "Total":
            continue
        acc[_CATEGORY.get(k, "temporaries")] += int(v)
    return Breakdown(**acc)


# --------------------------------------------------------------------------- the step


@contextlib.contextmanager
def _real_code_path(fake: bool) -> Iterator[None]:
    """Make HF take under fake tensors the code path a real run takes (DESIGN.md §3).

    Under ``FakeTensorMode`` transformers' ``is_tracing`` is true for fake
    tensors, so it builds an explicit causal mask (instead of SDPA's mask-free
    ``is_causal`` path) and refuses to detect an unpacked batch.  A real run of
    the reference step passes no attention mask and plain ``arange`` positions,
    where both checks come out "no mask, not packed": force that outcome.
    """
    if not fake:
        yield
        return
    import transformers.masking_utils

    mu: Any = transformers.masking_utils

    orig_is_tracing = mu.is_tracing
    orig_packed = mu.find_packed_sequence_indices

    def is_tracing(tensor: Any = None) -> bool:
        return False

    def find_packed_sequence_indices(position_ids: Any) -> None:
        return None

    mu.is_tracing = is_tracing
    mu.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        mu.is_tracing = orig_is_tracing
        mu.find_packed_sequence_indices = orig_packed


def _param_dtype(setup: TrainingSetup) -> Any:
    import torch

    return torch.bfloat16 if setup.dtype == "bf16" else torch.float32


def _build_model(hf_config: Any, setup: TrainingSetup) -> Any:
    import transformers

    auto: Any = transformers.AutoModelForCausalLM
    hf_config.use_cache = False
    model = auto.from_config(hf_config, attn_implementation="sdpa", dtype=_param_dtype(setup))
    model.config.use_cache = False
    if setup.recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def build_optimizer(params: Any, setup: TrainingSetup, zero1: bool = False) -> Any:
    import torch

    if setup.optimizer == "adamw":
        cls: Any = torch.optim.AdamW
        kwargs: dict[str, Any] = {"lr": 1e-4, "fused": True}
    else:
        cls = torch.optim.SGD
        kwargs = {"lr": 1e-3, "momentum": 0.9, "fused": True}
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kwargs)
    return cls(params, **kwargs)


def _lm_head(model: Any) -> Any:
    head = model.get_output_embeddings()
    if head is None:
        raise TraceError("the model has no output embedding (lm_head); only causal LMs are supported")
    return head


@dataclass
class StepResult:
    phase_peak: dict[str, int]
    phase_snap: dict[str, dict[str, int]]
    params: int


def run_reference_step(
    hf_config: Any,
    setup: TrainingSetup,
    *,
    mode: Mode = "real",
    wrap: Any = None,
    seed: int = 0,
) -> StepResult:
    """Run the reference step of DESIGN.md §3 for ``STEPS`` optimizer steps; measure the last.

    ``mode="real"`` uses real CPU tensors, ``mode="fake"`` the same step under
    ``FakeTensorMode`` (no memory used).  ``wrap(model) -> (model, optimizer)``
    lets the multi-process driver apply DDP/FSDP/ZeRO-1 before training; by
    default the plain model and a fused AdamW (SGD with momentum) are used.
    Returns each phase's peak bytes and the breakdown snapshot at it.
    """
    import torch

    torch.manual_seed(seed)
    fake_ctx: Any = contextlib.nullcontext()
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_ctx = FakeTensorMode(allow_non_fake_inputs=False)

    grad_accum = setup.grad_accum
    vocab = int(hf_config.vocab_size)
    with fake_ctx, _real_code_path(mode == "fake"):
        model = _build_model(hf_config, setup)
        params = sum(int(p.numel()) for p in model.parameters())
        if wrap is None:
            train_model, opt = model, build_optimizer(model.parameters(), setup)
        else:
            train_model, opt = wrap(model)
        head = _lm_head(model)
        from torch.distributed.fsdp import FSDPModule

        is_fsdp = isinstance(train_model, FSDPModule)
        tracker = _make_tracker(train_model if is_fsdp else None, opt if is_fsdp else None)

        def head_pre(_m: Any, _a: Any) -> None:
            if tracker.phase == "forward":
                tracker.set_phase("loss")

        hook = head.register_forward_pre_hook(head_pre)
        autocast = setup.dtype == "bf16-mixed"
        gen_ids = [
            torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), dtype=torch.int64)
            for _ in range(grad_accum)
        ]
        tracker.track_external(model, opt)
        # DDP rebuilds its gradient buckets once, at the second iteration: measure the
        # step after that, and count the buckets (alive all step) as gradients.
        from torch.nn.parallel import DistributedDataParallel

        steps = STEPS + 1 if isinstance(train_model, DistributedDataParallel) else STEPS
        grad_infos: list[Any] = []
        try:
            with tracker:
                for step in range(steps):
                    tracker.recording = step == steps - 1
                    if tracker.recording:
                        tracker.retag_as_gradients(grad_infos)
                    for micro in range(grad_accum):
                        tracker.reset_mod_stats()
                        ids = gen_ids[micro].clone()
                        tracker.set_phase("forward")
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                            loss = train_model(input_ids=ids, labels=ids).loss / grad_accum
                        del ids
                        tracker.set_phase("backward")
                        loss.backward()
                        del loss
                    if step == steps - 2:
                        grad_infos = tracker.gradient_infos(model)
                    tracker.set_phase("optimizer")
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    tracker.set_phase(None)
        finally:
            hook.remove()
    return StepResult(dict(tracker.phase_peak), dict(tracker.phase_snap), params)


def to_measurement(
    name: str, res: StepResult, method: Literal["real", "trace"], wall_s: float, *, world: int = 1,
    rank_peaks: tuple[int, ...] = (), notes: tuple[str, ...] = (),
) -> Measurement:
    phases: dict[str, int] = {p: res.phase_peak.get(p, 0) for p in PHASES}
    peak_phase: Phase = max(PHASES, key=lambda p: phases[p])
    bd = _breakdown_from_snap(res.phase_snap[peak_phase])
    if bd.total != phases[peak_phase]:  # pragma: no cover - invariant of MemTracker's snapshot
        raise TraceError(f"internal: breakdown {bd.total} != peak {phases[peak_phase]}")
    return Measurement(
        model=name, params=res.params, peak_bytes=phases[peak_phase], peak_phase=peak_phase,
        breakdown=bd, phases=phases, method=method, world_size=world, rank_peaks=rank_peaks,
        wall_s=wall_s, notes=notes,
    )


@contextlib.contextmanager
def torch_errors(what: str) -> Iterator[None]:
    """Map torch/transformers exceptions raised by ``what`` into FrenzyError subclasses."""
    try:
        yield
    except FrenzyError:
        raise
    except MemoryError as e:
        raise TraceError(
            f"{what}: out of host memory; run a smaller configuration for real or use the trace method"
        ) from e
    except RuntimeError as e:
        msg = str(e)
        if "can't allocate memory" in msg or "not enough memory" in msg:
            raise TraceError(
                f"{what}: out of host memory ({msg.splitlines()[0]}); run a smaller configuration "
                "for real or use the trace method"
            ) from e
        raise TraceError(f"{what} failed in torch: {msg.splitlines()[0] if msg else type(e).__name__}") from e
    except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as e:
        raise TraceError(f"{what} failed: {type(e).__name__}: {e}") from e


def _threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


SDPA_BACKENDS = ("flash", "efficient", "math")
"""Names accepted by ``sdpa_backend`` (``torch.nn.attention.SDPBackend`` members, as MARP names them)."""


@contextlib.contextmanager
def _sdpa_backend(name: str | None) -> Iterator[None]:
    """Force SDPA's backend (``torch.nn.attention.sdpa_kernel``); ``None`` leaves torch's choice."""
    if name is None:
        yield
        return
    if name not in SDPA_BACKENDS:
        raise ConfigError(f"sdpa backend {name!r} is unknown: use one of {', '.join(SDPA_BACKENDS)}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    with sdpa_kernel([member]):
        yield


def measure_real_single(
    model: ModelLike,
    setup: TrainingSetup,
    *,
    threads: int = 1,
    seed: int = 0,
    sdpa_backend: str | None = None,
) -> Measurement:
    """Ground truth in this process (dp = 1, ZeRO-0): the reference step with real CPU tensors.

    Runs ``STEPS`` optimizer steps and reports the last (steady state) under
    torch's ``MemTracker``.  ``sdpa_backend`` ("flash", "efficient", "math")
    forces the attention kernel, e.g. to measure on the CPU the math kernel a
    CUDA run takes.  Raises ``ConfigError``/``PlanError`` for setups it cannot
    run (a data-parallel or ZeRO setup is ``frenzyd.marp.trace.dist``'s) and
    ``TraceError`` when torch fails (e.g. out of host memory, or a forced
    backend that cannot run the step).
    """
    _require_single(setup)
    name = model_name(model)
    cfg = build_hf_config(model)
    _threads(threads)
    t0 = time.perf_counter()
    with torch_errors(f"real run of {name}"), _sdpa_backend(sdpa_backend):
        res = run_reference_step(cfg, setup, mode="real", seed=seed)
    notes = (f"sdpa backend forced: {sdpa_backend}",) if sdpa_backend else ()
    return to_measurement(name, res, "real", time.perf_counter() - t0, notes=notes)


def trace_measurement_single(model: ModelLike, setup: TrainingSetup, *, seed: int = 0) -> Measurement:
    """The reference step in this process (dp = 1, ZeRO-0) under ``FakeTensorMode``, as a ``Measurement``."""
    _require_single(setup)
    name = model_name(model)
    cfg = build_hf_config(model)
    t0 = time.perf_counter()
    with torch_errors(f"trace of {name}"):
        res = run_reference_step(cfg, setup, mode="fake", seed=seed)
    return to_measurement(name, res, "trace", time.perf_counter() - t0)


def runs_distributed(setup: TrainingSetup) -> bool:
    """Whether ``setup`` needs several ranks (dp > 1 or a ZeRO stage) rather than this one process."""
    return setup.dp > 1 or setup.zero > 0


def _require_single(setup: TrainingSetup) -> None:
    validate_setup(setup)
    if runs_distributed(setup):
        raise ConfigError(
            f"dp={setup.dp}, zero={setup.zero} needs several ranks; "
            "use frenzyd.marp.trace.measure_real or trace_measurement"
        )
