"""FP8 dense backends (native XLA delayed scaling, Transformer Engine, none) and FP8-state helpers.

The `xla` backend quantizes both GEMM operands to E4M3 in the forward pass and the output
gradient to E5M2 in the backward pass (the HYBRID recipe), each with a per-tensor scale taken
from an amax history of earlier steps (delayed scaling). The GEMM itself is written as
dequantize -> dot, the pattern XLA's GPU GEMM rewriter turns into one cuBLASLt FP8 GEMM with the
scales fused; on CPU the same graph runs as emulation, which is what the tests check.

FP8 state is not a gradient. Each FP8 dense layer keeps, per operand (`input`, `kernel`,
`grad`), an `amax_history` [H] and the `scale` to use on the next step in the Flax collection
`fp8_meta`. The train step differentiates the loss w.r.t. this collection too; the custom VJP
returns the *updated state* as its "cotangent" (the overwrite-with-gradient trick), which the
train step then takes as the new state: never averaged, clipped or decayed, max-merged across
micro-batches (`merge_fp8_max`) and saved with the checkpoint.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from yxanul_jax.errors import UserError

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
FP8_COLLECTION = "fp8_meta"
OPERANDS = ("input", "kernel", "grad")


class Fp8Spec(NamedTuple):
    """Static (hashable) settings of one FP8 dot."""

    compute_dtype: Any
    margin: int = 0
    amax_algo: str = "max"
    kernel_dtype: Any = jnp.float32
    input_dtype: Any = jnp.bfloat16


def fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def init_meta(history_len: int) -> dict[str, jax.Array]:
    """Fresh state for one operand: empty history, unit scale."""
    return {"amax_history": jnp.zeros((history_len,), jnp.float32), "scale": jnp.ones((), jnp.float32)}


def _amax_from_history(history: jax.Array, algo: str) -> jax.Array:
    return history[0] if algo == "most_recent" else jnp.max(history)


def update_meta(meta: dict, amax: jax.Array, q_dtype, spec: Fp8Spec) -> dict:
    """Push `amax` into the history and compute the scale the *next* step will use.

    scale is the dequantization multiplier: x ~= fp8(x / scale) * scale, scale = amax * 2**margin
    / fp8_max. A zero or non-finite amax keeps the previous scale (no information, or an overflow
    that must not poison the scale).
    """
    history = jnp.roll(meta["amax_history"], 1).at[0].set(amax.astype(jnp.float32))
    amax_h = _amax_from_history(history, spec.amax_algo)
    scale = amax_h * (2.0 ** spec.margin) / fp8_max(q_dtype)
    scale = jnp.where((amax_h > 0) & jnp.isfinite(amax_h), scale, meta["scale"])
    return {"amax_history": history, "scale": scale}


def step_scale(meta: dict, amax: jax.Array, q_dtype, spec: Fp8Spec) -> jax.Array:
    """The scale this step quantizes with: the delayed one from the state, except while the
    history is still empty (the very first step), when the current amax stands in. A unit scale
    there would flush weights below 2**-9 and nearly every gradient to zero."""
    empty = jnp.max(meta["amax_history"]) <= 0
    current = jnp.maximum(amax, jnp.finfo(jnp.float32).tiny) * (2.0 ** spec.margin) / fp8_max(q_dtype)
    return jnp.where(empty & jnp.isfinite(amax), current, meta["scale"])


def quantize(x: jax.Array, q_dtype, scale: jax.Array) -> jax.Array:
    """Saturating cast of x / scale to an FP8 dtype."""
    m = fp8_max(q_dtype)
    return jnp.clip(x.astype(jnp.float32) / scale, -m, m).astype(q_dtype)


def dequantize(q: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    return q.astype(dtype) * scale.astype(dtype)


def _amax(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


def _dot_last(x_NxI: jax.Array, w_IxO: jax.Array, dtype) -> jax.Array:
    """x[..., I] @ w[I, O] with float32 accumulation, result in `dtype`."""
    return jax.lax.dot_general(x_NxI, w_IxO, (((x_NxI.ndim - 1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32).astype(dtype)


def fp8_dot(x, w, x_meta, w_meta, g_meta, spec: Fp8Spec):
    """y[..., O] = x[..., I] @ w[I, O] with E4M3 operands (forward) and an E5M2 gradient (backward).

    The *_meta arguments are the layer's FP8 state; their "gradients" are the updated state.
    """
    return _fp8_dot(x, w, x_meta, w_meta, g_meta,
                    spec._replace(kernel_dtype=jnp.dtype(w.dtype), input_dtype=jnp.dtype(x.dtype)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fp8_dot(x, w, x_meta, w_meta, g_meta, spec: Fp8Spec):
    return _fp8_fwd(x, w, x_meta, w_meta, g_meta, spec)[0]


def _fp8_fwd(x, w, x_meta, w_meta, g_meta, spec: Fp8Spec):
    dt = spec.compute_dtype
    x_amax, w_amax = _amax(x), _amax(w)
    x_scale = step_scale(x_meta, x_amax, E4M3, spec)
    w_scale = step_scale(w_meta, w_amax, E4M3, spec)
    x_q = quantize(x, E4M3, x_scale)
    w_q = quantize(w, E4M3, w_scale)
    y = _dot_last(dequantize(x_q, x_scale, dt), dequantize(w_q, w_scale, dt), dt)
    new_x = update_meta(x_meta, x_amax, E4M3, spec)
    new_w = update_meta(w_meta, w_amax, E4M3, spec)
    # Residuals are the FP8 tensors themselves: half the bytes of saving BF16 activations.
    return y, (x_q, x_scale, w_q, w_scale, new_x, new_w, g_meta)


def _fp8_bwd(spec: Fp8Spec, res, g):
    x_q, x_scale, w_q, w_scale, new_x, new_w, g_meta = res
    dt = spec.compute_dtype
    g_amax = _amax(g)
    g_scale = step_scale(g_meta, g_amax, E5M2, spec)
    g_dq = dequantize(quantize(g, E5M2, g_scale), g_scale, dt)
    x_dq = dequantize(x_q, x_scale, dt)
    w_dq = dequantize(w_q, w_scale, dt)
    # dx[..., I] = g[..., O] @ w[I, O]^T
    dx = jax.lax.dot_general(g_dq, w_dq, (((g.ndim - 1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32).astype(spec.input_dtype)
    # dw[I, O] = sum over all leading dims of x[..., I] g[..., O]
    lead = tuple(range(g.ndim - 1))
    dw = jax.lax.dot_general(x_dq, g_dq, ((lead, lead), ((), ())), preferred_element_type=jnp.float32)
    new_g = update_meta(g_meta, g_amax, E5M2, spec)
    return dx, dw.astype(spec.kernel_dtype), new_x, new_w, new_g


_fp8_dot.defvjp(_fp8_fwd, _fp8_bwd)


# ------------------------------------------------------------------------------------------
# Transformer Engine


def import_te():
    """Import Transformer Engine's JAX API, or raise a one-line UserError saying why and what to do.

    TE raises RuntimeError (not only ImportError) on machines without CUDA libraries.
    """
    try:
        import transformer_engine.jax as te  # noqa: F401
        import transformer_engine.jax.flax as te_flax
        from transformer_engine.common import recipe
    except (ImportError, RuntimeError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"fp8.backend=te needs Transformer Engine JAX on a CUDA machine ({type(e).__name__}: "
                        f"{first}); install yxanul-jax[te] in a CUDA container, or use fp8.backend=xla")
    return te, te_flax, recipe


def te_recipe(cfg):
    """The DelayedScaling HYBRID recipe for an `FP8Config`."""
    _, _, recipe = import_te()
    return recipe.DelayedScaling(margin=cfg.margin, fp8_format=recipe.Format.HYBRID,
                                 amax_history_len=cfg.amax_history_len, amax_compute_algo=cfg.amax_compute_algo)


def check_backend(cfg) -> None:
    """Fail early (UserError) when the configured backend cannot run here."""
    if cfg.active and cfg.backend == "te":
        import_te()


# ------------------------------------------------------------------------------------------
# State helpers the train loop uses


def split_state(variables: dict) -> tuple[dict, dict]:
    """Split Flax variables into (params, fp8 state): every non-`params` collection is FP8 state."""
    params = variables["params"]
    state = {k: v for k, v in variables.items() if k != "params"}
    return params, state


def merge_fp8_max(a, b):
    """Element-wise max of two FP8 states (micro-batches, devices): the safe, larger amax wins."""
    return jax.tree_util.tree_map(jnp.maximum, a, b)


def count_fp8_layers(fp8_state: dict) -> int:
    """Number of FP8 operand states (three per FP8 dense layer; scanned layers count each layer)."""
    leaves = jax.tree_util.tree_leaves_with_path(fp8_state)
    n = 0
    for path, leaf in leaves:
        if getattr(path[-1], "key", None) == "scale":
            n += max(1, int(leaf.size))
    return n
