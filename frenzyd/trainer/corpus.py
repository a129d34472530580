"""A small deterministic text corpus for tests and the demo (no downloads).

Sentences from a tiny grammar over a fixed vocabulary, drawn by a seeded
``random.Random``: the same ``(size, seed)`` gives the same bytes on every
machine.  The text has enough structure (word order, agreement, punctuation,
a few multi-byte UTF-8 words) that a byte-level model's loss falls visibly
within a few dozen steps.  ``python -m frenzyd.trainer.corpus OUT [--bytes N]``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

_SUBJECTS = ("the cat", "a dog", "the pool", "every peer", "the coordinator", "a GPU", "the café owner",
             "our naïve model", "the scheduler", "a student")
_VERBS = ("trains", "waits for", "checkpoints", "leases", "sees", "measures", "predicts", "resumes")
_OBJECTS = ("the job", "a batch", "its memory", "the loss", "every rank", "the plan", "a shard", "the data")
_TAILS = (".", " today.", " again.", " on time.", " over the LAN.", " without a GPU.", " — twice.")


def generate(size: int, seed: int = 0) -> str:
    """At least ``size`` bytes of UTF-8 text (cut at a sentence boundary past ``size``)."""
    if size < 1:
        raise ValueError(f"size must be positive, not {size}")
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < size:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_TAILS)}"
        s = s[0].upper() + s[1:] + ("\n" if rng.random() < 0.2 else " ")
        parts.append(s)
        n += len(s.encode())
    return "".join(parts)


def write_corpus(path: str | Path, size: int = 1 << 20, seed: int = 0) -> Path:
    """Write :func:`generate`'s text to ``path`` and return it."""
    out = Path(path)
    out.write_text(generate(size, seed), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m frenzyd.trainer.corpus", description=__doc__)
    p.add_argument("out", help="file to write")
    p.add_argument("--bytes", type=int, default=1 << 20, help="size in bytes (default 1 MiB)")
    p.add_argument("--seed", type=int, default=0, help="default 0")
    args = p.parse_args(argv)
    write_corpus(args.out, args.bytes, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
