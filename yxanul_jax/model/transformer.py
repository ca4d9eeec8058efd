"""The Yxanul decoder-only transformer in Flax linen: RMSNorm, RoPE, GQA, SwiGLU, factorized embedding.

Shapes are in names: B batch, L sequence, D d_model, H query heads, G kv heads, K head dim,
F ffn width, R embedding rank, V vocabulary. Parameters are float32 (master weights) and carry
logical axis names (`embed`, `heads`, `kv_heads`, `mlp`, `vocab`, `embed_rank`, `layers`) that
the sharding rules map onto mesh axes. Activations run in `ModelConfig.dtype` (bfloat16 by
default); the projections named in `FP8Config.targets` run through an FP8 dense backend.

Typical use::

    model = Yxanul(cfg.model, cfg.fp8)
    variables = model.init(key, tokens_BxL)            # {"params": ..., "fp8_meta": ...}
    logits_BxLxV = model.apply(variables, tokens_BxL)
    h_BxLxD = model.apply(variables, tokens_BxL, method=Yxanul.hidden)   # for a chunked loss
    logits_NxV = model.apply(variables, h_NxD, method=Yxanul.logits)
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from yxanul_jax.core import scopes
from yxanul_jax.core.config import FP8Config, ModelConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.backends import PLAIN, Plain, dense_backend

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


def _logical_param(module: nn.Module, name: str, init, shape, axes):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def _norm_scale(module: nn.Module, features: int, gain: float = 1.0):
    """A norm's float32 `scale` [D] (RMSNorm's, or the same parameter given to a fused TE layer)."""
    return _logical_param(module, "scale", nn.initializers.constant(gain), (features,), ("embed",))


class NormScale(nn.Module):
    """Only the `scale` of an RMSNorm, for a layer that fuses the norm (`fp8.te_layers`): same name, init, axes."""

    features: int

    @nn.compact
    def __call__(self) -> jax.Array:
        return _norm_scale(self, self.features)


class Kernel(nn.Module):
    """Only the `kernel` [I, O] of a `Dense`, for a layer that fuses the projection: same name, init, axes."""

    in_features: int
    features: int
    axes: tuple[str, str]
    std: float

    @nn.compact
    def __call__(self) -> jax.Array:
        return _kernel(self, self.in_features, self.features, self.axes, self.std)


class Fp8State(nn.Module):
    """One GEMM's FP8 state where a `Matmul` would keep it (its `gemm`), for GEMMs run together (`backend.dots`)."""

    backend: Any

    @nn.compact
    def __call__(self) -> tuple[dict[str, jax.Array], ...]:
        return self.backend.metas(self)


class DenseOperands(nn.Module):
    """A `Dense`'s kernel and FP8 state under its name, for GEMMs of one input run together (`backend.dots`):
    the same parameters, init and state paths as `Dense`, so checkpoints do not tell them apart."""

    in_features: int
    features: int
    axes: tuple[str, str]
    std: float
    backend: Any

    @nn.compact
    def __call__(self) -> tuple[jax.Array, tuple[dict[str, jax.Array], ...]]:
        return _kernel(self, self.in_features, self.features, self.axes, self.std), Fp8State(self.backend, name="gemm")()


def _kernel(module: nn.Module, in_features: int, features: int, axes, std: float):
    return _logical_param(module, "kernel", _normal(std), (in_features, features), axes)


class RMSNorm(nn.Module):
    """y = x / rms(x) * scale, computed in float32; `scale` starts at `gain`."""

    eps: float
    dtype: Any
    gain: float = 1.0

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        scale_D = _norm_scale(self, x_BxLxD.shape[-1], self.gain)
        x32 = x_BxLxD.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale_D.reshape((1,) * (y.ndim - 1) + (-1,))).astype(self.dtype)


INIT_LOGIT_STD = 0.1
"""Std of an untrained model's logits: its loss is then ln V + 0.1**2 / 2 = ln V + 0.005."""


def head_gain(c: ModelConfig) -> float:
    """Initial gain of the final norm, so that the untrained logits have std INIT_LOGIT_STD at most.

    The final norm's output h has unit RMS, so the logits' std is the gain times the std of the
    output weights' response to a unit vector. Every weight is drawn at init_std (embed_proj at
    1/sqrt(R)), so that response is: sqrt(D) * init_std for a full-width table (tied or untied);
    D / sqrt(R) * init_std for the tied factorized head (h starts in embed_proj's row space, which
    embed_proj maps back with gain sqrt(D / R)); sqrt(D * R) * init_std^2 for the own `head_proj`.
    Without the gain a tied 128-wide head starts at logit std 0.45, 0.10 nats above ln V, and a
    768-wide one at 0.6, 0.2 nats above: the first steps are spent only shrinking the logits. Scaling
    the gain (not the weights) leaves the input embedding at init_std, keeps the head an ordinary
    RMSNorm + matmul (exported to Llama's `norm.weight` as is), and the gain is learned from there.
    """
    D, R, s = c.d_model, c.embed_rank, c.init_std
    if c.head == "factorized":
        response = math.sqrt(D * R) * s * s
    elif c.head == "tied" and R:
        response = D / math.sqrt(R) * s
    else:
        response = math.sqrt(D) * s
    return min(1.0, INIT_LOGIT_STD / response)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """sin, cos tables [L, K/2] for positions 0..L-1 (float32)."""
    return rope_at(jnp.arange(seq_len), head_dim, theta)


def rope_at(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """sin, cos [..., K/2] for integer positions of any shape ([L], or [B, T] when decoding)."""
    inv_freq_K2 = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq_K2.reshape((1,) * positions.ndim + (-1,))
    return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x_BxLxHxK: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotate channel pairs (i, i + K/2) by position-dependent angles (GPT-NeoX/Llama layout).

    sin, cos are [L, K/2] (the same positions for every row) or [B, L, K/2] (per-row positions)."""
    x = x_BxLxHxK.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    if sin.ndim == 2:
        sin, cos = sin[None, :, None, :], cos[None, :, None, :]
    else:
        sin, cos = sin[:, :, None, :], cos[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxLxHxK.dtype)


class Matmul(nn.Module):
    """x[..., I] @ w[I, O] through the dense `backend` (`backends.dense_backend`); owns this GEMM's FP8 state.

    The FP8 state changes only through differentiation: take gradients with `fp8.value_and_grad`
    (the new state comes back as the state's "gradient"), not w.r.t. the params alone. An FP8 GEMM
    whose I or O is not a multiple of 16 (what FP8 tensor-core GEMMs need) runs plain, with one
    warning; the decision depends on static shapes only, so init and apply agree.
    """

    backend: Any
    dtype: Any
    target: str = ""

    @nn.compact
    def __call__(self, x: jax.Array, w_IxO: jax.Array) -> jax.Array:
        backend = self.backend
        if backend.is_fp8 and not fp8_lib.gemm_aligned(*w_IxO.shape):
            fp8_lib.warn_unaligned(self.target or self.name, tuple(w_IxO.shape))
            backend = PLAIN
        return backend.dot(self, x, w_IxO, self.dtype, self.target)


class Dense(nn.Module):
    """A bias-free projection with a float32 kernel [I, O] named by logical axes, run by `backend`
    (FP8 for an FP8 backend: train it through `fp8.value_and_grad`, see `Matmul`)."""

    features: int
    axes: tuple[str, str]
    std: float
    backend: Any
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel_IxO = _kernel(self, x.shape[-1], self.features, self.axes, self.std)
        return Matmul(self.backend, self.dtype, self.name, name="gemm")(x, kernel_IxO)


def _dense(cfg: ModelConfig, backend, target: str, features: int, axes, std: float):
    return Dense(features, axes, std, backend.for_target(target), DTYPES[cfg.dtype], name=target)


def _fused_matmul(cfg: ModelConfig, backend, name: str, parts: tuple[str, ...]) -> Matmul:
    """The GEMM of projections fused side by side (`model.fuse_projections`, `fuse_mlp`): FP8 when every part is
    an FP8 target (one state, one quantized input), else plain."""
    fp8 = all(backend.for_target(t) is backend for t in parts) and backend.is_fp8
    return Matmul(backend if fp8 else backend.for_target("none"), DTYPES[cfg.dtype], name, name=name)


# `model.attention: auto` runs `short_attention` on a GPU up to SHORT_ATTENTION_MAX_SEQ tokens: cuDNN's flash
# kernels work in 64 x 128 tiles and lose to plain attention below them. Measured (scripts/attention_check.py,
# one yxanul-197m layer forward + backward at each stage's batch, H200, jax 0.11.2, 2026-11-26): cuDNN / XLA
# 5.85 / 0.96 ms at seq 8, 6.45 / 2.08 at 16, 4.18 / 2.00 at 32, 2.89 / 2.53 at 64; stage 0 of the FP8 step
# went from 450 to 306 ms. At 64 (one tile) the 13 % is one measurement and plain attention keeps the L x L
# scores, so cuDNN stays from 64 on. One GPU measured it; the rule is applied to every GPU (an H100 has the
# same SMs). `short_attention` replaced XLA's own up to 32 tokens when its products became GEMMs in the tokens'
# layout: XLA's attention first transposes q, k and v head-major, and those transposes ran at 10x their
# bandwidth time (H200 profile of stage 2, 2026-11-26: 54 of 510 ms). Predicted with the H200 calibrated on
# that profile (analyze --target, 197m FP8): stage 0 247.4 -> 229.1 ms, stage 1 490.1 -> 451.1, stage 2
# 510.0 -> 484.3 (H200 measured 510.5 before).
SHORT_ATTENTION_MAX_SEQ = 32


def attention_implementation(cfg: ModelConfig, platform: str | None = None, seq_len: int | None = None) -> str:
    """`auto`: on a GPU, `short_attention` for sequences of at most `SHORT_ATTENTION_MAX_SEQ` tokens, cuDNN
    flash attention beyond for BF16/FP16 with head_dim <= 128 (jax's own default would pick XLA's, which stores
    the L x L scores), XLA's otherwise; XLA's everywhere else. `platform` defaults to jax's default backend;
    without `seq_len` the answer is that of long sequences."""
    if cfg.attention != "auto":
        return cfg.attention
    if (platform or jax.default_backend()) != "gpu":
        return "xla"
    if seq_len is not None and seq_len <= SHORT_ATTENTION_MAX_SEQ:
        return "short"
    return "cudnn" if cfg.dtype == "bfloat16" and cfg.resolved_head_dim <= 128 else "xla"


def check_attention_platform(cfg: ModelConfig, platform: str, fix: str = "use model.attention=auto or xla here") -> None:
    """UserError when `model.attention: cudnn` is forced on a machine without an NVIDIA GPU (`platform`, jax's):
    found before a run writes anything, where jax would fail deep in the first compile."""
    if cfg.attention == "cudnn" and platform != "gpu":
        raise UserError(f"model.attention=cudnn needs an NVIDIA GPU with cuDNN (this machine runs {platform}); {fix}")


@jax.custom_vjp
def _scores_f32(q_BxIxK, k_BxJxK):
    """q k^T per row of the batch with float32 outputs, whose backward runs its GEMMs in the operands' dtype:
    the score gradient is rounded to it first, as flash attention's kernels do. Left to autodiff, the float32
    gradient would turn both backward GEMMs float32 (TF32 on a GPU, their operands converted: sm_90 compile)."""
    return jnp.einsum("bik,bjk->bij", q_BxIxK, k_BxJxK, preferred_element_type=jnp.float32)


def _scores_fwd(q_BxIxK, k_BxJxK):
    return _scores_f32(q_BxIxK, k_BxJxK), (q_BxIxK, k_BxJxK)


def _scores_bwd(res, ds_BxIxJ):
    q_BxIxK, k_BxJxK = res
    ds_BxIxJ = ds_BxIxJ.astype(q_BxIxK.dtype)
    f32 = jnp.float32
    dq_BxIxK = jnp.einsum("bij,bjk->bik", ds_BxIxJ, k_BxJxK, preferred_element_type=f32).astype(q_BxIxK.dtype)
    dk_BxJxK = jnp.einsum("bij,bik->bjk", ds_BxIxJ, q_BxIxK, preferred_element_type=f32).astype(k_BxJxK.dtype)
    return dq_BxIxK, dk_BxJxK


_scores_f32.defvjp(_scores_fwd, _scores_bwd)


def short_attention(q_BxLxHxK: jax.Array, k_BxLxGxK: jax.Array, v_BxLxGxK: jax.Array) -> jax.Array:
    """Causal grouped-query attention for short sequences as two batched GEMMs per row of the batch, in the
    tokens' own layout: a row's L x H queries against its L x G keys ([L*H, K] x [K, L*G]: reshapes, no
    transposes), the pairs of another kv head or a later token masked before the softmax, and the
    probabilities times the row's L x G values. It computes 2 G times the scores it needs, a few MFLOP per
    row at 32 tokens, and in exchange every product runs on tensor cores: as broadcast products summed over K
    (its first form) XLA ran them as reductions at 8-16x their bandwidth time (H200, stage 0 of yxanul-197m,
    2026-11-26: 51 of the step's 268 ms). The numerics of `jax.nn.dot_product_attention(implementation="xla")`
    in the forward pass: float32 scores (float32 accumulation of the operands' products) scaled by 1 / sqrt(K),
    a float32 softmax, probabilities rounded to the value dtype, float32 sums; in the backward pass the score
    gradient is rounded to the operands' dtype before its GEMMs (`_scores_f32`)."""
    B, L, H, K = q_BxLxHxK.shape
    G = k_BxLxGxK.shape[2]
    f32 = jnp.float32
    q_BxIxK = q_BxLxHxK.reshape(B, L * H, K)  # i = (t, h): token-major, as stored
    k_BxJxK = k_BxLxGxK.reshape(B, L * G, K)  # j = (s, g)
    v_BxJxK = v_BxLxGxK.reshape(B, L * G, K)
    if q_BxLxHxK.dtype == f32:  # float32 products (a GPU would round them to TF32), float32 gradients
        s_BxIxJ = jnp.einsum("bik,bjk->bij", q_BxIxK, k_BxJxK, precision=jax.lax.Precision.HIGHEST)
    else:
        s_BxIxJ = _scores_f32(q_BxIxK, k_BxJxK)
    i_I, j_J = jnp.arange(L * H), jnp.arange(L * G)
    allowed_IxJ = ((j_J[None, :] // G) <= (i_I[:, None] // H)) & ((j_J[None, :] % G) == (i_I[:, None] % H) // (H // G))
    s_BxIxJ = jnp.where(allowed_IxJ[None], s_BxIxJ * (K ** -0.5), -jnp.inf)
    p_BxIxJ = jax.nn.softmax(s_BxIxJ, axis=-1).astype(v_BxLxGxK.dtype)
    precision = jax.lax.Precision.HIGHEST if v_BxLxGxK.dtype == f32 else None
    o_BxIxK = jnp.einsum("bij,bjk->bik", p_BxIxJ, v_BxJxK, precision=precision)  # float32 sums inside the GEMM
    return o_BxIxK.reshape(B, L, H, K).astype(q_BxLxHxK.dtype)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE through `jax.nn.dot_product_attention`.

    Training: `cache=None`, the L tokens attend causally to each other. Decoding: `cache` holds this
    layer's keys and values {"k", "v": [B, S, G, K]} (kv heads only); the new tokens' keys and values
    are written at `positions` [B, L] and every token attends to the cached positions <= its own.
    Returns (output, updated cache or None).
    """

    cfg: ModelConfig
    backend: Any

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, sin_LxK2: jax.Array, cos_LxK2: jax.Array,
                 cache: dict[str, jax.Array] | None = None, positions_BxL: jax.Array | None = None,
                 norm_scale_D: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        """`norm_scale_D` given (the backend fuses norms): x is the block's un-normalized input, and the
        backend's fused RMSNorm + GEMM computes q, k, v in one (their kernels side by side, names unchanged)."""
        c = self.cfg
        B, L, D = x_BxLxD.shape
        H, G, K = c.n_heads, c.n_kv_heads, c.resolved_head_dim
        out_std = c.init_std / math.sqrt(2 * c.n_layers)
        if norm_scale_D is not None:
            kernels = [Kernel(D, n * K, ("embed", axis), c.init_std, name=t)()
                       for t, n, axis in (("q", H, "heads"), ("k", G, "kv_heads"), ("v", G, "kv_heads"))]
            qkv_BxLxO = self.backend.norm_dense(c.norm_eps, name="qkv")(x_BxLxD, norm_scale_D, kernels)
            q, k, v = jnp.split(qkv_BxLxO, [H * K, (H + G) * K], axis=-1)
            q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = q.reshape(B, L, H, K), k.reshape(B, L, G, K), v.reshape(B, L, G, K)
        elif c.fuse_projections:
            kernels = [Kernel(D, n * K, ("embed", axis), c.init_std, name=t)()
                       for t, n, axis in (("q", H, "heads"), ("k", G, "kv_heads"), ("v", G, "kv_heads"))]
            qkv_BxLxO = _fused_matmul(c, self.backend, "qkv", ("q", "k", "v"))(x_BxLxD, jnp.concatenate(kernels, axis=1))
            # The gradient of qkv is the concatenation of dq, dk (after RoPE's backward) and dv. Written once, it
            # is one contiguous read for FP8's amax and cast (one kernel), dx and the weight gradient; left to
            # fusion, the amax and the cast each re-read the three parts through a concatenation (H200: 9.4 ms each
            # at stage 9). analyze --target h100, 197m stage 9: FP8 634.5 -> 629.6 ms, BF16 656.8 -> 646.3.
            qkv_BxLxO = materialized_grad(qkv_BxLxO)
            q, k, v = jnp.split(qkv_BxLxO, [H * K, (H + G) * K], axis=-1)
            q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = q.reshape(B, L, H, K), k.reshape(B, L, G, K), v.reshape(B, L, G, K)
        else:
            q_BxLxHxK = _dense(c, self.backend, "q", H * K, ("embed", "heads"), c.init_std)(x_BxLxD).reshape(B, L, H, K)
            k_BxLxGxK = _dense(c, self.backend, "k", G * K, ("embed", "kv_heads"), c.init_std)(x_BxLxD).reshape(B, L, G, K)
            v_BxLxGxK = _dense(c, self.backend, "v", G * K, ("embed", "kv_heads"), c.init_std)(x_BxLxD).reshape(B, L, G, K)
        q_BxLxHxK = apply_rope(q_BxLxHxK, sin_LxK2, cos_LxK2)
        k_BxLxGxK = apply_rope(k_BxLxGxK, sin_LxK2, cos_LxK2)
        if cache is None:
            impl = attention_implementation(c, seq_len=L)
            with jax.named_scope(scopes.ATTENTION):
                if impl == "short":
                    o_BxLxHxK = short_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
                else:
                    o_BxLxHxK = jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, is_causal=True,
                                                             implementation=impl)
        else:
            rows_Bx1 = jnp.arange(B)[:, None]
            k_BxSxGxK = cache["k"].at[rows_Bx1, positions_BxL].set(k_BxLxGxK.astype(cache["k"].dtype))
            v_BxSxGxK = cache["v"].at[rows_Bx1, positions_BxL].set(v_BxLxGxK.astype(cache["v"].dtype))
            cache = {"k": k_BxSxGxK, "v": v_BxSxGxK}
            S = k_BxSxGxK.shape[1]
            visible_BxLxS = jnp.arange(S).reshape(1, 1, S) <= positions_BxL[:, :, None]
            o_BxLxHxK = jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK.astype(q_BxLxHxK.dtype),
                                                     v_BxSxGxK.astype(q_BxLxHxK.dtype),
                                                     mask=visible_BxLxS[:, None, :, :], implementation="xla")
        out = _dense(c, self.backend, "o", D, ("heads", "embed"), out_std)(o_BxLxHxK.reshape(B, L, H * K))
        return out, cache


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """silu(gate) * up, computed in float32 and rounded once. Its backward is one expression of (gate, up, dh)
    with two outputs in float32: XLA fuses it into one kernel (autodiff's graph of the same math compiled to
    three for sm_90). The float32 forward lets XLA fuse it into the down projection's FP8 cast (one kernel reads
    gate and up and writes the FP8 input; `nn.silu` in BF16 kept a BF16 product of its own: analyze --target
    h100, yxanul-197m stage 9, 514.3 -> 507.0 ms, 2026-11-27)."""
    g, u = gate.astype(jnp.float32), up.astype(jnp.float32)
    return (g * jax.nn.sigmoid(g) * u).astype(jnp.result_type(gate, up))


def _swiglu_fwd(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(res, dh):
    gate, up = res
    g, u, d = (a.astype(jnp.float32) for a in (gate, up, dh))
    sig = jax.nn.sigmoid(g)
    d_up = d * g * sig
    d_gate = d * u * sig * (1.0 + g * (1.0 - sig))
    return d_gate.astype(gate.dtype), d_up.astype(up.dtype)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


@jax.custom_vjp
def materialized_grad(x: jax.Array) -> jax.Array:
    """x, whose gradient is written to memory whole before anything reads it (an `optimization_barrier`: XLA
    may not fuse the gradient's producers into its consumers)."""
    return x


def _materialized_fwd(x):
    return x, None


def _materialized_bwd(_, g):
    return (jax.lax.optimization_barrier(g),)


materialized_grad.defvjp(_materialized_fwd, _materialized_bwd)


def fuse_mlp(cfg: ModelConfig, backend: Plain) -> bool:
    """Whether gate and up run as one GEMM: `model.fuse_mlp` and neither is an FP8 GEMM. Under FP8 they stay
    two: XLA then recomputes the down GEMM's input (remat) in a kernel of its own instead of inside the SwiGLU
    backward's (analyze --target h100, yxanul-197m stage 9, jax 0.10.2, 2026-11-27: FP8 629.6 -> 637.8 ms
    fused, even with a backward written as one element-wise kernel over a [N, 2, F] view; BF16 646.3 -> 631.8,
    where XLA writes the two halves' gradients into the joint one from the SwiGLU backward's own kernel). With FP8
    weight gradients they share one FP8 cast instead (`shares_fp8_input`): fused they were 517.2 against 507.0 ms
    (ninth session), the joint gradient's amax taking a kernel of its own."""
    return cfg.fuse_mlp and not any(backend.for_target(t).is_fp8 for t in ("gate", "up"))


def shares_fp8_input(cfg: ModelConfig, backend: Plain) -> bool:
    """Whether gate and up run as two FP8 GEMMs of one FP8 cast of their input (`backend.dots`): both FP8 targets
    of a backend that shares inputs, with FP8-aligned shapes. One cast and one transposed copy for the weight
    gradients instead of two (analyze --target h100, yxanul-197m stage 9, 2026-11-27: 502.7 -> 497.8 ms)."""
    return (backend.shares_inputs and all(backend.for_target(t) is backend for t in ("gate", "up"))
            and fp8_lib.gemm_aligned(cfg.d_model, cfg.ffn_dim))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    cfg: ModelConfig
    backend: Any

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, norm_scale_D: jax.Array | None = None) -> jax.Array:
        """`norm_scale_D` given (the backend fuses norms): x is un-normalized, and the backend's fused layer
        runs RMSNorm, gate/up, SwiGLU and down on these same kernels."""
        c = self.cfg
        out_std = c.init_std / math.sqrt(2 * c.n_layers)
        if norm_scale_D is not None:
            D, F = x_BxLxD.shape[-1], c.ffn_dim
            gate_DxF = Kernel(D, F, ("embed", "mlp"), c.init_std, name="gate")()
            up_DxF = Kernel(D, F, ("embed", "mlp"), c.init_std, name="up")()
            down_FxD = Kernel(F, D, ("mlp", "embed"), out_std, name="down")()
            return self.backend.norm_swiglu(c.norm_eps, name="fused")(x_BxLxD, norm_scale_D, gate_DxF, up_DxF,
                                                                      down_FxD)
        if fuse_mlp(c, self.backend):
            D, F = x_BxLxD.shape[-1], c.ffn_dim
            kernels = [Kernel(D, F, ("embed", "mlp"), c.init_std, name=t)() for t in ("gate", "up")]
            gu_BxLx2F = _fused_matmul(c, self.backend, "gate_up", ("gate", "up"))(x_BxLxD,
                                                                                   jnp.concatenate(kernels, axis=1))
            h_BxLxF = swiglu(gu_BxLx2F[..., :F], gu_BxLx2F[..., F:])  # its gradient: one [N, 2F] write
        elif shares_fp8_input(c, self.backend):
            D, F = x_BxLxD.shape[-1], c.ffn_dim
            ws, metas = zip(*(DenseOperands(D, F, ("embed", "mlp"), c.init_std, self.backend, name=t)()
                              for t in ("gate", "up")))
            gate_BxLxF, up_BxLxF = self.backend.dots(x_BxLxD, ws, metas, DTYPES[c.dtype], ("gate", "up"))
            h_BxLxF = swiglu(gate_BxLxF, up_BxLxF)
        else:
            gate_BxLxF = _dense(c, self.backend, "gate", c.ffn_dim, ("embed", "mlp"), c.init_std)(x_BxLxD)
            up_BxLxF = _dense(c, self.backend, "up", c.ffn_dim, ("embed", "mlp"), c.init_std)(x_BxLxD)
            h_BxLxF = swiglu(gate_BxLxF, up_BxLxF)
        return _dense(c, self.backend, "down", c.d_model, ("mlp", "embed"), out_std)(h_BxLxF)


class Block(nn.Module):
    """Pre-norm transformer block; (x, sin, cos, cache, positions) -> (x, cache) so it can be scanned
    (the cache is this layer's slice when decoding, None in training)."""

    cfg: ModelConfig
    backend: Any

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, sin_LxK2: jax.Array, cos_LxK2: jax.Array,
                 cache: dict[str, jax.Array] | None = None,
                 positions_BxL: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        c, dt = self.cfg, DTYPES[self.cfg.dtype]
        if self.backend.fuses_norms(c):  # each norm fused into the layer after it: same parameters
            D = x_BxLxD.shape[-1]
            attn_BxLxD, cache = Attention(c, self.backend, name="attn")(x_BxLxD, sin_LxK2, cos_LxK2, cache, positions_BxL,
                                                                     NormScale(D, name="attn_norm")())
            x_BxLxD = x_BxLxD + attn_BxLxD
            return x_BxLxD + SwiGLU(c, self.backend, name="mlp")(x_BxLxD, NormScale(D, name="mlp_norm")()), cache
        attn_BxLxD, cache = Attention(c, self.backend, name="attn")(RMSNorm(c.norm_eps, dt, name="attn_norm")(x_BxLxD),
                                                                 sin_LxK2, cos_LxK2, cache, positions_BxL)
        x_BxLxD = x_BxLxD + attn_BxLxD
        x_BxLxD = x_BxLxD + SwiGLU(c, self.backend, name="mlp")(RMSNorm(c.norm_eps, dt, name="mlp_norm")(x_BxLxD))
        return x_BxLxD, cache


HEAD_MODULE = "head_gemm"
"""The output head's GEMM module: its FP8 state sits under this name in every FP8 collection (ours or TE's)."""
STACKED = "layers"
"""The scanned layers' module (`model.scan_layers`) and the logical axis of their stacked parameters: every
parameter under it has a leading [n_layers] axis (unscanned layers are modules `layer_<i>`, unstacked)."""


def stacked_axes(path: jax.tree_util.KeyPath) -> int:
    """1 for a parameter under the scanned layers (`STACKED`: a leading layer axis), else 0; `path` a pytree key path."""
    return int(any(getattr(k, "key", k) == STACKED for k in path))


def split_head_state(fp8_state: dict) -> tuple[dict, dict | None]:
    """(FP8 state of the body, {collection: the head's state} or None when the head has none): the loss
    runs the head once per chunk, each with its own copy of the head's state."""
    body = {c: {k: v for k, v in tree.items() if k != HEAD_MODULE} for c, tree in fp8_state.items()}
    head = {c: tree[HEAD_MODULE] for c, tree in fp8_state.items() if HEAD_MODULE in tree}
    return body, head or None


def join_head_state(body: dict, head: dict | None) -> dict:
    """The inverse of `split_head_state` (`body` may lack a collection the head has: `join_head_state({}, head)`
    is the head's state alone, as variables)."""
    if head is None:
        return body
    return {c: {**body.get(c, {}), **({HEAD_MODULE: head[c]} if c in head else {})} for c in {**body, **head}}


CUDNN_ATTENTION_FWD = "dot_product_attention_fwd_wrapper"
"""The primitive of cuDNN's flash-attention forward inside `jax.nn.dot_product_attention` (jax's own name;
a policy cannot name it with `checkpoint_name`, the call is inside jax)."""


def _save_attention(prim, *_, **__) -> bool:
    """Save the cuDNN attention forward's outputs (o and its softmax statistics), recompute the rest."""
    return prim.name == CUDNN_ATTENTION_FWD


REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "attention": _save_attention,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _check_ids(tokens_BxL) -> None:
    if tokens_BxL.ndim != 2:
        raise ValueError(f"token ids must be [batch, length], got shape {tuple(tokens_BxL.shape)}; "
                         "add a batch axis (tokens[None])")


class Yxanul(nn.Module):
    """Decoder-only LM. `__call__(tokens_BxL) -> logits_BxLxV` (float32)."""

    cfg: ModelConfig
    fp8: FP8Config

    def setup(self) -> None:
        c = self.cfg
        c.check()  # a ModelConfig built directly: its mistakes named here, not as a shape error deep inside
        backend = dense_backend(self.fp8)  # chosen once; the layers receive it
        V, D, R = c.padded_vocab, c.d_model, c.embed_rank
        if R:
            self.embedding = _logical_param(self, "embedding", _normal(c.init_std), (V, R), ("vocab", "embed_rank"))
            # 1/sqrt(R) keeps the product table @ proj at std init_std.
            self.embed_proj = _logical_param(self, "embed_proj", _normal(1.0 / math.sqrt(R)), (R, D),
                                             ("embed_rank", "embed"))
        else:
            self.embedding = _logical_param(self, "embedding", _normal(c.init_std), (V, D), ("vocab", "embed"))
        if c.head == "factorized":
            self.head_proj = _logical_param(self, "head_proj", _normal(c.init_std), (D, R), ("embed", "embed_rank"))
        elif c.head == "untied":
            self.head_kernel = _logical_param(self, "head_kernel", _normal(c.init_std), (D, V), ("embed", "vocab"))
        block = Block
        if c.remat != "none":  # `auto` is resolved per stage for training; without gradients any policy is moot
            policy = REMAT_POLICIES["full" if c.remat == "auto" else c.remat]
            block = nn.remat(Block, policy=policy, prevent_cse=not c.layer_loop)  # CSE would undo it unrolled
        if c.scan_layers:
            self.layers = nn.scan(block, variable_axes={True: 0}, split_rngs={"params": True},
                                  in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast), length=c.n_layers,
                                  unroll=c.scan_unroll,
                                  metadata_params={nn.PARTITION_NAME: STACKED})(c, backend, name=STACKED)
        else:
            self.layers = [block(c, backend, name=f"layer_{i}") for i in range(c.n_layers)]
        self.final_norm = RMSNorm(c.norm_eps, DTYPES[c.dtype], head_gain(c))
        self.head_gemm = Matmul(backend.for_target("head"), DTYPES[c.dtype], "head")  # named HEAD_MODULE

    def embed(self, tokens_BxL: jax.Array) -> jax.Array:
        """Token ids -> residual stream x_BxLxD (compute dtype). Ids must be in [0, vocab_size): under jit
        nothing checks them, and one outside reads another row (negative) or gives NaN (too large)."""
        _check_ids(tokens_BxL)
        dt = DTYPES[self.cfg.dtype]
        rows = jnp.take(self.embedding, tokens_BxL, axis=0).astype(dt)
        if self.cfg.embed_rank:
            return jnp.einsum("blr,rd->bld", rows, self.embed_proj.astype(dt))
        return rows

    def hidden(self, tokens_BxL: jax.Array) -> jax.Array:
        """Final-normed hidden states h_BxLxD, before the output head."""
        c = self.cfg
        _check_ids(tokens_BxL)
        sin_LxK2, cos_LxK2 = rope_tables(tokens_BxL.shape[1], c.resolved_head_dim, c.rope_theta)
        h_BxLxD, _ = self._trunk(tokens_BxL, sin_LxK2, cos_LxK2, None, None)
        return h_BxLxD

    def _trunk(self, tokens_BxL, sin, cos, cache, positions_BxL):
        """Embedding, the blocks and the final norm; the cache is stacked [n_layers, ...] or None."""
        x_BxLxD = self.embed(tokens_BxL)
        if self.cfg.scan_layers:
            x_BxLxD, cache = self.layers(x_BxLxD, sin, cos, cache, positions_BxL)
        else:
            new = []
            for i, layer in enumerate(self.layers):
                layer_cache = None if cache is None else jax.tree_util.tree_map(lambda a: a[i], cache)
                x_BxLxD, layer_cache = layer(x_BxLxD, sin, cos, layer_cache, positions_BxL)
                new.append(layer_cache)
            cache = None if cache is None else jax.tree_util.tree_map(lambda *a: jnp.stack(a), *new)
        return self.final_norm(x_BxLxD), cache

    def decode(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
               cache: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """One decoding call with a KV cache: T new tokens per row at `positions` [B, T] (a prefill
        when T > 1, one generated token when T = 1). `cache` is `init_cache(...)`'s layout. Returns
        (float32 logits [B, T, vocab_size], updated cache). Every position must be below the cache's length
        (`max_len`): under jit nothing checks it, and a write past the end is dropped, so the logits go wrong
        silently (`inference.sampling.generate` sizes the cache for the prompt and the new tokens)."""
        c = self.cfg
        _check_ids(tokens_BxT)
        sin_BxTxK2, cos_BxTxK2 = rope_at(positions_BxT, c.resolved_head_dim, c.rope_theta)
        h_BxTxD, cache = self._trunk(tokens_BxT, sin_BxTxK2, cos_BxTxK2, cache, positions_BxT)
        return self.logits(h_BxTxD)[..., :c.vocab_size], cache

    def head_operands(self, h_NxD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The output head as one GEMM: (x_NxK, w_KxV) with logits = x @ w. K is embed_rank for a head
        through the rank-r factors (tied with embed_rank, factorized), d_model otherwise."""
        c, dt = self.cfg, DTYPES[self.cfg.dtype]
        if c.head == "untied":
            return h_NxD, self.head_kernel
        if c.embed_rank:  # d -> r -> vocab through the shared vocab x r table
            proj_DxR = self.head_proj if c.head == "factorized" else self.embed_proj.T
            h_NxR = jax.lax.dot_general(h_NxD.astype(dt), proj_DxR.astype(dt), (((h_NxD.ndim - 1,), (0,)), ((), ())),
                                        preferred_element_type=dt)
            return h_NxR, self.embedding.T
        return h_NxD, self.embedding.T

    def logits(self, h_NxD: jax.Array) -> jax.Array:
        """Output head: h[..., D] -> float32 logits[..., padded_vocab]; the padded columns are -inf
        (zero probability, never a target, never sampled). `__call__` drops them."""
        return self.head_logits(h_NxD).astype(jnp.float32)

    def head_logits(self, h_NxD: jax.Array) -> jax.Array:
        """`logits` in the head GEMM's own dtype (BF16 for a BF16 model: the GEMM rounds to it), what the chunked
        loss reads (`loss.cross_entropy_sums` computes in float32 and returns its gradient in this dtype)."""
        c = self.cfg
        x_NxK, w_KxV = self.head_operands(h_NxD)
        logits = self.head_gemm(x_NxK, w_KxV)
        if c.padded_vocab > c.vocab_size:  # a [V] bias of 0 / -inf: no [N x V] mask or -inf array anywhere
            bias_V = jnp.where(jnp.arange(c.padded_vocab) < c.vocab_size, 0.0, -jnp.inf).astype(logits.dtype)
            logits = logits + bias_V.reshape((1,) * (logits.ndim - 1) + (-1,))
        return logits

    def fused_loss_terms(self, h_NxD: jax.Array, targets_N: jax.Array, interpret: bool = False,
                         tiles: str = "default") -> tuple[jax.Array, jax.Array]:
        """(lse_N, target logit_N) of the head's logits by the fused kernels (`model.fused_ce`): the
        logits never exist in memory. The head must not be FP8 (`loss.loss_kernel` checks). `tiles`: the
        kernels' tiles (`core.tiles.parse_tiles`, `train.fused_ce_tiles`)."""
        from yxanul_jax.core.tiles import parse_tiles
        from yxanul_jax.model.fused_ce import linear_cross_entropy

        x_NxK, w_KxV = self.head_operands(h_NxD)
        dt = DTYPES[self.cfg.dtype]
        return linear_cross_entropy(x_NxK.astype(dt), w_KxV.T.astype(dt), targets_N, self.cfg.vocab_size, interpret,
                                    parse_tiles(tiles))

    def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
        """Token ids [B, L] -> float32 logits [B, L, vocab_size]."""
        return self.logits(self.hidden(tokens_BxL))[..., :self.cfg.vocab_size]


def init_cache(cfg: ModelConfig, batch: int, max_len: int,
               dtype: jax.typing.DTypeLike = jnp.float32) -> dict[str, jax.Array]:
    """An empty KV cache for `Yxanul.decode`: {"k", "v": [n_layers, B, max_len, kv heads, head_dim]}; it holds
    positions 0 .. max_len - 1 (decoding past them goes silently wrong)."""
    shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.resolved_head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def abstract_variables(cfg: ModelConfig, fp8: FP8Config, seq_len: int = 8) -> dict:
    """Shapes/dtypes of all variables (no memory allocated), with logical-partitioning boxes removed."""
    model = Yxanul(cfg, fp8)
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    boxed = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return nn.meta.unbox(boxed)


def init_variables(cfg: ModelConfig, fp8: FP8Config, key: jax.Array, seq_len: int = 8) -> dict:
    """Concrete variables with logical-partitioning boxes removed."""
    tokens = jnp.zeros((1, seq_len), jnp.int32)
    return nn.meta.unbox(Yxanul(cfg, fp8).init(key, tokens))
