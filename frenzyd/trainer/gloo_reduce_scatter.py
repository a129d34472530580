"""FSDP2's gradient reduce-scatter on gloo without gloo's private copy of the input.

``ProcessGroupGloo`` has no native reduce-scatter: its ``reduce_scatter_tensor``
clones the whole input, all-reduces the clone and copies the rank's chunk out.
The clone (the size of a group's unsharded gradients: for the root group the
embedding and the head) is held by the work object, which the gloo worker thread
drops some time after the collective has finished, so on CPU it adds a
group's gradients to the step's peak, for a time that depends on thread
scheduling.  FSDP2's reduce-scatter input is already a private flat buffer that
FSDP never reads again (``foreach_reduce`` only keeps it alive for stream
ordering), so all-reducing it in place and copying this rank's chunk out is the
same collective without the copy: what NCCL's reduce-scatter costs.
"""

from __future__ import annotations

from typing import Any


def install(fsdp_modules: list[Any], group: Any) -> bool:
    """Give every FSDP2 module in ``fsdp_modules`` the in-place reduce-scatter when ``group`` is gloo.

    True when installed (a gloo group of more than one rank; FSDP2 skips the collective for one).
    """
    import torch.distributed as dist

    if dist.get_backend(group) != "gloo" or dist.get_world_size(group) < 2:
        return False
    comm = _comm()
    for m in fsdp_modules:
        m.set_custom_reduce_scatter(comm)
    return True


def _comm() -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    class InPlaceReduceScatter(DefaultReduceScatter):
        """reduce-scatter = in-place all-reduce of FSDP's flat input + this rank's chunk."""

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            if async_op:
                raise NotImplementedError("the in-place gloo reduce-scatter is synchronous")
            n = dist.get_world_size(group)
            if input_tensor.numel() != n * output_tensor.numel():
                raise ValueError(f"reduce-scatter input of {input_tensor.numel()} elements for an output of "
                                 f"{output_tensor.numel()} on {n} ranks")
            dist.all_reduce(input_tensor, op=op, group=group)
            output_tensor.copy_(input_tensor.view(n, -1)[dist.get_rank(group)])
            return None

    return InPlaceReduceScatter()
