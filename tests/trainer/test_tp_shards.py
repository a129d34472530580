"""A pipeline stage's tensor-parallel shards held as plain tensors (trainer.parallel._hold_tp_shards_locally).

One gloo rank, a 1-rank tp mesh (the DTensor code paths are the same at any size).  A pipeline stage
runs several forwards before its backwards: every micro-batch's gradient must reach the one leaf the
optimizer holds (torch's ``_pre_dp_module_transform`` makes a new leaf after each forward; without
DDP the second micro-batch's gradients were lost and the dp2 x tp2 x pp2 curve drifted by 1.4e-3).
"""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def tp_mesh():  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _model(mesh):  # type: ignore[no-untyped-def]
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return m


def test_every_micro_batch_reaches_the_leaf_the_optimizer_holds(tp_mesh) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import DTensor

    from frenzyd.trainer.parallel import _hold_tp_shards_locally

    ref = _model(tp_mesh)
    held = _model(tp_mesh)
    _hold_tp_shards_locally(held)
    leaves = dict(held.named_parameters())
    assert leaves
    assert not any(isinstance(p, DTensor) for p in leaves.values())

    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    # as 1F1B's first stage: every forward, then every backward
    outs = [held(x).sum() for x in xs]
    assert dict(held.named_parameters()) == leaves  # the same leaves after each forward
    for out in outs:
        out.backward()
    for x in xs:
        ref(x).sum().backward()
    for name, p in ref.named_parameters():
        assert p.grad is not None
        assert leaves[name].grad is not None
        torch.testing.assert_close(leaves[name].grad, p.grad.to_local())


def test_a_layer_s_gradient_is_accumulated_when_its_backward_is_done(tp_mesh) -> None:  # type: ignore[no-untyped-def]
    """Wrapped at each owner's forward, not the root's: the last layer's leaf has its gradient before
    the first layer's backward runs (wrapped at the root, every leaf waited for the whole backward)."""
    from frenzyd.trainer.parallel import _hold_tp_shards_locally

    held = _model(tp_mesh)
    _hold_tp_shards_locally(held)
    last = held[2].weight
    seen: list[bool] = []
    held[0].register_full_backward_pre_hook(lambda *_: seen.append(last.grad is not None))
    held(torch.randn(3, 8, requires_grad=True)).sum().backward()
    assert seen == [True]
