"""FP8 dense backends (native XLA, Transformer Engine, none) and FP8-state helpers.

The `xla` backend is the direct form of FP8 GEMMs (the HYBRID recipe): each operand is cast to
FP8 with a per-tensor scale, the `dot_general` runs on the FP8 operands with float32
accumulation, and the product of the two scales multiplies the output:

    forward          y  = (x_q[E4M3] . w_q[E4M3])   * (s_x s_w)
    input gradient   dx = (g_q[E5M2] . w_q[E4M3]^T) * (s_g s_w)
    weight gradient  dw = (x_q[E4M3]^T . g_q[E5M2]) * (s_x s_g)

How each GEMM is written for XLA is `FP8Config.gemm_form` (`GEMM_FORMS`; the same FP8 product in all).
On a GPU (`auto`) it is `dequant`: `dot(bf16(a_q) * s_a, bf16(b_q) * s_b)`, which XLA's FP8 rewriter folds
into one cuBLASLt FP8 GEMM with both scales as operands that writes BF16 directly, provided Triton GEMMs
are off (the train step compiles with `xla_gpu_enable_triton_gemm: false`: `required_xla_options`); with
them on, Triton claims the dequantized operands and the GEMM runs in BF16. The `f32` form (the FP8 dot
writing float32, then scale and cast) is the CPU's exact emulation; on an H200 with JAX 0.11.2 cuBLAS
won its GEMMs' autotuning and the cast to BF16 stayed a kernel of its own (53 ms of a 675 ms step).
`python -m yxanul_jax.analyze --target h100` shows which kind every GEMM compiles to.

The weight gradient may run in BF16 instead (`FP8Config.wgrad: bf16`, `Fp8Spec.wgrad`): x^T g of the
BF16 input and gradient, with no FP8 transposes of either (cuBLASLt's FP8 GEMMs take both operands
K-major, and for dw K is the token axis). The forward and the input gradient stay FP8.

Scaling (`FP8Config.scaling`):
  * `delayed` (default, TE's DelayedScaling): step N quantizes with the scale computed at the end
    of step N-1 from an amax history, so the amax reduction of a tensor fuses with its cast. The
    history of a fresh state is empty; the train loop runs the very first step with `current`
    scaling once (`steps.fp8_bootstrap_config`), which fills it.
  * `current` (TE's Float8CurrentScaling): the scale comes from this tensor's own amax, at the cost
    of reading the tensor once more before its cast.

FP8 state is not a gradient. Each FP8 GEMM keeps, per operand (`input`, `kernel`, `grad`), an
`amax_history` [H], the `scale` of the next step and `nonfinite` (how many steps saw a
non-finite amax, which never enters the history) in the Flax collection `fp8_meta`. The train
step differentiates the loss w.r.t. this collection too; the custom VJP returns the *updated
state* as its "cotangent" (the overwrite-with-gradient trick), which the train step then takes as
the new state: never averaged, clipped or decayed, max-merged across micro-batches and loss chunks
(`merge_fp8`) and saved with the checkpoint.

Transformer Engine's state (`fp8.backend: te`) follows the same rules: it lives in other Flax
collections (`TE_COLLECTIONS`), is updated the same way (TE's modules return the new state as the
"gradient"), and goes through `merge_fp8` too, with one difference that decides the merge: TE's
`*_scale` multiplies *before* the cast (x_q = x * scale, the inverse of ours), so for it the safe,
larger-amax side is the smaller value, and it is min-merged.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from yxanul_jax.core import console, scopes
from yxanul_jax.core.config import FP8_TARGETS, TRITON_GEMM_OPTION, Config, FP8Config, ModelConfig, triton_gemm_asked
from yxanul_jax.core.errors import UserError, one_line

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
FP8_COLLECTION = "fp8_meta"
OPERANDS = ("input", "kernel", "grad")
GEMM_ALIGN = 16  # cuBLASLt FP8 GEMMs need every matrix dimension to be a multiple of 16


class Fp8Spec(NamedTuple):
    """Static (hashable) settings of one FP8 dot."""

    compute_dtype: Any
    margin: int = 0
    amax_algo: str = "max"
    scaling: str = "delayed"
    kernel_dtype: Any = jnp.float32
    input_dtype: Any = jnp.bfloat16
    underflow_stats: bool = False
    gemm_form: str = "f32"
    wgrad: str = "fp8"
    input_barrier: bool = True  # `_for_wgrad` on the FP8 input kept for the weight gradient (see there)
    names: tuple = ()  # `fp8_dots`: each GEMM's projection, whose `NAME/gemm` scope its GEMMs run in (the analysis
    # reads the target from it); () for one GEMM in its own module's scope


def fp8_max(dtype: Any) -> float:
    return float(jnp.finfo(dtype).max)


def gemm_aligned(*dims: int) -> bool:
    """Whether a GEMM with these (static) dimensions can run as an FP8 tensor-core GEMM."""
    return all(int(d) % GEMM_ALIGN == 0 for d in dims)


def fused_aligned(model: ModelConfig) -> bool:
    """Whether every GEMM of TE's fused layers (`fp8.te_layers`) has FP8-aligned shapes for this `ModelConfig`;
    when not, the blocks run unfused (each aligned projection still in FP8)."""
    K = model.resolved_head_dim
    return gemm_aligned(model.d_model, model.n_heads * K, model.n_kv_heads * K, model.ffn_dim)


_WARNED: set = set()


def warn_unaligned(name: str, dims: tuple[int, ...]) -> None:
    """One warning per (projection, shape): an FP8 target that stays BF16 because of its shape."""
    key = (name, tuple(dims))
    if key not in _WARNED:
        _WARNED.add(key)
        console.warn(f"FP8 target '{name}' has GEMM dimensions {'x'.join(map(str, dims))}, not all multiples "
                     f"of {GEMM_ALIGN}; it runs in BF16 (pad the width, or model.vocab_pad_to for the head)")


def init_meta(history_len: int) -> dict[str, jax.Array]:
    """Fresh state for one operand: empty history, unit scale, no non-finite amax seen, no underflow."""
    return {"amax_history": jnp.zeros((history_len,), jnp.float32), "scale": jnp.ones((), jnp.float32),
            "nonfinite": jnp.zeros((), jnp.float32), "underflow": jnp.zeros((), jnp.float32)}


def _amax_from_history(history: jax.Array, algo: str) -> jax.Array:
    return history[0] if algo == "most_recent" else jnp.max(history)


def _scale_of(amax: jax.Array, q_dtype, margin: int) -> jax.Array:
    """Dequantization multiplier that maps `amax` to the FP8 maximum: x ~= fp8(x / scale) * scale."""
    return amax * (2.0 ** margin) / fp8_max(q_dtype)


def update_meta(meta: dict, amax: jax.Array, q_dtype: Any, spec: Fp8Spec, underflow: jax.Array | None = None) -> dict:
    """Push `amax` into the history and compute the scale the *next* step will use.

    scale = max(history) * 2**margin / fp8_max (or the most recent amax). A non-finite amax (an
    overflow somewhere upstream) is not pushed and only counted in `nonfinite`: one inf in a
    1,024-long `max` history would otherwise freeze the scale for 1,024 steps. A history whose
    amax is 0 (no information) keeps the previous scale. `underflow` (this step's share of nonzero
    values cast to zero, `underflow_share`) is recorded as is; 0 when not measured.
    """
    amax = amax.astype(jnp.float32)
    finite = jnp.isfinite(amax)
    pushed = jnp.roll(meta["amax_history"], 1).at[0].set(amax)
    history = jnp.where(finite, pushed, meta["amax_history"])
    amax_h = _amax_from_history(history, spec.amax_algo)
    scale = jnp.where(amax_h > 0, _scale_of(amax_h, q_dtype, spec.margin), meta["scale"])
    return {"amax_history": history, "scale": scale,
            "nonfinite": meta["nonfinite"] + jnp.where(finite, 0.0, 1.0),
            "underflow": jnp.zeros((), jnp.float32) if underflow is None else underflow.astype(jnp.float32)}


def step_scale(meta: dict, amax: jax.Array, q_dtype: Any, spec: Fp8Spec) -> jax.Array:
    """The scale this step quantizes with. `delayed`: the state's (set at the end of the previous
    step; `amax` is not read, so its reduction can fuse with the cast). `current`: this tensor's
    own amax (the state's scale when that amax is zero or not finite)."""
    if spec.scaling == "delayed":
        return meta["scale"]
    ok = (amax > 0) & jnp.isfinite(amax)
    return jnp.where(ok, _scale_of(jnp.where(ok, amax, 1.0), q_dtype, spec.margin), meta["scale"])


def quantize(x: jax.Array, q_dtype: Any, scale: jax.Array) -> jax.Array:
    """Saturating cast of x / scale to an FP8 dtype."""
    m = fp8_max(q_dtype)
    inv = (1.0 / scale).astype(jnp.float32)
    return jnp.clip(x.astype(jnp.float32) * inv, -m, m).astype(q_dtype)


def underflow_share(x: jax.Array, x_q: jax.Array, spec: Fp8Spec) -> jax.Array | None:
    """Share of x's nonzero values that its FP8 cast flushed to zero (None unless spec.underflow_stats):
    information the GEMM never sees. E5M2 gradients scaled by a stale, large amax lose most of it."""
    if not spec.underflow_stats:
        return None
    nonzero = x != 0
    lost = jnp.sum(nonzero & (x_q.astype(jnp.float32) == 0), dtype=jnp.float32)
    return lost / jnp.maximum(jnp.sum(nonzero, dtype=jnp.float32), 1.0)


def _amax(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


GEMM_FORMS = ("f32", "direct", "dequant")
"""How an FP8 GEMM is written for XLA (`Fp8Spec.gemm_form`, config `fp8.gemm_form`); the accumulation is float32
in all, and each computes the same product of the same FP8 operands:

  * `f32`: `dot(a_q, b_q) -> float32`, times the product of the scales, cast to the output dtype. XLA's
    rewriter makes a cuBLASLt FP8 GEMM that writes float32, and the cast is left as a kernel of its own when
    cuBLAS wins the autotuning of a Triton GEMM fusion (seen on an H200, JAX 0.11.2).
  * `direct`: the GEMM writes the output dtype; the scales multiply after it, in float32 (an element-wise
    epilogue XLA can fuse into the consumer).
  * `dequant`: `dot(bf16(a_q) * a_scale, bf16(b_q) * b_scale) -> output dtype`, the form XLA's FP8 rewriter
    folds whole into one cuBLASLt FP8 GEMM (scales as its a/b scale operands, the output dtype written
    directly), when Triton GEMMs are off (`xla_gpu_enable_triton_gemm: false`); with them on, Triton takes
    the dequantized BF16 operands and the GEMM runs in BF16. Emulated (CPU), the scales are rounded to
    BF16 (2**-9 relative); the cuBLAS call reads them in float32."""


def gemm_form(cfg: FP8Config, xla_options: dict | None = None, platform: str | None = None) -> str:
    """The `GEMM_FORMS` entry an `FP8Config` runs: its own, or for `auto`, `dequant` on a GPU unless `xla_options`
    turns Triton GEMMs on (which would take its dequantized operands in BF16), else `f32`. `platform` defaults to
    jax's default backend."""
    if cfg.gemm_form != "auto":
        return cfg.gemm_form
    on_gpu = (platform or jax.default_backend()) == "gpu"
    return "dequant" if on_gpu and not triton_gemm_asked(xla_options or {}) else "f32"


def required_xla_options(cfg: FP8Config, xla_options: dict | None = None, platform: str | None = None) -> dict:
    """XLA options a step with these FP8 settings needs beside `xla_options`: Triton GEMMs off for `dequant`."""
    if cfg.native and gemm_form(cfg, xla_options, platform) == "dequant":
        return {TRITON_GEMM_OPTION: False}
    return {}


def jit(fun: Callable, cfg: FP8Config, **jit_kwargs: Any) -> Callable:
    """`jax.jit` of your own step with FP8 layers of `cfg` (an `FP8Config`), compiled with the XLA options its GEMM
    form needs (`required_xla_options`). On a GPU the form is `dequant`, and XLA's Triton GEMMs would take its
    dequantized operands as BF16 GEMMs: under a plain `jax.jit` no FP8 GEMM is left (checked for sm_90,
    tests/test_gpu_target.py). `compiler_options` given here are added, and win where they name the same option
    (turning Triton GEMMs back on brings the BF16 GEMMs back)."""
    options = {**required_xla_options(cfg), **(jit_kwargs.pop("compiler_options", None) or {})}
    return jax.jit(fun, compiler_options=options or None, **jit_kwargs)


def scaled_dot(a_q: jax.Array, a_scale: jax.Array, b_q: jax.Array, b_scale: jax.Array, dims: Any, out_dtype: Any,
               form: str = "f32") -> jax.Array:
    """dot_general of two FP8 operands with float32 accumulation, times their (scalar) scales, in `out_dtype`,
    in one of the `GEMM_FORMS`: patterns XLA rewrites into one scaled cuBLASLt FP8 GEMM."""
    if form == "dequant":
        a = a_q.astype(jnp.bfloat16) * a_scale.astype(jnp.bfloat16)
        b = b_q.astype(jnp.bfloat16) * b_scale.astype(jnp.bfloat16)
        return jax.lax.dot_general(a, b, dims, preferred_element_type=out_dtype)
    scale = (a_scale * b_scale).astype(jnp.float32)
    if form == "f32" or jnp.dtype(out_dtype) == jnp.float32:
        acc = jax.lax.dot_general(a_q, b_q, dims, preferred_element_type=jnp.float32)
        return (acc * scale).astype(out_dtype)
    acc = jax.lax.dot_general(a_q, b_q, dims, preferred_element_type=out_dtype)
    return (acc.astype(jnp.float32) * scale).astype(out_dtype)


def fp8_dot(x: jax.Array, w: jax.Array, x_meta: dict, w_meta: dict, g_meta: dict, spec: Fp8Spec) -> jax.Array:
    """y[..., O] = x[..., I] @ w[I, O] with E4M3 operands (forward) and an E5M2 gradient (backward).

    The *_meta arguments are the layer's FP8 state; their "gradients" are the updated state.
    """
    return fp8_dots(x, (w,), ((x_meta, w_meta, g_meta),), spec)[0]


def fp8_dots(x: jax.Array, ws: Sequence[jax.Array], metas: Sequence[tuple], spec: Fp8Spec) -> tuple:
    """(x @ w for w in ws): GEMMs of one input, cast to FP8 once. `metas`: each GEMM's (input, kernel, grad) state;
    their "gradients" are the updated states.

    Every input state is updated with the same amax, so GEMMs that read the same tensor from the first step on
    keep equal histories and scales (gate and up: `SwiGLU`), and the cast takes the largest of their step scales
    (each one's own while they are equal; the safe side, no clipping, if they ever differed). One cast instead of
    one per GEMM, and in the `dequant` form (a GPU's) one transposed copy for the weight gradients (`_apart`); dx
    sums the GEMMs' input gradients.
    `spec.names`: the projections, whose `NAME/gemm` scopes their GEMMs run in.
    """
    dt = {jnp.dtype(w.dtype) for w in ws}
    assert len(dt) == 1, f"fp8_dots: kernels of one dtype, got {dt}"
    return _fp8_dots(x, tuple(ws), tuple(tuple(m) for m in metas),
                     spec._replace(kernel_dtype=dt.pop(), input_dtype=jnp.dtype(x.dtype)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fp8_dots(x, ws, metas, spec: Fp8Spec):
    return _fp8_fwd(x, ws, metas, spec)[0]


def _gemm_scope(spec: Fp8Spec, i: int):
    """The scope GEMM `i` of `fp8_dots` runs in: `NAME/gemm`, as a `Matmul` of that name would (none for one)."""
    if not spec.names:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(jax.named_scope(spec.names[i]))
    stack.enter_context(jax.named_scope("gemm"))
    return stack


def _fp8_fwd(x, ws, metas, spec: Fp8Spec):
    n = len(ws)
    with jax.named_scope(scopes.FP8_SCALING):
        x_amax = _amax(x)
        x_scale = functools.reduce(jnp.maximum, [step_scale(m[0], x_amax, E4M3, spec) for m in metas])
        x_q = quantize(x, E4M3, x_scale)
        w_amaxes = [_amax(w) for w in ws]
        w_scales = [step_scale(m[1], a, E4M3, spec) for m, a in zip(metas, w_amaxes)]
        w_qs = [quantize(w, E4M3, s) for w, s in zip(ws, w_scales)]
    # Each GEMM its own handle of what the GEMMs share (`_apart`): the scale where it dequantizes the operand, else
    # the FP8 input itself
    dequant = spec.gemm_form == "dequant"
    x_scales = _apart(x_scale, n) if dequant else (x_scale,) * n
    x_qs = (x_q,) * n if dequant else _apart(x_q, n)
    ys = []
    for i, (xq, xs, w_q, w_scale) in enumerate(zip(x_qs, x_scales, w_qs, w_scales)):
        with _gemm_scope(spec, i):
            ys.append(scaled_dot(xq, xs, w_q, w_scale, (((x.ndim - 1,), (0,)), ((), ())), spec.compute_dtype,
                                 spec.gemm_form))
    with jax.named_scope(scopes.FP8_SCALING):
        x_underflow = underflow_share(x, x_q, spec)
        new_xs = [update_meta(m[0], x_amax, E4M3, spec, x_underflow) for m in metas]
        new_ws = [update_meta(m[1], a, E4M3, spec, underflow_share(w, w_q, spec))
                  for m, a, w, w_q in zip(metas, w_amaxes, ws, w_qs)]
    # Residuals are the FP8 tensors themselves (half the bytes of saving BF16 activations), or x itself when
    # the weight gradient runs in BF16. The FP8 residual passes a barrier: see `_for_wgrad`.
    if spec.wgrad == "bf16":
        x_res = (x,) * n
    elif dequant:
        x_res = (_for_wgrad(x_q) if spec.input_barrier else x_q,) * n
    else:
        x_res = tuple(_for_wgrad(xq) if spec.input_barrier else xq for xq in x_qs)
    return tuple(ys), (x_res, x_scales, w_qs, w_scales, new_xs, new_ws, [m[2] for m in metas])


def _apart(a: jax.Array, n: int) -> tuple:
    """`n` handles of one array that XLA cannot merge (one barrier, n outputs). GEMMs sharing an operand are merged
    by XLA's DotMerger when small (dot(a, concat(b, c))), and the merged GEMM of dequantized FP8 operands is no longer
    one XLA's FP8 rewriter recognizes: it ran in BF16 (configs/tiny.yaml, sm_90: gate and up, forward and weight
    gradient). In the `dequant` form each GEMM dequantizes the shared FP8 input with its own handle of the scale, so
    no two share an operand, and the FP8 bytes are still read, and transposed, once; in the other forms (the scale
    multiplies after the GEMM) each takes its own handle of the FP8 input (merged, they stayed FP8 but were one
    GEMM fewer than the projections)."""
    return (a,) if n == 1 else tuple(jax.lax.optimization_barrier(tuple(a for _ in range(n))))


def _for_wgrad(a_q: jax.Array) -> jax.Array:
    """An FP8 operand of the weight gradient, behind an optimization barrier. cuBLASLt's FP8 GEMMs take both
    operands K-major, and for dw K is the token axis, so XLA transposes this operand. Without the barrier it
    writes the transposed copy from the kernel that casts the tensor, and a transposing kernel cannot also hold
    the amax reduction: XLA then reads the BF16 tensor again for its amax (and writes it once more for the SwiGLU
    backward). Behind the barrier the cast keeps its amax, and the transpose is a copy of the FP8 bytes
    (analyze --target h100, yxanul-197m stage 9, fp8.wgrad=fp8: 566.1 -> 514.3 ms, 2026-11-27).

    Not for the down projection's input (`Fp8Spec.input_barrier`, `backends.XlaFp8`): XLA computes the amax of the
    SwiGLU's product in the SwiGLU backward's kernel, which reads gate and up anyway, so the forward cast holds no
    reduction and may write the transposed copy itself (507.0 -> 502.7 ms)."""
    return jax.lax.optimization_barrier(a_q)


def _fp8_bwd(spec: Fp8Spec, res, gs):
    x_res, x_scales, w_qs, w_scales, new_xs, new_ws, g_metas = res
    dx, dws, new_gs = None, [], []
    for i, (g, xr, x_scale, w_q, w_scale, g_meta) in enumerate(zip(gs, x_res, x_scales, w_qs, w_scales, g_metas)):
        with _gemm_scope(spec, i):
            with jax.named_scope(scopes.FP8_SCALING):
                g_amax = _amax(g)
                g_scale = step_scale(g_meta, g_amax, E5M2, spec)
                g_q = quantize(g, E5M2, g_scale)
            # dx[..., I] = g[..., O] @ w[I, O]^T: E5M2 x E4M3, summed over the GEMMs of this input
            dx_i = scaled_dot(g_q, g_scale, w_q, w_scale, (((g.ndim - 1,), (1,)), ((), ())), spec.input_dtype,
                              spec.gemm_form)
            dx = dx_i if dx is None else dx + dx_i
            # dw[I, O] = x[N, I]^T @ g[N, O] over all leading dims folded into N: E4M3 x E5M2, or BF16 (`wgrad`)
            if spec.wgrad == "bf16":
                x_NxI, g_NxO = xr.reshape(-1, xr.shape[-1]), g.reshape(-1, g.shape[-1])
                with jax.named_scope(scopes.BF16_WGRAD):
                    dws.append(jax.lax.dot_general(x_NxI.astype(jnp.bfloat16), g_NxO.astype(jnp.bfloat16),
                                                   (((0,), (0,)), ((), ())),
                                                   preferred_element_type=jnp.float32).astype(spec.kernel_dtype))
            else:
                x_NxI, g_NxO = xr.reshape(-1, xr.shape[-1]), _for_wgrad(g_q).reshape(-1, g_q.shape[-1])
                dws.append(scaled_dot(x_NxI, x_scale, g_NxO, g_scale, (((0,), (0,)), ((), ())), spec.kernel_dtype,
                                      spec.gemm_form))
            with jax.named_scope(scopes.FP8_SCALING):
                new_gs.append(update_meta(g_meta, g_amax, E5M2, spec, underflow_share(g, g_q, spec)))
    return dx, tuple(dws), tuple(zip(new_xs, new_ws, new_gs))


_fp8_dots.defvjp(_fp8_fwd, _fp8_bwd)


# ------------------------------------------------------------------------------------------
# Transformer Engine


def import_te() -> Any:
    """Import Transformer Engine's JAX API, or raise a one-line UserError saying why and what to do.

    TE raises RuntimeError (not only ImportError) on machines without CUDA libraries.
    """
    try:
        import transformer_engine.jax as te  # noqa: F401
        import transformer_engine.jax.flax as te_flax
        from transformer_engine.common import recipe
    except (ImportError, RuntimeError, OSError) as e:
        raise UserError(f"fp8.backend=te needs Transformer Engine JAX on a CUDA machine ({type(e).__name__}: "
                        f"{one_line(e)}); install yxanul-jax[te] in a CUDA container, or use fp8.backend=xla")
    return te, te_flax, recipe


def te_recipe(cfg: FP8Config) -> Any:
    """TE's recipe for an `FP8Config`: DelayedScaling (HYBRID) or, for `scaling: current`,
    Float8CurrentScaling where this TE has it."""
    _, _, recipe = import_te()
    if cfg.scaling == "current" and hasattr(recipe, "Float8CurrentScaling"):
        return recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)
    return recipe.DelayedScaling(margin=cfg.margin, fp8_format=recipe.Format.HYBRID,
                                 amax_history_len=cfg.amax_history_len, amax_compute_algo=cfg.amax_compute_algo)


def check_backend(cfg: FP8Config) -> None:
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


def value_and_grad(fun: Callable, has_aux: bool = False) -> Callable:
    """`jax.value_and_grad` for a loss `fun(params, fp8_state, *args)` of a model with FP8 layers; the
    returned function gives `(value, (param_grads, new_fp8_state))`.

    The FP8 state (every non-`params` collection, `split_state`) is not trained: each FP8 GEMM's
    custom VJP returns its updated amax history and scale as the state's "gradient", and that is the
    state of the next step. Pass it on as it is, never to the optimizer. Differentiating w.r.t. the
    params alone, or `apply(..., mutable=...)`, leaves the state at its initial unit scales, where the
    E5M2 cast of small gradients flushes many of them to zero, silently. Each FP8 GEMM must run once
    per call (one used twice would sum two states: `updated_twice` tells once the histories hold amaxes;
    combine separate calls with `merge_fp8`). A fresh
    state has an empty history: with `scaling="delayed"` take the first step with
    `scaling="current"` (`training.steps.fp8_bootstrap_config`), as the train command does.

    An FP8 GEMM no gradient reaches (a frozen trunk under `stop_gradient`, a layer the loss does not use)
    never runs its backward, and JAX gives its state zeros, a scale of 0 that would make the next forward NaN:
    such a GEMM keeps the state it had (`keep_unreached`).
    """
    grad_fn = jax.value_and_grad(fun, argnums=(0, 1), has_aux=has_aux)

    @functools.wraps(fun)
    def value_and_grads(params, fp8_state, *args, **kwargs):
        value, (grads, new_state) = grad_fn(params, fp8_state, *args, **kwargs)
        return value, (grads, keep_unreached(fp8_state, new_state))

    return value_and_grads


def updated_twice(old: dict, new: dict) -> jax.Array:
    """Whether some FP8 GEMM of ours (`FP8_COLLECTION`) took more than one update between `old` and `new` (a boolean
    array): the model applied twice in one loss, or vmapped, whose summed states `value_and_grad` cannot tell from
    one. One update rolls each amax history by one (or, for a non-finite amax, leaves it); k updates of one state
    summed hold k times the rolled history. Histories with nothing in them yet (a fresh state) tell nothing. A check
    for your own loop (after its first step, outside the jitted step or returned from it): a host callback inside
    would cost every step a sync, and no deviceless GPU compile takes one."""
    flags = []
    olds, news = old.get(FP8_COLLECTION, {}), new.get(FP8_COLLECTION, {})
    for (path, o), n in zip(jax.tree_util.tree_leaves_with_path(olds), jax.tree_util.tree_leaves(news)):
        if getattr(path[-1], "key", None) != "amax_history" or o.shape[-1] < 2:
            continue
        once = jnp.all(n[..., 1:] == o[..., :-1], axis=-1) | jnp.all(n == o, axis=-1)
        flags.append(jnp.any(jnp.any(o[..., :-1] != 0, axis=-1) & ~once))
    return functools.reduce(jnp.logical_or, flags, jnp.zeros((), bool))


def _scale_field(name) -> bool:
    return name == "scale" or str(name).endswith("_scale")


def keep_unreached(old: dict, new: dict) -> dict:
    """`new` FP8 state, except that each GEMM's state (a dict of leaves holding a scale: ours per operand, TE's
    per module) whose every scale is 0 is `old`'s: a real scale is never 0 (it starts at 1 and is only ever
    replaced by a positive one), so that is the zero "gradient" of a GEMM whose backward never ran."""
    def group(path) -> tuple:  # (the GEMM's whole path, every key kind: two models in a tuple stay apart; field)
        last = max((i for i, k in enumerate(path) if isinstance(k, jax.tree_util.DictKey)), default=None)
        return (jax.tree_util.keystr(path[:last]), path[last].key) if last is not None else (None, None)

    unreached: dict[tuple, list] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(new):
        where, name = group(path)
        if _scale_field(name):
            unreached.setdefault(where, []).append(jnp.all(leaf == 0))

    def pick(path, o, n):
        flags = unreached.get(group(path)[0])
        return n if not flags else jnp.where(functools.reduce(jnp.logical_and, flags), o, n)

    return jax.tree_util.tree_map_with_path(pick, old, new)


TE_COLLECTIONS = ("_overwrite_with_gradient", "fp8_metas")  # TE's dot_general wrappers; TE's layers


def _min_merged(path) -> bool:
    """Whether this FP8-state leaf merges by min: TE's quantizing `*_scale` (fp8_max / amax)."""
    return getattr(path[0], "key", None) in TE_COLLECTIONS and str(getattr(path[-1], "key", "")).endswith("_scale")


def merge_fp8(a: Any, b: Any) -> Any:
    """Merge two FP8 states (micro-batches, loss chunks, devices) so the safe, larger amax wins: element-wise
    max, except TE's quantizing scales (min). Histories, counters and our dequantizing scales: max."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x, y: jnp.minimum(x, y) if _min_merged(p) else jnp.maximum(x, y), a, b)


def merge_copies(state: Any) -> Any:
    """`merge_fp8` over axis 0 of stacked copies (the head's state, one copy per loss chunk)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.min(x, axis=0) if _min_merged(p) else jnp.max(x, axis=0), state)


def merge_identity(state: Any) -> Any:
    """The state `merge_fp8` leaves unchanged: zeros (every max-merged leaf is >= 0), +inf for min-merged ones."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.full_like(x, jnp.inf) if _min_merged(p) else jnp.zeros_like(x), state)


def _leaves(fp8_state: dict, field: str, operand: str | None = None) -> list:
    return [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(fp8_state)
            if getattr(path[-1], "key", None) == field
            and (operand is None or getattr(path[-2], "key", None) == operand)]


def nonfinite_total(fp8_state: dict) -> jax.Array:
    """Sum over every operand of the steps that saw a non-finite amax (0 with no FP8 state)."""
    return sum((jnp.sum(leaf) for leaf in _leaves(fp8_state, "nonfinite")), jnp.zeros((), jnp.float32))


SATURATION_WARN = 4.0
"""`saturation` at or above which a step counts as clipping (the largest values lost two binades). The train loop
warns only when such steps keep coming for longer than the amax history (`training.hooks.SaturationWatch`):
one, or a few close together, is delayed scaling catching up with a jump, which its history then absorbs."""


def _operands(fp8_state: dict) -> list[tuple[str, str, dict]]:
    """(name, operand, its state dict) of every operand of our FP8 GEMMs, in tree order (the same
    order for two states of one model)."""
    out = []
    for path, _ in jax.tree_util.tree_leaves_with_path(fp8_state.get(FP8_COLLECTION, {})):
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys[-1] == "scale" and keys[-2] in OPERANDS:
            meta = functools.reduce(lambda node, k: node[k], keys[:-1], fp8_state[FP8_COLLECTION])
            out.append(("/".join(keys[:-2]) + " " + keys[-2], keys[-2], meta))
    return out


def saturation_names(fp8_state: dict) -> list[str]:
    """What each index of `saturation`'s argmax names: "layer_1/mlp/gate/gemm grad" (a scanned layer's
    operand once per layer: "... grad [layer 3]")."""
    names = []
    for name, _, meta in _operands(fp8_state):
        scale = meta["scale"]
        names += [name] if scale.ndim == 0 else [f"{name} [layer {i}]" for i in range(scale.size)]
    return names


def saturation(old_state: dict, new_state: dict) -> tuple[jax.Array, jax.Array]:
    """(largest ratio, over our FP8 operands, of this step's amax to the largest value the delayed
    scale it was cast with can hold; the index of that operand in `saturation_names`).

    Above 1 the cast clipped values at the FP8 maximum: delayed scaling lags an amax that grows
    faster than its history (early training at a high learning rate, a gradient spike). Read from
    the states before and after a step: the new history's first entry is this step's amax."""
    ratios = [(new["amax_history"][..., 0] / jnp.maximum(old["scale"] * fp8_max(E5M2 if op == "grad" else E4M3),
                                                         1e-30)).reshape(-1)
              for (_, op, old), (_, _, new) in zip(_operands(old_state), _operands(new_state))]
    if not ratios:
        return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
    flat = jnp.concatenate(ratios).astype(jnp.float32)
    return jnp.max(flat), jnp.argmax(flat).astype(jnp.int32)


def saturation_targets(names: Sequence[str]) -> list[str]:
    """The `fp8.targets` entries that `saturation_names` entries belong to, in FP8_TARGETS order:
    "layer_1/attn/k/gemm grad" -> k, a fused "layer_0/attn/qkv ..." -> q, k, v, "head_gemm ..." -> head."""
    found = set()
    for name in names:
        for part in name.split(" ")[0].split("/"):
            found.update(("q", "k", "v") if part == "qkv" else ("head",) if part.startswith("head") else (part,))
    return [t for t in FP8_TARGETS if t in found]


def saturation_warning(first: int, last: int, history: int, worst: tuple[float, int], counts: dict[str, int],
                       cfg: Config) -> str:
    """The train loop's warning about clipping that persisted from step `first` to `last`, longer than the
    `history`-step amax history: `worst` = (ratio, step), `counts` = operand name -> its clipping steps (most
    first), `cfg` the run's `Config` (the fixes name its keys with values to set)."""
    ratio, at = worst
    names = list(counts)
    shown = ", ".join(f"{n} ({counts[n]} step{'s' if counts[n] > 1 else ''})" for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    margin = cfg.fp8.margin + max(1, math.ceil(math.log2(max(ratio, 1.0))))
    clipped = saturation_targets(names)
    keep = [t for t in cfg.fp8.targets if t not in clipped]
    bf16 = ([f"keep those projections in BF16 with fp8.targets=[{','.join(keep)}]"] if clipped and keep
            else ["train in BF16 with fp8.enabled=false"] if clipped else [])
    fixes = [f"give the scales headroom with fp8.margin={margin}",
             "scale each step from its own amax with fp8.scaling=current", *bf16, cfg.optim.lower_rate()]
    return (f"FP8 clipping has persisted from step {first} to step {last}, longer than the {history}-step amax "
            f"history (fp8.amax_history_len), so it is not delayed scaling catching up: the delayed scale of "
            f"{shown}{more} fell {SATURATION_WARN:g}x or more short of its amax (worst {ratio:.1f}x, step {at}), "
            f"and the largest values were clipped to the FP8 maximum. If the loss spikes or stalls: "
            f"{', or '.join(fixes)}; the per-step ratio is the metric fp8_saturation")


def underflow_mean(fp8_state: dict, operand: str = "grad") -> jax.Array:
    """Mean over FP8 GEMMs (layers included) of `operand`'s last-step underflow share."""
    leaves = [leaf.reshape(-1) for leaf in _leaves(fp8_state, "underflow", operand)]
    return jnp.mean(jnp.concatenate(leaves)) if leaves else jnp.zeros((), jnp.float32)
