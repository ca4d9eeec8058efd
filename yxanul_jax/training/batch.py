"""The shape of one optimizer step's batch, `[A, B, L]`, in one place: `BatchSpec`.

A train step takes a dict of three arrays of shape [A, B, L]: A micro-batches (gradient accumulation
inside the jitted step, by `lax.scan`) of B rows of L tokens: `inputs` and `targets` (int32, the
targets are the inputs shifted by one token) and `mask` (float32, 1 where a target counts). The
loader hands out A x B rows of L tokens; `BatchSpec.from_rows` folds them into the step's shape.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.core.config import StageConfig

FIELDS = (("inputs", jnp.int32), ("targets", jnp.int32), ("mask", jnp.float32))
"""The batch's arrays and their dtypes."""


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """[A, B, L] = `accum` micro-batches of `rows` rows (global, over every device) of `seq_len` tokens."""

    accum: int
    rows: int
    seq_len: int

    @classmethod
    def of(cls, stage: StageConfig) -> "BatchSpec":
        """A curriculum stage's batch: grad_accum_steps x batch_size x seq_len."""
        return cls(stage.grad_accum_steps, stage.batch_size, stage.seq_len)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.accum, self.rows, self.seq_len)

    @property
    def rows_per_step(self) -> int:
        """A x B: the rows the loader reads for one optimizer step."""
        return self.accum * self.rows

    def abstract(self, sharding=None) -> dict:
        """`jax.ShapeDtypeStruct`s of the batch (for ahead-of-time lowering), placed by `sharding` if given."""
        return {k: jax.ShapeDtypeStruct(self.shape, dt, sharding=sharding) for k, dt in FIELDS}

    def from_rows(self, rows: dict) -> dict:
        """The loader's [A * B, L] rows (numpy) as the step's [A, B, L] arrays (still on the host)."""
        return {k: np.asarray(v).reshape(self.accum, -1, *np.shape(v)[1:]) for k, v in rows.items()}

    def synthetic(self, vocab_size: int, seed: int = 1) -> dict:
        """A batch of uniform random tokens, every target counted (benchmarks and profiles: speed does not
        depend on the text)."""
        tokens = jax.random.randint(jax.random.key(seed), (*self.shape[:-1], self.seq_len + 1), 0, vocab_size)
        return {"inputs": tokens[..., :-1], "targets": tokens[..., 1:], "mask": jnp.ones(self.shape, jnp.float32)}


def split_micro_batches(batch: dict, k: int) -> dict:
    """A step's [A, B, L] batch as [A * k, B / k, L] (`train.micro_split`): micro-batch a * k + j holds rows j, j + k,
    j + 2k, ... of micro-batch a, so that rows sharded over devices in contiguous blocks stay on their device
    (each block of B / devices rows splits in k where k divides it)."""
    if k == 1:
        return batch

    def split(x):
        A, B = x.shape[:2]
        return x.reshape(A, B // k, k, *x.shape[2:]).swapaxes(1, 2).reshape(A * k, B // k, *x.shape[2:])

    return {name: split(x) for name, x in batch.items()}
