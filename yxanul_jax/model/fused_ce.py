"""The output head and its cross-entropy as Pallas (Triton) kernels that never write the logits to memory.

    lse_T, target_T = linear_cross_entropy(x_TxK, w_VxK, targets_T, v_real)

    lse[t]    = logsumexp_{v < v_real} (x[t] . w[v])        (float32)
    target[t] = x[t] . w[targets[t]]                        (0 when the target is >= v_real or out of range)

x is the head's input (bfloat16 [T, K]: the rank-K projection of the hidden state for a factorized or
tied-through-rank head), w the vocabulary table ([V, K], padded rows allowed: columns >= v_real count as
-inf, so no `[T x V]` mask exists anywhere). The caller builds the NLL (lse - target) and the z-loss
(lse^2) from the two float32 vectors, with its token mask.

Three kernels, one program per block of rows:

  * forward (`fused_ce_fwd`, grid T / BT): each program walks the vocabulary in blocks of BV rows of w,
    computes the [BT, BV] logits tile in registers with float32 accumulation, and carries an online max,
    sum of exps and the target logit. Writes lse and target: 8 bytes per token.
  * input gradient (`fused_ce_dx`, grid T / BT): recomputes each logits tile, forms
    dlogits = softmax * g_lse + onehot(target) * g_target in float32, and accumulates dx += dlogits @ w_blk.
  * table gradient (`fused_ce_dw`, grid V / BV): the same tiles walked the other way, dw += dlogits^T @ x_blk.

The backward recomputes the logits (levanter's design) instead of storing them: 5 x 2 T K V FLOPs in all,
no `[T x V]` HBM traffic. Shapes are padded here to whole blocks (zero rows of x have zero gradient
weight; zero rows of w sit beyond v_real), so the kernels need no masked loads. Tiles: BT = BV = 128
with K <= 256 keeps x and w tiles in shared memory on sm_90 (3 pipeline stages, ~128 KB at K = 128);
`supported(K)` says when the fused path applies.

Not yet sharded: on a multi-device mesh XLA cannot partition the kernels' custom calls and gathers
their inputs onto every device, so `loss.loss_kernel`'s `auto` keeps the chunked loss there (a
shard_map over the data axes, with the table gradient summed across it, is the way to add it).

`interpret=True` runs the same kernels on CPU (Pallas interpret mode): that is how the tests check them
against the float32 reference (`reference`); on a GPU they compile through Triton (checked for sm_90
without a GPU in tests/test_gpu_target.py). The performance model counts their FLOPs from `KERNELS`
(XLA cannot see inside a custom call).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.core.config import FUSED_CE_MAX_K, fused_ce_takes

BLOCK_T = 128
BLOCK_V = 128
NUM_WARPS = 8
NUM_STAGES = 3

# kernel name -> multiple of 2 T K V (T, K from operand 0, V from operand 1) it executes: read by
# analysis/perf.py. Forward: one GEMM; dx and dw: the recomputed logits and the gradient GEMM.
KERNELS = {"fused_ce_fwd": 1, "fused_ce_dx": 2, "fused_ce_dw": 2}


def supported(k: int) -> bool:
    """Whether the fused kernels take a head input of width k (shared-memory tiles; multiples of 16)."""
    return fused_ce_takes(k)


def _compiler_params():
    from jax.experimental.pallas import triton as plt

    return plt.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _logits(x, w, v0, v_real):
    """[BT, BV] float32 logits of a tile, the columns >= v_real at -inf."""
    s = jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    cols = v0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    return jnp.where(cols < v_real, s, -jnp.inf), cols


def _fwd_kernel(x_ref, w_ref, t_ref, lse_ref, tl_ref, *, V, v_real, BV):
    from jax.experimental import pallas as pl

    x = x_ref[...]
    tgt = t_ref[...]
    BT = x.shape[0]

    def body(j, carry):
        m, s, tl = carry
        v0 = j * BV
        logits, cols = _logits(x, w_ref[pl.ds(v0, BV), :], v0, v_real)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[:, None]), axis=1)
        tl = tl + jnp.sum(jnp.where(cols == tgt[:, None], logits, 0.0), axis=1)
        return m_new, s, tl

    init = (jnp.full((BT,), -jnp.inf, jnp.float32), jnp.zeros((BT,), jnp.float32), jnp.zeros((BT,), jnp.float32))
    m, s, tl = jax.lax.fori_loop(0, V // BV, body, init)
    lse_ref[...] = m + jnp.log(s)
    tl_ref[...] = tl


def _dlogits(x, w, v0, v_real, lse, g_lse, g_tl, tgt):
    """dloss/dlogits of a tile, float32: softmax * g_lse + onehot * g_target."""
    logits, cols = _logits(x, w, v0, v_real)
    p = jnp.exp(logits - lse[:, None])  # 0 in the padded columns (exp(-inf))
    return p * g_lse[:, None] + jnp.where(cols == tgt[:, None], g_tl[:, None], 0.0)


def _dx_kernel(x_ref, w_ref, t_ref, lse_ref, glse_ref, gtl_ref, dx_ref, *, V, v_real, BV):
    from jax.experimental import pallas as pl

    x, tgt, lse, g_lse, g_tl = x_ref[...], t_ref[...], lse_ref[...], glse_ref[...], gtl_ref[...]

    def body(j, acc):
        v0 = j * BV
        w = w_ref[pl.ds(v0, BV), :]
        d = _dlogits(x, w, v0, v_real, lse, g_lse, g_tl, tgt).astype(w.dtype)
        return acc + jax.lax.dot_general(d, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, V // BV, body, jnp.zeros(x.shape, jnp.float32))
    dx_ref[...] = acc.astype(dx_ref.dtype)


def _dw_kernel(x_ref, w_ref, t_ref, lse_ref, glse_ref, gtl_ref, dw_ref, *, T, v_real, BT, BV):
    from jax.experimental import pallas as pl

    w = w_ref[...]
    v0 = pl.program_id(0) * BV

    def body(i, acc):
        t0 = i * BT
        x = x_ref[pl.ds(t0, BT), :]
        rows = pl.ds(t0, BT)
        d = _dlogits(x, w, v0, v_real, lse_ref[rows], glse_ref[rows], gtl_ref[rows], t_ref[rows]).astype(x.dtype)
        return acc + jax.lax.dot_general(d, x, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, T // BT, body, jnp.zeros(w.shape, jnp.float32))
    dw_ref[...] = acc.astype(dw_ref.dtype)


def _pad(a, n: int, axis: int = 0):
    extra = -a.shape[axis] % n
    if not extra:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths)


def _forward(x, w, targets, *, v_real, interpret):
    from jax.experimental import pallas as pl

    T, K = x.shape
    V = w.shape[0]
    kernel = functools.partial(_fwd_kernel, V=V, v_real=v_real, BV=BLOCK_V)
    vec = jax.ShapeDtypeStruct((T,), jnp.float32)
    row = pl.BlockSpec((BLOCK_T,), lambda i: (i,))
    return pl.pallas_call(
        kernel, out_shape=(vec, vec), grid=(T // BLOCK_T,),
        in_specs=[pl.BlockSpec((BLOCK_T, K), lambda i: (i, 0)), pl.BlockSpec((V, K), lambda i: (0, 0)), row],
        out_specs=(row, row), compiler_params=_compiler_params(), interpret=interpret, name="fused_ce_fwd",
    )(x, w, targets)


def _backward(x, w, targets, lse, g_lse, g_tl, *, v_real, interpret):
    from jax.experimental import pallas as pl

    T, K = x.shape
    V = w.shape[0]
    rows = pl.BlockSpec((BLOCK_T,), lambda i: (i,))
    whole_t = pl.BlockSpec((T,), lambda i: (0,))
    dx = pl.pallas_call(
        functools.partial(_dx_kernel, V=V, v_real=v_real, BV=BLOCK_V),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(T // BLOCK_T,),
        in_specs=[pl.BlockSpec((BLOCK_T, K), lambda i: (i, 0)), pl.BlockSpec((V, K), lambda i: (0, 0)),
                  rows, rows, rows, rows],
        out_specs=pl.BlockSpec((BLOCK_T, K), lambda i: (i, 0)), compiler_params=_compiler_params(),
        interpret=interpret, name="fused_ce_dx",
    )(x, w, targets, lse, g_lse, g_tl)
    dw = pl.pallas_call(
        functools.partial(_dw_kernel, T=T, v_real=v_real, BT=BLOCK_T, BV=BLOCK_V),
        out_shape=jax.ShapeDtypeStruct(w.shape, jnp.float32), grid=(V // BLOCK_V,),
        in_specs=[pl.BlockSpec((T, K), lambda j: (0, 0)), pl.BlockSpec((BLOCK_V, K), lambda j: (j, 0)),
                  whole_t, whole_t, whole_t, whole_t],
        out_specs=pl.BlockSpec((BLOCK_V, K), lambda j: (j, 0)), compiler_params=_compiler_params(),
        interpret=interpret, name="fused_ce_dw",
    )(x, w, targets, lse, g_lse, g_tl)
    return dx, dw


def _on_platform(fn, interpret, *args):
    """`fn(*args, interpret=...)`: Triton where the step is lowered for a GPU, interpret mode on a CPU
    (decided when lowering, so a deviceless sm_90 compile from a CPU machine gets the Triton kernels);
    `interpret=True` forces interpret mode."""
    if interpret:
        return fn(*args, interpret=True)
    return jax.lax.platform_dependent(*args, cpu=functools.partial(fn, interpret=True),
                                      default=functools.partial(fn, interpret=False))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused(x, w, targets, v_real, interpret):
    return _on_platform(functools.partial(_forward, v_real=v_real), interpret, x, w, targets)


def _fused_fwd(x, w, targets, v_real, interpret):
    lse, tl = _on_platform(functools.partial(_forward, v_real=v_real), interpret, x, w, targets)
    return (lse, tl), (x, w, targets, lse)


def _fused_bwd(v_real, interpret, res, g):
    x, w, targets, lse = res
    g_lse, g_tl = g
    dx, dw = _on_platform(functools.partial(_backward, v_real=v_real), interpret, x, w, targets, lse,
                          g_lse.astype(jnp.float32), g_tl.astype(jnp.float32))
    return dx, dw.astype(w.dtype), np.zeros(targets.shape, dtype=jax.dtypes.float0)


_fused.defvjp(_fused_fwd, _fused_bwd)


def linear_cross_entropy(x_TxK, w_VxK, targets_T, v_real: int, interpret: bool = False):
    """(lse[T], target logit[T]) in float32 of the logits x @ w^T over the first v_real columns, by the
    fused kernels (module docstring); differentiable in x and w. Targets outside [0, v_real) give a
    target logit of 0 (mask those tokens out). The kernels compile with Triton when lowered for a GPU and
    run in Pallas interpret mode when lowered for a CPU (`interpret=True` forces that)."""
    T, K = x_TxK.shape
    if not supported(K):
        raise ValueError(f"fused cross-entropy takes a head input width of 16..{FUSED_CE_MAX_K} in multiples of 16, got {K}")
    x = _pad(x_TxK, BLOCK_T)
    w = _pad(w_VxK.astype(x_TxK.dtype), BLOCK_V)
    targets = _pad(targets_T.astype(jnp.int32), BLOCK_T)
    lse, tl = _fused(x, w, targets, int(v_real), bool(interpret))
    return lse[:T], tl[:T]


def reference(x_TxK, w_VxK, targets_T, v_real: int):
    """The float32 reference of `linear_cross_entropy` on the same inputs (all T x V logits at once)."""
    logits = x_TxK.astype(jnp.float32) @ w_VxK.astype(jnp.float32).T
    cols = jnp.arange(w_VxK.shape[0])
    logits = jnp.where(cols < v_real, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=1)
    hit = (cols[None, :] == targets_T[:, None]) & (cols < v_real)[None, :]
    return lse, jnp.sum(jnp.where(hit, logits, 0.0), axis=1)
