"""``python -m frenzyd.trainer``: one rank of the built-in trainer, launched by torchrun or Frenzy's launcher.

Exit status: 0 finished, 2 refused input (the message says what to change),
143 stopped by SIGTERM after writing a checkpoint, 1 anything else.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from frenzyd.errors import ConfigError, FrenzyError

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED = 0, 1, 2, 143


def _check_world(world: int, needed: int) -> None:
    if world != needed:
        raise ConfigError(f"the plan needs {needed} ranks (dp x tp x pp) but WORLD_SIZE is {world}: launch "
                          f"it with --nproc-per-node {needed} or change the plan")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from frenzyd.trainer.loop import RunEnv, StopFlag, print_error
    from frenzyd.trainer.plan import plan_from

    try:
        plan, args = plan_from(sys.argv[1:] if argv is None else argv, os.environ)
        env = RunEnv.from_environ(os.environ, output_dir=args.output_dir, checkpoint_dir=args.checkpoint_dir)
        _check_world(env.world, plan.world_size)
        from frenzyd.trainer.data import TokenData

        TokenData(plan.data, vocab=plan.spec().vocab, seq_len=plan.seq_len,
                  global_batch=plan.global_batch, seed=plan.seed)  # refuse bad data before any rank waits
    except ConfigError as exc:
        print_error(str(exc))
        return EXIT_REFUSED
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.set)
    from frenzyd.trainer.loop import init_process_group, train

    try:
        init_process_group(os.environ)
        summary = train(plan, env, stop=stop, data_checked=True)
    except FrenzyError as exc:
        print_error(str(exc))
        return EXIT_REFUSED if isinstance(exc, ConfigError) else EXIT_FAILED
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return EXIT_STOPPED if summary.state == "stopped" else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
