"""One place that turns a Hugging Face causal LM into the plan's parallel form (DESIGN.md §3, marp.combos).

The mesh is ``(pp, dp, tp)`` with tp innermost (tp stays inside one peer).
In order: pipeline stage cut (pp), tensor parallel (tp), then the data-
parallel wrapper of the plan's ZeRO stage over the dp axis: DDP
(``gradient_as_bucket_view``), DDP + ``ZeroRedundancyOptimizer``, or FSDP2
``fully_shard`` per decoder layer and at the root.  The result names every
parameter by its Hugging Face FQN on every plan, which is what checkpoints
(DCP, resharding on load) and the exported model rely on.
torch is imported inside functions: importing this module does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from frenzyd.errors import PlanError
from frenzyd.trainer.plan import TrainerPlan

MESH_DIMS = ("pp", "dp", "tp")


def decoder_layers(model: Any) -> Any:
    """The ModuleList of decoder layers of a GPT-2 or LLaMA-family causal LM."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    layers = getattr(base, "layers", None) if base is not None else None
    if layers is None and base is not None:
        layers = getattr(base, "h", None)
    if layers is None:
        raise PlanError(f"{type(model).__name__} has no decoder layer list (model.layers or transformer.h)")
    return layers


def build_mesh(plan: TrainerPlan, device_type: str) -> Any:
    """The ``(pp, dp, tp)`` DeviceMesh over the default process group (its size must be the plan's)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != plan.world_size:
        raise PlanError(
            f"the plan needs dp x tp x pp = {plan.dp} x {plan.tp} x {plan.pp} = {plan.world_size} ranks, "
            f"but WORLD_SIZE is {world}: launch {plan.world_size} ranks or change the plan"
        )
    return init_device_mesh(device_type, (plan.pp, plan.dp, plan.tp), mesh_dim_names=MESH_DIMS)


@dataclass
class Parallel:
    """A model in its plan's parallel form, with its optimizer and what checkpoints need."""

    plan: TrainerPlan
    mesh: Any
    module: Any
    """What the step calls: the wrapped model, or the (wrapped) pipeline stage."""
    inner: Any
    """The unwrapped model or stage, whose parameter names are Hugging Face FQNs."""
    params: dict[str, Any]
    """FQN -> the parameter object the optimizer updates (a DTensor, or a plain tensor)."""
    optimizer: Any = None
    schedule: Any = None
    localized: dict[str, tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)
    """dp x tp: FQN -> (mesh, placements) of a TP parameter DDP holds as its local shard."""

    @property
    def coords(self) -> tuple[int, int, int]:
        c = self.mesh.get_coordinate()
        return int(c[0]), int(c[1]), int(c[2])

    @property
    def pp_rank(self) -> int:
        return self.coords[0]

    @property
    def dp_rank(self) -> int:
        return self.coords[1]

    @property
    def tp_rank(self) -> int:
        return self.coords[2]

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.plan.pp - 1

    @property
    def local_optimizer(self) -> Any:
        """The optimizer holding this rank's state (ZeRO-1: its partition's inner optimizer)."""
        return getattr(self.optimizer, "optim", self.optimizer)

    def checkpoint_view(self, tensor: Any, name: str) -> Any:
        """``tensor`` (a parameter or its optimizer state) as checkpoints see it: a DTensor where sharded."""
        t = tensor.detach()
        if name in self.localized:
            from torch.distributed.tensor import DTensor

            mesh, placements = self.localized[name]
            return DTensor.from_local(t, mesh, placements, run_check=False)
        return t


# --------------------------------------------------------------------------- tensor parallel

_TP_COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_TP_ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def _apply_tp(model: Any, tp_mesh: Any) -> None:
    """Megatron-style: q/k/v and gate/up column-wise, o and down row-wise; the rest replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan: dict[str, Any] = {n: ColwiseParallel() for n in _TP_COLWISE}
    plan.update({n: RowwiseParallel() for n in _TP_ROWWISE})
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)


# --------------------------------------------------------------------------- pipeline


def causal_lm_loss(logits: Any, target: Any) -> Any:
    """Hugging Face's causal-LM loss: mean token cross-entropy of the next token, in fp32."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))


def _stage_class() -> Any:
    import torch
    from torch import nn

    class LlamaStage(nn.Module):
        """Layers ``[lo, hi)`` of a LLaMA-family model, keeping the HF FQNs (``model.layers.3...``)."""

        def __init__(self, full: Any, lo: int, hi: int, *, first: bool, last: bool, autocast: bool) -> None:
            super().__init__()
            base = full.model
            self.model = nn.Module()
            self.first, self.last, self.autocast = first, last, autocast
            if first:
                self.model.embed_tokens = base.embed_tokens
            self.model.layers = nn.ModuleDict({str(i): base.layers[i] for i in range(lo, hi)})
            self.model.rotary_emb = base.rotary_emb
            if last:
                self.model.norm = base.norm
                self.lm_head = full.lm_head

        def forward(self, x: Any) -> Any:
            m: Any = self.model
            head: Any = getattr(self, "lm_head", None)
            with torch.autocast(x.device.type, torch.bfloat16, enabled=self.autocast):
                h = m.embed_tokens(x) if self.first else x
                pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
                pe = m.rotary_emb(h, position_ids=pos)
                for layer in m.layers.values():
                    h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
                if self.last:
                    return head(m.norm(h))
                return h

    return LlamaStage


def _cut_stage(model: Any, plan: TrainerPlan, pp_rank: int) -> Any:
    n = len(decoder_layers(model))
    per = n // plan.pp
    lo, hi = pp_rank * per, (pp_rank + 1) * per
    return _stage_class()(model, lo, hi, first=pp_rank == 0, last=pp_rank == plan.pp - 1,
                          autocast=plan.dtype == "bf16-mixed")


# --------------------------------------------------------------------------- the optimizer


def param_groups(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Parameters grouped by where they live (plain, or DTensor per mesh): one fused kernel per group."""
    from torch.distributed.tensor import DTensor

    groups: list[tuple[Any, list[Any]]] = []
    for p in params.values():
        key = p.device_mesh if isinstance(p, DTensor) else None
        for k, ps in groups:
            if k == key:
                ps.append(p)
                break
        else:
            groups.append((key, [p]))
    return [{"params": ps} for _, ps in groups]


def make_optimizer(par: Parallel, plan: TrainerPlan, device_type: str) -> Any:
    """AdamW (fused) or SGD with momentum (fused), as DESIGN.md §3; ZeRO-1 wraps it."""
    import torch

    fused = device_type in ("cpu", "cuda")
    if plan.optimizer == "adamw":
        cls: Any = torch.optim.AdamW
        kwargs: dict[str, Any] = {"lr": plan.lr, "fused": fused}
    else:
        cls = torch.optim.SGD
        kwargs = {"lr": plan.lr, "momentum": 0.9, "fused": fused}
    if plan.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(list(par.params.values()), optimizer_class=cls,
                                       process_group=par.mesh["dp"].get_group(), **kwargs)
    return cls(param_groups(par.params), **kwargs)


# --------------------------------------------------------------------------- the whole plan


class _NoRebuildReducer:
    """DDP's C++ reducer without its one-time bucket rebuild, for pipeline stages.

    The pipeline runs a stage's micro-batch backwards under ``no_sync`` and
    syncs on the last; the reducer still records every micro-batch's gradient
    order for the rebuild and then asserts (torch 2.13: "rebuilt parameter
    indices size is not same as original model parameters size").  The
    buckets of the first iteration (parameter order) hold the same gradients.
    """

    def __init__(self, reducer: Any) -> None:
        object.__setattr__(self, "_reducer", reducer)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_reducer"), name)

    def _rebuild_buckets(self) -> bool:
        return False


def parallelize(model: Any, plan: TrainerPlan, mesh: Any, device: Any, *, optimizer: bool = True) -> Parallel:
    """Shard ``model`` (built identically on every rank, on the CPU) per ``plan``; build its optimizer."""
    from torch.distributed.tensor import DTensor

    pp_rank = int(mesh.get_coordinate()[0])
    inner = _cut_stage(model, plan, pp_rank) if plan.pp > 1 else model
    del model
    inner.to(device)
    if plan.tp > 1:
        _apply_tp(inner, mesh["tp"])
    dp_mesh = mesh["dp"]
    localized: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    module = inner
    if plan.zero in (2, 3):
        from torch.distributed.fsdp import fully_shard

        reshard = plan.zero == 3
        for layer in decoder_layers(inner) if plan.pp == 1 else inner.model.layers.values():
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(inner, mesh=dp_mesh, reshard_after_forward=reshard)
    elif plan.dp > 1 or plan.zero == 1:
        from torch.nn.parallel import DistributedDataParallel

        if plan.tp > 1:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            localized = {n: (p.device_mesh, tuple(p.placements)) for n, p in inner.named_parameters()
                         if isinstance(p, DTensor)}
            _pre_dp_module_transform(inner)
        ids = [device.index] if device.type == "cuda" else None
        module = DistributedDataParallel(inner, process_group=dp_mesh.get_group(), device_ids=ids,
                                         gradient_as_bucket_view=True)
        if plan.pp > 1:
            module.reducer = _NoRebuildReducer(module.reducer)  # type: ignore[assignment]
    par = Parallel(plan=plan, mesh=mesh, module=module, inner=inner,
                   params=dict(inner.named_parameters()), localized=localized)
    if optimizer:
        par.optimizer = make_optimizer(par, plan, device.type)
    if plan.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        stage = PipelineStage(module, pp_rank, plan.pp, device, group=mesh["pp"].get_group())
        par.schedule = Schedule1F1B(stage, n_microbatches=plan.grad_accum, loss_fn=causal_lm_loss,
                                    scale_grads=True)
    return par
