"""Muon's orthogonalized momentum with one Newton-Schulz chain per matrix shape, not one per kernel.

`scale_by_muon` is optax's `optax.contrib.scale_by_muon` (Nesterov momentum, Frobenius preconditioning, the
quintic iteration and its coefficients) with the same state (`optax.contrib.MuonState`: a checkpoint of either
restores into the other). What differs is how the orthogonalization is laid out: optax runs one chain of
Newton-Schulz GEMMs per leaf (per layer and kernel when the layers are not scanned: 5 x 3 small GEMMs each), while
here the matrices of one shape are stacked and each shape runs one batched chain (a tall matrix turned first, the
iteration's f(X) = f(X^T)^T, as optax does per matrix). An unscanned model's 7 kernels a layer (q, k, v, o, gate,
up, down) become one chain per distinct shape (three or four where n_heads x head_dim = d_model: pythia-70m's 42
kernels three), and scanned yxanul-197m's seven stacks four (q and o, k and v, gate and up share theirs). Tall
and wide matrices of the same sides are not stacked together: FSDP shards every kernel's first matrix axis
(training/sharding.py), which a turned matrix would carry to its last, so stacking them would reshard one of them
every step. The FLOPs are the same (`accounting.newton_schulz_flops`); fewer, larger GEMMs are what a GPU runs
well, and the step has fewer ops to compile. Each matrix is still normalized by its own Frobenius norm and runs
optax's ops; the updates equal optax's to float32 rounding (XLA's CPU GEMMs round a batch of 1 and of 5 matrices
differently; tests/test_muon.py).

The iterations run in `optim.muon_ns_dtype`: BF16 by default, as Keller Jordan's Muon runs them (each matrix
normalized in float32, then cast; the coefficients multiplying in float32; each GEMM's float32 product rounded once,
so that a GEMM sharded over its contracted axis sums float32 partials as one device does; the update cast back to
float32), which on a GPU makes them BF16 tensor-core GEMMs at half the operand bytes of optax's float32 (TF32) ones;
`float32` is optax's, to float32 rounding as above. Where each device holds whole matrices on a GPU (`products_dtype`:
`make_optimizer` with `mesh.fsdp` 1) the GEMMs write BF16 themselves: cuBLASLt rounds the float32 accumulator in its
epilogue, the same rounding (unless an algorithm autotuned on the GPU splits K and sums its partials in BF16: an ulp
here and there, which five iterations spread to BF16's own rounding noise; scripts/muon_rounding_check.py compares
the two on a GPU) without the float32 product's round trip through memory (2.6 ms of a yxanul-197m
step on an H100 by `analyze --target h100`, where the step's FP8 GEMMs keep Triton's GEMMs, which would fold the
rounding in, off). XLA's CPU BF16 dot is not the float32 product rounded (about one element in 8,000 an ulp apart),
so on a CPU the products stay float32: one device and an FSDP mesh then run the same numbers.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonState

from yxanul_jax.analysis.accounting import MUON_NS_STEPS

NS_EPS = 1e-8
"""Added to each matrix's Frobenius norm before dividing by it (optax's default)."""


def _newton_schulz_BxMxN(x_BxMxN: jax.Array, coeffs: jax.Array, steps: int, dtype: Any = None,
                         products: Any = jnp.float32) -> jax.Array:
    """The iteration f(X) = a X + (b A + c A^2) X, A = X X^T, on a batch of M <= N matrices, each first divided
    by its own Frobenius norm; each matrix's ops written as optax writes them (`x @ x.T`, `(c A) @ A`), so that a
    matrix gets optax's result. `dtype`: the iterations run in it (the normalization in the input's dtype, then one
    cast), and the result comes back in the input's; None: the input's. `products`: the dtype each GEMM writes, then
    rounded to `dtype` (`products_dtype`)."""
    dtype = x_BxMxN.dtype if dtype is None else jnp.dtype(dtype)
    a, b, c = (coeffs[i] for i in range(3))  # float32: a coefficient rounded to BF16 would change the quintic

    def times(s, t):  # s t in float32, rounded to t's dtype, as PyTorch multiplies a BF16 tensor by a Python float
        return (s * t.astype(s.dtype)).astype(t.dtype)

    def mm(p, q):  # a GEMM's float32 accumulator rounded once to p's dtype: written as float32 and rounded after
        # (`products` float32: sharded over its contracted axis, FSDP's first matrix axis, the partial products are
        # summed in float32 first, as one device's accumulator does), or by the GEMM itself (`products` None)
        return jnp.matmul(p, q, preferred_element_type=products).astype(p.dtype)

    def iteration(_, x_MxN):
        a_MxM = mm(x_MxN, x_MxN.T)
        return times(a, x_MxN) + mm(times(b, a_MxM) + mm(times(c, a_MxM), a_MxM), x_MxN)

    def one(x_MxN):
        x_MxN = (x_MxN / (jnp.linalg.norm(x_MxN, ord="fro") + NS_EPS)).astype(dtype)
        return jax.lax.fori_loop(0, steps, iteration, x_MxN, unroll=True)  # optax's loop

    return jax.vmap(one)(x_BxMxN).astype(x_BxMxN.dtype)


def products_dtype(sharded: bool, platform: str) -> Any:
    """The dtype the Newton-Schulz GEMMs write, before the product is rounded to the iterations' dtype: float32, unless
    the matrices are whole on each device (`sharded` False: `mesh.fsdp` 1; -1 may shard) of a GPU (`platform`), where
    a GEMM writes the iterations' dtype itself (None) and cuBLASLt rounds in its epilogue (the module's docstring)."""
    return None if not sharded and platform == "gpu" else jnp.float32


def orthogonalize_by_shape(tree: Any, coeffs: jax.Array, steps: int = MUON_NS_STEPS, dtype: Any = None,
                           products: Any = jnp.float32) -> Any:
    """Each leaf's last two axes orthogonalized (its leading axes, a scanned stack's layers, are a batch), one
    batched Newton-Schulz chain per (rows, columns, dtype) over all the leaves; the iterations in `dtype` (None: each
    leaf's own), each leaf's result in its own dtype; each GEMM writes `products` (`products_dtype`)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        groups.setdefault((*leaf.shape[-2:], leaf.dtype), []).append(i)
    out = [None] * len(leaves)
    for (rows, cols, _), members in groups.items():
        x_BxRxC = jnp.concatenate([leaves[i].reshape(-1, rows, cols) for i in members])
        turn = (lambda x: jnp.swapaxes(x, 1, 2)) if rows > cols else (lambda x: x)  # a tall matrix runs turned
        done_BxRxC = turn(_newton_schulz_BxMxN(turn(x_BxRxC), coeffs, steps, dtype, products))
        start = 0
        for i in members:
            size = leaves[i].size // (rows * cols)
            out[i] = done_BxRxC[start:start + size].reshape(leaves[i].shape)
            start += size
    return jax.tree_util.tree_unflatten(treedef, out)


def scale_by_muon(beta: float, steps: int = MUON_NS_STEPS, ns_dtype: Any = None,
                  ns_products: Any = jnp.float32) -> optax.GradientTransformation:
    """optax's `scale_by_muon(ns_steps=steps, beta=beta, nesterov=True)` on kernels whose last two axes are the
    matrix, its Newton-Schulz grouped by shape (`orthogonalize_by_shape`) and run in `ns_dtype` (None: the momentum's,
    optax's; `optim.muon_ns_dtype`); the same `MuonState`. `ns_products`: the dtype its GEMMs write (`products_dtype`;
    float32, the default, is right on any sharding)."""
    # optax's own init: its state and its coefficients (Keller Jordan's quintic), which `update` reads from the state
    init = optax.contrib.scale_by_muon(ns_steps=steps, beta=beta, nesterov=True).init

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        mu_hat = jax.tree_util.tree_map(  # Nesterov: the momentum one step ahead, bias-corrected as optax does
            lambda m, g: beta * m + (1 - beta) * g,
            optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
            optax.tree.bias_correction(updates, beta, count))
        return orthogonalize_by_shape(mu_hat, state.ns_coeffs, steps, ns_dtype, ns_products), MuonState(
            count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init, update)
