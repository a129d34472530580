"""Training data: a memory-mapped token file cut into sequences, and the seeded order of global batches.

Two formats: a UTF-8 text file, whose bytes are the tokens (0-255), and a
nanoGPT flat ``.bin`` of token ids (uint16 when the vocabulary has at most
65,536 entries, else uint32).  Sequence ``i`` is tokens ``[i·S, (i+1)·S)``.
Global batch ``k`` is sequences ``[k·G, (k+1)·G)`` of a seeded permutation
(a new permutation each epoch of ``N // G`` batches); data-parallel rank
``r`` takes the ``r``-th contiguous slice of ``G / dp`` of them.  The order is
a pure function of ``(seed, k)``: the data position in a checkpoint is the
step number, on any plan.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import numpy as np

from frenzyd.errors import ConfigError

_CHUNK = 1 << 24


class DataError(ConfigError):
    """The training data cannot be used as given; the message says what to change."""


def token_dtype(vocab: int) -> type[np.unsignedinteger]:
    """nanoGPT's on-disk token type for a vocabulary of ``vocab`` ids."""
    return np.uint16 if vocab <= 65_536 else np.uint32


class TokenData:
    """A read-only, memory-mapped token stream checked against the model's vocabulary."""

    def __init__(self, path: str | Path, *, vocab: int, seq_len: int, global_batch: int, seed: int,
                 check: bool = True) -> None:
        """Open ``path``; ``check=False`` skips the full read (UTF-8, ids < vocab) a caller already did."""
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"training data {str(self.path)!r} does not exist or is not a file")
        self.is_text = self.path.suffix != ".bin"
        dtype = np.uint8 if self.is_text else token_dtype(vocab)
        size = self.path.stat().st_size
        width = np.dtype(dtype).itemsize
        if size == 0:
            raise DataError(f"training data {str(self.path)!r} is empty")
        if size % width:
            raise DataError(
                f"{str(self.path)!r} has {size} bytes, not a whole number of {np.dtype(dtype).name} tokens "
                f"(a .bin for a vocabulary of {vocab} holds {np.dtype(dtype).name}); is it the right file?"
            )
        self.tokens: np.ndarray = np.memmap(self.path, dtype=dtype, mode="r")
        self.vocab, self.seq_len, self.global_batch, self.seed = vocab, seq_len, global_batch, seed
        if check:
            self._check_tokens()
        self.sequences = len(self.tokens) // seq_len
        if self.sequences < global_batch:
            raise DataError(
                f"{str(self.path)!r} holds {len(self.tokens)} tokens = {self.sequences} sequences of "
                f"{seq_len}, shorter than one global batch of {global_batch} sequences "
                f"({global_batch * seq_len} tokens): give more data or a smaller global batch/seq_len"
            )
        self.batches_per_epoch = self.sequences // global_batch
        self._perm_epoch = -1
        self._perm: np.ndarray = np.empty(0, dtype=np.int64)

    def _check_tokens(self) -> None:
        if self.is_text:
            decoder = codecs.getincrementaldecoder("utf-8")()
            for start in range(0, len(self.tokens), _CHUNK):
                try:
                    decoder.decode(self.tokens[start:start + _CHUNK].tobytes(), final=False)
                except UnicodeDecodeError as exc:
                    raise DataError(
                        f"{str(self.path)!r} is not UTF-8 text (byte {start + exc.start}): give a UTF-8 "
                        "file, or token ids as a nanoGPT .bin (name it *.bin)"
                    ) from exc
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                raise DataError(f"{str(self.path)!r} ends inside a UTF-8 character") from exc
        top = max(int(self.tokens[s:s + _CHUNK].max()) for s in range(0, len(self.tokens), _CHUNK))
        if top >= self.vocab:
            what = "byte value" if self.is_text else "token id"
            raise DataError(
                f"{str(self.path)!r} holds {what} {top} >= the model's vocabulary of {self.vocab}: "
                f"tokenize for this model, or use a model with vocab_size > {top}"
            )

    def batch_sequences(self, k: int) -> np.ndarray:
        """The sequence indices of global batch ``k`` (length G)."""
        epoch, pos = divmod(k, self.batches_per_epoch)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.sequences)
            self._perm_epoch = epoch
        return self._perm[pos * self.global_batch:(pos + 1) * self.global_batch]

    def local_batch(self, k: int, dp_rank: int, dp: int) -> np.ndarray:
        """int64 ``[G/dp, S]``: data-parallel rank ``dp_rank``'s slice of global batch ``k``."""
        idx = self.batch_sequences(k)
        per = self.global_batch // dp
        mine = idx[dp_rank * per:(dp_rank + 1) * per]
        out = np.empty((per, self.seq_len), dtype=np.int64)
        for row, i in enumerate(mine):
            out[row] = self.tokens[int(i) * self.seq_len:(int(i) + 1) * self.seq_len]
        return out
