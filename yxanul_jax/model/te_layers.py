"""Transformer Engine's fused FP8 layers on yxanul-jax's own parameters (`fp8.backend: te`, `fp8.te_layers: true`).

TE's `LayerNormDenseGeneral` and `LayerNormMLP` Flax modules are thin owners of parameters around two
functions, `layernorm_dense` and `layernorm_mlp`, which fuse the RMSNorm with the FP8 cast of its output
(and, for the MLP, the SwiGLU with the cast of its output) around TE's FP8 GEMMs. The modules here call
those same functions on the kernels and norm scales the model already owns, under their usual names
(`attn_norm/scale`, `attn/q/kernel`, ..., `mlp/down/kernel`), so a checkpoint, `plan` and the Llama export
are the same with and without fusion. Mapping onto TE's layers: LayerNormDenseGeneral's `scale` is
`attn_norm/scale` and its `kernel` is [q | k | v] side by side (one GEMM); LayerNormMLP's `scale` is
`mlp_norm/scale`, its `wi_kernel` [D, 2, F] is [gate, up] stacked (TE's ('silu', 'linear') activation
multiplies silu of the first by the second) and its `wo_kernel` is `down`.

Each module keeps TE's FP8 state (one quantizer set per GEMM) in TE's Flax collection, which the train
step treats like the `xla` backend's state (`fp8.merge_fp8`). TE has no CPU lowering: these layers
compile for a GPU (also deviceless: `analyze --target h100`) and run only on one.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from yxanul_jax.core.config import FP8Config
from yxanul_jax.model import fp8 as fp8_lib


@functools.lru_cache(maxsize=None)
def _quantizers_class():
    """A module that owns the FP8 state of `n` TE GEMMs (TE's base class, imported only when used)."""
    _, te_flax, _ = fp8_lib.import_te()

    class Quantizers(te_flax.module.TransformerEngineBase):
        recipe: Any
        n: int

        @nn.compact
        def __call__(self):
            return tuple(self.generate_quantizer_set(postfix=f"_{i}", fp8_recipe=self.recipe) for i in range(self.n))

    return Quantizers


def _quantizer_sets(fp8: FP8Config, n: int):
    return _quantizers_class()(fp8_lib.te_recipe(fp8), n, name="fp8")()


class NormDense(nn.Module):
    """RMSNorm(x) * scale @ [kernels side by side], fused by TE: one FP8 GEMM with the norm and cast before it."""

    fp8: FP8Config
    eps: float

    @nn.compact
    def __call__(self, x_BxLxD, scale_D, kernels):
        te, _, _ = fp8_lib.import_te()
        dtype = x_BxLxD.dtype
        kernel_DxO = jnp.concatenate([k.astype(dtype) for k in kernels], axis=1)
        (quantizers,) = _quantizer_sets(self.fp8, 1)
        return te.layernorm_dense.layernorm_dense(x_BxLxD, kernel_DxO, scale_D.astype(dtype), None, norm_type="rmsnorm",
                                                  epsilon=self.eps, quantizer_set=quantizers)


class NormSwiGLU(nn.Module):
    """down(silu(n @ gate) * (n @ up)) with n = RMSNorm(x) * scale, fused by TE's layernorm_mlp: two FP8 GEMMs."""

    fp8: FP8Config
    eps: float

    @nn.compact
    def __call__(self, x_BxLxD, scale_D, gate_DxF, up_DxF, down_FxD):
        te, _, _ = fp8_lib.import_te()
        dtype = x_BxLxD.dtype
        wi_Dx2xF = jnp.stack([gate_DxF.astype(dtype), up_DxF.astype(dtype)], axis=1)  # ('silu', 'linear') order
        return te.layernorm_mlp.layernorm_mlp(x_BxLxD, scale_D.astype(dtype), None, [wi_Dx2xF, down_FxD.astype(dtype)],
                                              [None, None], "rmsnorm", epsilon=self.eps,
                                              activation_type=("silu", "linear"),
                                              quantizer_sets=_quantizer_sets(self.fp8, 2))
