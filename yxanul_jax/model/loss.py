"""Next-token cross-entropy in float32 that never holds all `tokens x vocab` logits at once.

The tokens are cut into chunks of `chunk` rows; a `lax.scan` computes each chunk's logits (in the head
GEMM's dtype), its log-sum-exp and target logit, and keeps only scalars and the chunk's log-sum-exp. The
chunk body is rematerialized, so the backward pass recomputes one chunk's logits at a time as well: peak
logits memory is `chunk x vocab` values in both directions instead of `tokens x vocab`.

On a GPU the head and the loss run instead as fused kernels that never write logits at all
(`model.fused_ce`; `loss_kernel` picks, from `train.loss_kernel`). Both give the same sums.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
import numpy as np

from yxanul_jax.core.config import FP8Config, ModelConfig


LSE_NAME = "chunk_lse"  # each chunk's logsumexp, kept for its backward (`chunked_cross_entropy`)


@jax.custom_vjp
def cross_entropy_sums(logits_NxV: jax.Array, targets_N: jax.Array, mask_N: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of masked NLL, sum of masked logsumexp^2) for one block of logits, in float32.

    A masked-out token adds exactly 0 whatever its target: a padding id outside the vocabulary
    (whose gathered logit is NaN) does not poison the sums.

    The logits may be BF16 (the head GEMM's own output: `Yxanul.head_logits`); the sums are float32 either way,
    and the gradient comes back in the logits' dtype from one element-wise pass (`_sums_bwd`): no float32 copy of
    a BF16 tile, no scatter of the target's part (autodiff of the gather wrote a `[N x V]` float32 scatter, added
    it to the softmax part and converted the sum to the GEMM's BF16: four passes over the tile, measured in the
    sm_90 HLO of yxanul-270m by `analyze --target`)."""
    return _sums_fwd(logits_NxV, targets_N, mask_N)[0]


def logsumexp_rows(x_NxV: jax.Array) -> jax.Array:
    """logsumexp over the last axis in float32, in one pass over x: a variadic reduction whose carry is the running
    (max, sum of exps shifted by it), flash attention's online softmax as XLA's combiner. jax.nn.logsumexp reads x
    twice (its max, then the sum of exps), which for a chunk of BF16 logits is a second pass over `chunk x vocab`."""
    x = x_NxV.astype(jnp.float32)

    def combine(a, b):
        # one exp per step: the larger max keeps its sum, the other's is scaled down by exp(-|difference|); equal maxes
        # (both -inf included: the padded vocabulary) add
        (m_a, s_a), (m_b, s_b) = a, b
        e = jnp.exp(-jnp.abs(jnp.where(m_a == m_b, 0.0, m_a - m_b)))
        return jnp.maximum(m_a, m_b), jnp.where(m_a >= m_b, s_a + s_b * e, s_b + s_a * e)

    m_N, s_N = jax.lax.reduce((x, jnp.ones_like(x)), (jnp.float32(-jnp.inf), jnp.float32(0.0)), combine, (x.ndim - 1,))
    return m_N + jnp.log(s_N)


def _sums_fwd(logits_NxV, targets_N, mask_N):
    logits_NxV32 = logits_NxV.astype(jnp.float32)
    lse_N = checkpoint_name(logsumexp_rows(logits_NxV32), LSE_NAME)
    target_N = jnp.take_along_axis(logits_NxV32, targets_N[:, None], axis=-1)[:, 0]
    keep_N = mask_N != 0
    nll_N = jnp.where(keep_N, (lse_N - target_N) * mask_N, 0.0)
    sums = jnp.sum(nll_N), jnp.sum(jnp.where(keep_N, lse_N * lse_N * mask_N, 0.0))
    return sums, (logits_NxV, targets_N, mask_N, lse_N, target_N)


def _sums_bwd(res, g):
    """d(g_nll nll + g_z z)/dlogits = softmax * (g_nll + 2 g_z lse) m - onehot(target) g_nll m per kept token (m its
    mask weight), 0 for a masked one; float32 until the one rounding to the logits' dtype. The mask's own
    gradient is that of its weights (nll and lse^2 of each kept token)."""
    logits_NxV, targets_N, mask_N, lse_N, target_N = res
    g_nll, g_z = g
    keep_N = mask_N != 0
    m_N = mask_N.astype(jnp.float32)  # 0 where not kept; the last `where` keeps those rows' gradient at exactly 0
    g_lse_N = m_N * (g_nll + 2.0 * g_z * lse_N)
    p_NxV = jnp.exp(logits_NxV.astype(jnp.float32) - lse_N[:, None])
    hot_NxV = jnp.arange(logits_NxV.shape[-1])[None, :] == targets_N[:, None]
    d_NxV = p_NxV * g_lse_N[:, None] - jnp.where(hot_NxV, (g_nll * m_N)[:, None], 0.0)
    d_NxV = jnp.where(keep_N[:, None], d_NxV, 0.0)
    targets_ct = np.zeros(targets_N.shape, dtype=jax.dtypes.float0)
    if jnp.issubdtype(mask_N.dtype, jnp.floating):
        mask_ct = jnp.where(keep_N, g_nll * (lse_N - target_N) + g_z * lse_N * lse_N, 0.0).astype(mask_N.dtype)
    else:
        mask_ct = np.zeros(mask_N.shape, dtype=jax.dtypes.float0)
    return d_NxV.astype(logits_NxV.dtype), targets_ct, mask_ct


cross_entropy_sums.defvjp(_sums_fwd, _sums_bwd)


def chunked_cross_entropy(logits_fn: Callable[[jax.Array, Any], jax.Array], h_NxD: jax.Array, targets_N: jax.Array,
                          mask_N: jax.Array, chunk: int, per_chunk: Any = None) -> tuple[jax.Array, jax.Array]:
    """Sums over tokens of the NLL and of logsumexp^2, computing logits `chunk` rows at a time.

    logits_fn(h_CxD, extra) -> logits_CxV (float32, or BF16 as the head GEMM writes them: the sums are float32
    either way, `cross_entropy_sums`), where `extra` is the slice of `per_chunk`
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

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(LSE_NAME))
    def body(carry, x):
        h_CxD, t_C, m_C, extra = x
        nll, z = cross_entropy_sums(logits_fn(h_CxD, extra), t_C, m_C)
        return (carry[0] + nll, carry[1] + z), None

    zero = jnp.zeros((), jnp.float32)
    (nll_sum, z_sum), _ = jax.lax.scan(body, (zero, zero), xs)
    return nll_sum, z_sum


def masked_sums(lse_N: jax.Array, target_N: jax.Array, mask_N: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of masked NLL, sum of masked logsumexp^2) from per-token logsumexp and target logit, as
    `cross_entropy_sums` forms them (a masked-out token adds exactly 0)."""
    keep_N = mask_N != 0
    mask_N = mask_N.astype(jnp.float32)
    nll_N = jnp.where(keep_N, (lse_N - target_N) * mask_N, 0.0)
    return jnp.sum(nll_N), jnp.sum(jnp.where(keep_N, lse_N * lse_N * mask_N, 0.0))


def loss_kernel(choice: str, model: ModelConfig, fp8: FP8Config, platform: str | None = None) -> str:
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
