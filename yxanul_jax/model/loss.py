"""Next-token cross-entropy in float32 that never holds all `tokens x vocab` logits at once.

The tokens are cut into chunks of `chunk` rows; a `lax.scan` computes each chunk's logits, its
log-sum-exp and target logit, and keeps only scalars. The chunk body is rematerialized, so the
backward pass recomputes one chunk's logits at a time as well: peak logits memory is
`chunk x vocab` floats in both directions instead of `tokens x vocab`.

On a GPU the head and the loss run instead as fused kernels that never write logits at all
(`model.fused_ce`; `loss_kernel` picks, from `train.loss_kernel`). Both give the same sums.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def cross_entropy_sums(logits_NxV, targets_N, mask_N):
    """(sum of masked NLL, sum of masked logsumexp^2) for one block of float32 logits.

    A masked-out token adds exactly 0 whatever its target: a padding id outside the vocabulary
    (whose gathered logit is NaN) does not poison the sums."""
    logits_NxV = logits_NxV.astype(jnp.float32)
    lse_N = jax.nn.logsumexp(logits_NxV, axis=-1)
    target_N = jnp.take_along_axis(logits_NxV, targets_N[:, None], axis=-1)[:, 0]
    keep_N = mask_N != 0
    nll_N = jnp.where(keep_N, (lse_N - target_N) * mask_N, 0.0)
    return jnp.sum(nll_N), jnp.sum(jnp.where(keep_N, lse_N * lse_N * mask_N, 0.0))


def chunked_cross_entropy(logits_fn: Callable, h_NxD, targets_N, mask_N, chunk: int, per_chunk=None):
    """Sums over tokens of the NLL and of logsumexp^2, computing logits `chunk` rows at a time.

    logits_fn(h_CxD, extra) -> float32 logits_CxV, where `extra` is the slice of `per_chunk`
    (a pytree with a leading axis of n_chunks, or None) that belongs to the chunk. Passing per-chunk
    copies of a state keeps each chunk's cotangent separate (the FP8 head uses this to max-merge
    instead of summing its per-chunk state updates).
    Returns (nll_sum, z_sum) as float32 scalars; divide by sum(mask_N) for means.
    """
    n_tokens, d = h_NxD.shape
    chunk = max(1, min(chunk, n_tokens))
    count = n_chunks(n_tokens, chunk)
    pad = count * chunk - n_tokens
    if pad:  # padded rows have mask 0 and target 0: they add nothing
        h_NxD = jnp.pad(h_NxD, ((0, pad), (0, 0)))
        targets_N = jnp.pad(targets_N, (0, pad))
        mask_N = jnp.pad(mask_N, (0, pad))
    xs = (h_NxD.reshape(count, chunk, d), targets_N.reshape(count, chunk),
          mask_N.astype(jnp.float32).reshape(count, chunk), per_chunk)

    @jax.checkpoint
    def body(carry, x):
        h_CxD, t_C, m_C, extra = x
        nll, z = cross_entropy_sums(logits_fn(h_CxD, extra), t_C, m_C)
        return (carry[0] + nll, carry[1] + z), None

    zero = jnp.zeros((), jnp.float32)
    (nll_sum, z_sum), _ = jax.lax.scan(body, (zero, zero), xs)
    return nll_sum, z_sum


def masked_sums(lse_N, target_N, mask_N):
    """(sum of masked NLL, sum of masked logsumexp^2) from per-token logsumexp and target logit, as
    `cross_entropy_sums` forms them (a masked-out token adds exactly 0)."""
    keep_N = mask_N != 0
    mask_N = mask_N.astype(jnp.float32)
    nll_N = jnp.where(keep_N, (lse_N - target_N) * mask_N, 0.0)
    return jnp.sum(nll_N), jnp.sum(jnp.where(keep_N, lse_N * lse_N * mask_N, 0.0))


def loss_kernel(choice: str, model, fp8, platform: str | None = None) -> str:
    """`chunked` or `fused`, for `train.loss_kernel` = choice. `auto`: fused on a single GPU for a BF16
    model whose head is not FP8 and whose head width the kernels take (`fused_ce.supported`), else
    chunked. Several devices keep the chunked loss: XLA cannot partition the kernels' custom calls and
    would gather their inputs onto every device (correct, but no faster). `platform` given (a compile
    for a target GPU): the answer for one device of it."""
    from yxanul_jax.model.fused_ce import supported

    head_fp8 = fp8.active and "head" in fp8.targets
    if choice == "auto":
        on_gpu = platform == "gpu" or (platform is None and jax.default_backend() == "gpu" and jax.device_count() == 1)
        ok = on_gpu and model.dtype == "bfloat16" and not head_fp8 and supported(model.head_width)
        return "fused" if ok else "chunked"
    return choice


def n_chunks(n_tokens: int, chunk: int) -> int:
    """How many chunks of at most `chunk` tokens `chunked_cross_entropy` cuts n_tokens into."""
    chunk = max(1, min(chunk, n_tokens))
    return -(-n_tokens // chunk)
