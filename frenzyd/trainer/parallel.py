"""One place that turns a Hugging Face causal LM into the plan's parallel form (DESIGN.md §3, marp.combos).

The mesh is ``(pp, dp, tp)`` with tp innermost (tp stays inside one peer).
In order: pipeline stage cut (pp), tensor parallel (tp), then the data-
parallel wrapper of the plan's ZeRO stage over the dp axis: DDP
(``gradient_as_bucket_view``; a pipeline stage averages its gradients itself),
DDP + ``ZeroRedundancyOptimizer``, or FSDP2 ``fully_shard`` per decoder layer
and at the root.  The result names every
parameter by its Hugging Face FQN on every plan, which is what checkpoints
(DCP, resharding on load) and the exported model rely on.
torch is imported inside functions: importing this module does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from frenzyd.errors import PlanError
from frenzyd.trainer.plan import TrainerPlan
from frenzyd.trainer.tp_gpt2 import apply_tp_gpt2, is_qkv_weight, qkv_checkpoint_view, sync_tp_biases

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
    tied_name: str | None = None
    """pp with tied embeddings: the input embedding's FQN (the last stage's head is keyed by it too)."""
    tied_group: Any = None
    gpt2: bool = False
    """GPT-2: checkpoints see ``c_attn.weight`` as ``[E, 3, E]`` on every plan (``tp_gpt2``)."""
    tp_biases: list[str] = field(default_factory=list)
    """GPT-2 under tp: FQNs of the column-wise biases whose gradients are summed over tp after a backward."""
    dp_group: Any = None
    """A pipeline stage's data-parallel group under dp > 1 or ZeRO-1: ``sync_grads`` averages over it."""

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
            t = DTensor.from_local(t, mesh, placements, run_check=False)
        if self.gpt2 and is_qkv_weight(name):
            t = qkv_checkpoint_view(t)
        return t

    def sync_grads(self) -> None:
        """Gradient sums the wrappers do not do: tied embeddings over pp, GPT-2's tp biases over tp, a
        pipeline stage's data-parallel mean."""
        sync_tied_grads(self)
        if self.tp_biases:
            sync_tp_biases([self.params[n] for n in self.tp_biases], self.mesh["tp"].get_group())
        if self.dp_group is not None:
            mean_grads(list(self.inner.parameters()), self.dp_group, self.plan.dp)


# --------------------------------------------------------------------------- tensor parallel

_TP_COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_TP_ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def _apply_tp(model: Any, tp_mesh: Any) -> list[str]:
    """Megatron-style: q/k/v and gate/up column-wise, o and down row-wise; the rest replicated.

    GPT-2's ``Conv1D`` layers go through ``tp_gpt2``; returns the biases it leaves to sum over tp.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if hasattr(model, "transformer"):
        return apply_tp_gpt2(model, tp_mesh)
    plan: dict[str, Any] = {n: ColwiseParallel() for n in _TP_COLWISE}
    plan.update({n: RowwiseParallel() for n in _TP_ROWWISE})
    for layer in model.layers() if hasattr(model, "layers") else decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)
    return []


# --------------------------------------------------------------------------- pipeline


def causal_lm_loss(logits: Any, target: Any) -> Any:
    """Hugging Face's causal-LM loss: mean token cross-entropy of the next token, in fp32."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))


def _stage_class() -> Any:
    import torch
    from torch import nn

    class Stage(nn.Module):
        """Layers ``[lo, hi)`` of a LLaMA-family or GPT-2 model, keeping the HF FQNs (``model.layers.3...``).

        The first stage holds the embeddings, the last the final norm and the head; the loss is the
        schedule's (``causal_lm_loss``).  Attention gets no mask: SDPA's causal kernel, as in the full
        model's forward without padding.
        """

        def __init__(self, full: Any, lo: int, hi: int, *, first: bool, last: bool, autocast: bool) -> None:
            super().__init__()
            self.first, self.last, self.autocast = first, last, autocast
            self.gpt2 = hasattr(full, "transformer")
            src = full.transformer if self.gpt2 else full.model
            base = nn.Module()
            if self.gpt2:
                self.transformer = base
                if first:
                    base.wte, base.wpe, base.drop = src.wte, src.wpe, src.drop
                base.h = nn.ModuleDict({str(i): src.h[i] for i in range(lo, hi)})
                if last:
                    base.ln_f = src.ln_f
            else:
                self.model = base
                if first:
                    base.embed_tokens = src.embed_tokens
                base.layers = nn.ModuleDict({str(i): src.layers[i] for i in range(lo, hi)})
                base.rotary_emb = src.rotary_emb
                if last:
                    base.norm = src.norm
            if last:
                self.lm_head = full.lm_head

        def layers(self) -> Any:
            m: Any = self.transformer.h if self.gpt2 else self.model.layers
            return m.values()

        def forward(self, x: Any) -> Any:
            head: Any = getattr(self, "lm_head", None)
            with torch.autocast(x.device.type, torch.bfloat16, enabled=self.autocast):
                if self.gpt2:
                    t: Any = self.transformer
                    pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
                    h = t.drop(t.wte(x) + t.wpe(pos)) if self.first else x
                    for layer in self.layers():
                        h = layer(h, attention_mask=None, position_ids=pos)
                    return head(t.ln_f(h)) if self.last else h
                m: Any = self.model
                h = m.embed_tokens(x) if self.first else x
                pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
                pe = m.rotary_emb(h, position_ids=pos)
                for layer in self.layers():
                    h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
                return head(m.norm(h)) if self.last else h

    return Stage


def _cut_stage(model: Any, plan: TrainerPlan, pp_rank: int) -> Any:
    n = len(decoder_layers(model))
    per = n // plan.pp
    lo, hi = pp_rank * per, (pp_rank + 1) * per
    return _stage_class()(model, lo, hi, first=pp_rank == 0, last=pp_rank == plan.pp - 1,
                          autocast=plan.dtype == "bf16-mixed")


def tied_embedding_name(model: Any) -> str | None:
    """The FQN of the input embedding when the output head shares it (GPT-2), else None."""
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings()
    if head is None or emb is None or head.weight is not emb.weight:
        return None
    name: str = next(n for n, p in model.named_parameters() if p is emb.weight)
    return name


def _tied_group(mesh: Any, plan: TrainerPlan) -> Any:
    """This rank's {first stage, last stage} group for its (dp, tp) coordinate (None on middle stages).

    Every rank creates every pair, in the same order, as ``new_group`` requires.
    """
    import torch.distributed as dist

    mine = None
    _, dp_i, tp_i = (int(c) for c in mesh.get_coordinate())
    pp_i = int(mesh.get_coordinate()[0])
    for d in range(plan.dp):
        for t in range(plan.tp):
            ranks = [int(mesh.mesh[0, d, t]), int(mesh.mesh[plan.pp - 1, d, t])]
            group = dist.new_group(ranks)
            if (d, t) == (dp_i, tp_i) and pp_i in (0, plan.pp - 1):
                mine = group
    return mine


def sync_tied_grads(par: Parallel) -> None:
    """Sum the tied embedding's gradient of the first and the last stage (each holds a copy)."""
    import torch.distributed as dist

    if par.tied_group is None or par.tied_name is None:
        return
    grad = par.params[par.tied_name].grad
    if grad is not None:
        dist.all_reduce(getattr(grad, "_local_tensor", grad), group=par.tied_group)


def _hold_tp_shards_locally(module: Any) -> None:
    """Hold ``module``'s DTensor parameters as plain tensors of their local shards (the data-parallel
    mean and ZeRO-1's optimizer see plain tensors); the forward of each submodule owning one wraps those
    same tensors as DTensors again and puts them back after.

    torch's ``_pre_dp_module_transform`` (for DDP) makes new leaf parameters from the forward's DTensors
    after every forward: a pipeline stage runs several forwards before its backwards, so each
    micro-batch's gradients would land on a different leaf, and the optimizer would see the first's
    only.  Wrapping at each owner's forward (not the root's) also lets each gradient reach its leaf as
    soon as its layer's backward is done (the autograd engine runs the wrapping's backward in reverse
    creation order: made at the root, every layer's gradients would wait for the embedding's backward),
    and a recomputed layer wraps them again.
    """
    from torch import nn
    from torch.distributed.tensor import DTensor

    owners: dict[Any, list[tuple[str, Any, Any]]] = {}  # owner module -> [(attribute, local leaf, spec)]
    for name, p in list(module.named_parameters()):
        if isinstance(p, DTensor):
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            leaf = nn.Parameter(p.to_local().detach(), requires_grad=p.requires_grad)
            owners.setdefault(owner, []).append((attr, leaf, p._spec))

    def put(owner: Any, as_dtensor: bool) -> None:
        for attr, leaf, spec in owners[owner]:
            delattr(owner, attr)
            setattr(owner, attr, DTensor.from_local(leaf, spec.mesh, spec.placements, run_check=False,
                                                    shape=spec.shape, stride=spec.stride)
                    if as_dtensor else leaf)

    for owner in owners:
        put(owner, False)
        owner.register_forward_pre_hook(lambda m, _a: put(m, True))
        owner.register_forward_hook(lambda m, _a, _o: put(m, False))


def mean_grads(params: list[Any], group: Any, dp: int) -> None:
    """Average the gradients of ``params`` over ``group`` (``dp`` ranks) in place, one collective per
    tensor, all in flight at once: no flat copy of the gradients is made."""
    import torch.distributed as dist

    works = []
    for p in params:
        if p.grad is not None:
            g = getattr(p.grad, "_local_tensor", p.grad)
            g.div_(dp)
            works.append(dist.all_reduce(g, group=group, async_op=True))
    for w in works:
        w.wait()


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
    groups = param_groups(par.params)
    if plan.optimizer == "sgd":
        from torch.distributed.tensor import DTensor

        for g in groups:  # torch 2.13: aten._fused_sgd_ has no DTensor sharding strategy (FSDP2, TP)
            if isinstance(g["params"][0], DTensor):
                g["fused"] = False
    return cls(groups, **kwargs)


# --------------------------------------------------------------------------- the whole plan


def parallelize(model: Any, plan: TrainerPlan, mesh: Any, device: Any, *, optimizer: bool = True) -> Parallel:
    """Shard ``model`` (built identically on every rank, on the CPU) per ``plan``; build its optimizer."""
    from torch.distributed.tensor import DTensor

    pp_rank = int(mesh.get_coordinate()[0])
    tied = tied_embedding_name(model) if plan.pp > 1 else None
    inner = _cut_stage(model, plan, pp_rank) if plan.pp > 1 else model
    del model
    inner.to(device)
    gpt2 = hasattr(inner, "transformer")
    tp_biases = _apply_tp(inner, mesh["tp"]) if plan.tp > 1 else []
    dp_mesh = mesh["dp"]
    localized: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    module = inner
    dp_group = None
    if plan.zero in (2, 3):
        from torch.distributed.fsdp import fully_shard

        from frenzyd.trainer import gloo_reduce_scatter

        layers = list(decoder_layers(inner) if plan.pp == 1 else inner.layers())
        for layer in layers:
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=plan.zero == 3)
        # the root (embedding, final norm, head): FSDP2's own choice, kept unsharded after forward since
        # backward gathers it again at once (an explicit True re-gathers it at the loss; on gloo with a
        # second full-size temporary)
        fully_shard(inner, mesh=dp_mesh)
        gloo_reduce_scatter.install([*layers, inner], dp_mesh.get_group())  # gloo's copies its input
    elif plan.dp > 1 or plan.zero == 1:
        if plan.tp > 1:
            localized = {n: (p.device_mesh, tuple(p.placements)) for n, p in inner.named_parameters()
                         if isinstance(p, DTensor)}
        if plan.pp > 1:
            # a pipeline stage is not wrapped in DDP: PipelineStage runs all but the last micro-batch's
            # backward under DDP's no_sync, so the plain gradients it accumulates sit beside DDP's
            # buckets (two copies of the stage's gradients) until the last backward copies them in.
            # The stage averages its gradients after the schedule instead (sync_grads)
            if plan.tp > 1:
                _hold_tp_shards_locally(inner)
            dp_group = dp_mesh.get_group()
        else:
            from torch.nn.parallel import DistributedDataParallel

            if plan.tp > 1:
                from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

                _pre_dp_module_transform(inner)
            ids = [device.index] if device.type == "cuda" else None
            module = DistributedDataParallel(inner, process_group=dp_mesh.get_group(), device_ids=ids,
                                             gradient_as_bucket_view=True)
    params = dict(inner.named_parameters())
    if tied is not None and "lm_head.weight" in params and tied not in params:
        params[tied] = params.pop("lm_head.weight")  # the last stage's copy of the tied embedding
    par = Parallel(plan=plan, mesh=mesh, module=module, inner=inner, params=params, localized=localized,
                   tied_name=tied, tied_group=_tied_group(mesh, plan) if tied is not None else None,
                   gpt2=gpt2, tp_biases=tp_biases, dp_group=dp_group)
    if optimizer:
        par.optimizer = make_optimizer(par, plan, device.type)
    if plan.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        stage = PipelineStage(module, pp_rank, plan.pp, device, group=mesh["pp"].get_group())
        par.schedule = Schedule1F1B(stage, n_microbatches=plan.grad_accum, loss_fn=causal_lm_loss,
                                    scale_grads=True)
    return par
