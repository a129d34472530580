"""Megatron-style tensor parallelism for GPT-2, whose linear maps are transposed ``Conv1D``s, q/k/v fused.

``ColwiseParallel``/``RowwiseParallel`` handle ``nn.Linear`` only, and a
column shard of GPT-2's fused ``c_attn`` would give a rank a slice of the
concatenation ``[q | k | v]`` instead of its heads of each.  Here each
``Conv1D`` becomes a :class:`TPConv1D` with the same parameter names:

* column-wise (``attn.c_attn``, ``mlp.c_fc``): the weight is a DTensor sharded
  on its output dimension; for ``c_attn`` the columns are first reordered so
  rank ``r``'s shard is ``[q_r | k_r | v_r]`` (its heads), and the attention's
  ``split_size`` becomes ``E / tp``.  The input enters as a replicated DTensor,
  so its gradient is all-reduced over tp (Megatron's ``f``).
* row-wise (``attn.c_proj``, ``mlp.c_proj``): the weight is sharded on its input
  dimension; the partial products are all-reduced (Megatron's ``g``).
* every bias stays a full, plain tensor in Hugging Face's layout: a column-wise
  layer adds the entries of its own columns (its gradient is summed over tp after
  the backward, :func:`sync_tp_biases`); a row-wise layer adds it after the
  reduction (identical gradient on every tp rank).

Checkpoints see ``c_attn.weight`` as ``[E, 3, E]`` (a view of Hugging Face's
``[E, 3E]``), in which a tp rank's shard is an ordinary ``Shard(2)``: the same
key on every plan, so DCP reshards between tp and the other forms.
"""

from __future__ import annotations

from typing import Any

QKV = "attn.c_attn"
COLWISE = (QKV, "mlp.c_fc")
ROWWISE = ("attn.c_proj", "mlp.c_proj")


def _module_class() -> Any:
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    class TPConv1D(nn.Module):
        """A tensor-parallel GPT-2 ``Conv1D`` (``y = x @ W + b``, ``W`` of shape ``[in, out]``)."""

        def __init__(self, conv: Any, mesh: Any, *, colwise: bool, qkv: bool) -> None:
            super().__init__()
            self.mesh, self.colwise = mesh, colwise
            tp, rank = mesh.size(), mesh.get_local_rank()
            w = conv.weight.detach()
            n_in, n_out = w.shape
            parts = 3 if qkv else 1
            if colwise:
                if qkv:  # columns [q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]
                    w = w.view(n_in, 3, tp, n_out // (3 * tp)).permute(0, 2, 1, 3).reshape(n_in, n_out)
                self.weight = nn.Parameter(distribute_tensor(w.contiguous(), mesh, [Shard(1)]))
                block = n_out // (parts * tp)
                starts = [p * tp * block + rank * block for p in range(parts)]
                idx = torch.cat([torch.arange(s, s + block) for s in starts])
                self.register_buffer("idx", idx, persistent=False)
            else:
                self.weight = nn.Parameter(distribute_tensor(w.contiguous(), mesh, [Shard(0)]))
            self.bias = nn.Parameter(conv.bias.detach().clone())

        def forward(self, x: Any) -> Any:
            if self.colwise:
                xd = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)
                y: Any = torch.matmul(xd, self.weight)
                idx: Any = self.idx
                return y.to_local() + self.bias[idx]
            xd = DTensor.from_local(x, self.mesh, [Shard(x.dim() - 1)], run_check=False)
            out: Any = torch.matmul(xd, self.weight)
            out = out.redistribute(self.mesh, [Replicate()]).to_local()
            return out + self.bias

    return TPConv1D


def apply_tp_gpt2(model: Any, tp_mesh: Any) -> list[str]:
    """Replace each block's four ``Conv1D`` by :class:`TPConv1D`; return the column-wise biases' FQNs.

    Names, not tensors: FSDP2 later replaces every parameter object by its sharded DTensor.
    """
    cls = _module_class()
    tp = tp_mesh.size()
    biases = []
    blocks = model.transformer.h
    named = blocks.items() if hasattr(blocks, "items") else enumerate(blocks)  # a pipeline stage's ModuleDict
    for i, block in named:
        block.attn.split_size = block.attn.embed_dim // tp
        for path in (*COLWISE, *ROWWISE):
            parent_path, _, leaf = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            new = cls(getattr(parent, leaf), tp_mesh, colwise=path in COLWISE, qkv=path == QKV)
            setattr(parent, leaf, new)
            if path in COLWISE:
                biases.append(f"transformer.h.{i}.{path}.bias")
    return biases


def sync_tp_biases(biases: list[Any], tp_group: Any) -> None:
    """Sum the column-wise biases' gradients over tp (each rank filled only its own columns).

    Without it training is still right (a rank reads only its own columns) but the replicated
    bias drifts apart in the other ranks' columns, and the exported model would be wrong.
    """
    import torch.distributed as dist

    for b in biases:
        if b.grad is not None:
            dist.all_reduce(getattr(b.grad, "_local_tensor", b.grad), group=tp_group)


def is_qkv_weight(name: str) -> bool:
    return name.endswith(f"{QKV}.weight")


def qkv_checkpoint_view(t: Any) -> Any:
    """``c_attn.weight`` (``[E, 3E]``, or a tp rank's ``[E, 3E/tp]`` shard) as the canonical ``[E, 3, E]``."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        return t.view(t.shape[0], 3, -1)
    local = t.to_local()
    placements = [Shard(2) if isinstance(p, Shard) and p.dim == 1 else p for p in t.placements]
    shape = torch.Size((t.shape[0], 3, t.shape[1] // 3))
    return DTensor.from_local(local.view(local.shape[0], 3, -1), t.device_mesh, placements, run_check=False,
                              shape=shape, stride=(shape[1] * shape[2], shape[2], 1))
