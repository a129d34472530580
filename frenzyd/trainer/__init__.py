"""Frenzy's built-in trainer: DESIGN.md §3's reference step on any plan of ``frenzyd.marp.combos``.

Entry points:

* ``python -m frenzyd.trainer`` under torchrun's env vars (see README.md): the
  whole job - data, plan, checkpoints, the returned model, memory.
* :func:`train` with a :class:`TrainerPlan` in an initialised process group.
* The user-script contract (DESIGN.md §8): :func:`report`,
  :func:`checkpoint_complete`, :class:`Checkpointable` (stop on SIGTERM, save
  and resume for ``run --checkpointable``) and :func:`apply_plan`.

Importing this package does not import torch or transformers.
"""

from __future__ import annotations

import os
from typing import Any

from frenzyd.trainer.control import checkpoint_complete, report
from frenzyd.trainer.plan import TrainerPlan, plan_from, resolve
from frenzyd.trainer.script import Checkpoint, Checkpointable

__all__ = ["Checkpoint", "Checkpointable", "TrainerPlan", "apply_plan",
            "checkpoint_complete", "plan_from", "report", "resolve", "train"]


def train(plan: TrainerPlan, env: Any = None, **kwargs: Any) -> Any:
    """Run ``plan`` in the current process group; see ``frenzyd.trainer.loop.train``."""
    from frenzyd.trainer.loop import RunEnv
    from frenzyd.trainer.loop import train as _train

    return _train(plan, env or RunEnv.from_environ(os.environ), **kwargs)


def apply_plan(model: Any, plan: TrainerPlan | dict[str, Any] | None = None) -> Any:
    """Shard a ``transformers`` causal LM by ``plan`` (default: ``FRENZY_PLAN``); return the module to train.

    For a user's own loop: initialises the process group from torchrun's env
    vars if needed, builds the ``(pp, dp, tp)`` mesh and applies tp, then DDP /
    FSDP2 as the plan's ZeRO stage says.  Build ``model`` identically on every
    rank (same seed) before calling.  ZeRO-1 returns the DDP module: pair it with
    ``torch.distributed.optim.ZeroRedundancyOptimizer``.  Pipeline plans need a
    schedule and are refused (``PlanError``): run the built-in trainer for them.
    """
    import json

    from frenzyd.errors import ConfigError, PlanError
    from frenzyd.trainer.loop import device_for, init_process_group
    from frenzyd.trainer.parallel import build_mesh, parallelize

    if plan is None:
        text = os.environ.get("FRENZY_PLAN")
        if not text:
            raise ConfigError("apply_plan needs a plan: pass one, or run under Frenzy (FRENZY_PLAN is unset)")
        plan = json.loads(text)
    if isinstance(plan, dict):
        plan = resolve(plan, need_data=False)
    if plan.pp > 1:
        raise PlanError(f"apply_plan cannot run pp={plan.pp} in your own loop (a pipeline needs "
                        "its schedule): submit without a script to use the built-in trainer, "
                        "or ask for a plan with pp=1")
    init_process_group(os.environ)
    device = device_for(int(os.environ.get("LOCAL_RANK", "0")))
    mesh = build_mesh(plan, device.type)
    return parallelize(model, plan, mesh, device, optimizer=False).module
