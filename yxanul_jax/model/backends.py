"""The dense-layer backends (plain BF16, our XLA FP8, Transformer Engine), each one object chosen once.

`dense_backend(fp8_config)` is the only place that reads `fp8.backend`; the model receives the object
it returns and never tests a backend's name. A backend answers these questions:

* `dot(module, x, w, dtype, target)`: the GEMM x[..., I] @ w[I, O] of one projection, its FP8 state
  (if any) owned by `module` (a `transformer.Matmul`);
* `for_target(target)`: the backend a projection runs on (itself for an FP8 target, `PLAIN` else);
* `fuses_norms(model)` with `norm_dense` / `norm_swiglu`: whether the blocks hand each RMSNorm to the
  layer after it (Transformer Engine's fused layers, `fp8.te_layers`), and those layers;
* `needs_bootstrap`, `reports_saturation`: what the train step does around the GEMMs (a fresh run's
  first step with current scaling; the delayed-scaling saturation metric);
* `shares_inputs` with `metas` / `dots`: whether GEMMs of one input (gate and up) may run from one FP8 cast of
  it (`fp8.fp8_dots`), the state declared where two `Matmul`s would keep it.

A new FP8 backend is a subclass here and one line in `dense_backend`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from yxanul_jax.core.config import FP8Config
from yxanul_jax.model import fp8 as fp8_lib


def _plain_dot(x, w_IxO, dtype):
    """x @ w in `dtype`. The GEMM accumulates in float32 inside (cuBLAS, Triton and XLA CPU do for BF16
    operands) and writes `dtype`: asking for a float32 output instead makes the backward GEMMs convert
    both operands to float32 (TF32 rate, twice the bytes) on a GPU."""
    return jax.lax.dot_general(x.astype(dtype), w_IxO.astype(dtype), (((x.ndim - 1,), (0,)), ((), ())),
                               preferred_element_type=dtype)


@dataclasses.dataclass(frozen=True)
class Plain:
    """No FP8: every projection a plain GEMM in the compute dtype (fp8.enabled=false or fp8.backend=none)."""

    fp8: FP8Config = FP8Config(enabled=False)
    is_fp8 = False
    needs_bootstrap = False
    reports_saturation = False
    shares_inputs = False  # `dots`: GEMMs of one input cast to FP8 once (gate and up)

    def for_target(self, target: str) -> "Plain":
        return PLAIN

    def dot(self, module, x, w_IxO, dtype, target: str):
        return _plain_dot(x, w_IxO, dtype)

    def fuses_norms(self, model) -> bool:
        return False


PLAIN = Plain()


@dataclasses.dataclass(frozen=True)
class _Fp8(Plain):
    """What the FP8 backends share: the targets of `fp8.targets` run in FP8, the rest `PLAIN`."""

    is_fp8 = True

    def for_target(self, target: str):
        return self if target in self.fp8.targets else PLAIN


@dataclasses.dataclass(frozen=True)
class XlaFp8(_Fp8):
    """Our native FP8 GEMMs (`fp8.fp8_dot`): state in the `fp8_meta` collection, delayed or current scaling."""

    @property
    def needs_bootstrap(self) -> bool:  # delayed scaling starts from an empty history (steps.fp8_bootstrap_config)
        return self.fp8.scaling == "delayed"

    @property
    def reports_saturation(self) -> bool:
        return self.fp8.scaling == "delayed"

    shares_inputs = True

    def metas(self, module) -> tuple:
        """One GEMM's FP8 state (input, kernel, grad), declared in `module`'s scope."""
        return tuple(module.variable(fp8_lib.FP8_COLLECTION, op, fp8_lib.init_meta, self.fp8.amax_history_len).value
                     for op in fp8_lib.OPERANDS)

    def _spec(self, dtype, target: str) -> fp8_lib.Fp8Spec:
        f = self.fp8
        return fp8_lib.Fp8Spec(dtype, f.margin, f.amax_compute_algo, f.scaling, underflow_stats=f.underflow_stats,
                               gemm_form=fp8_lib.gemm_form(f), wgrad=f.wgrad, input_barrier=target != "down")

    def dot(self, module, x, w_IxO, dtype, target: str):
        return fp8_lib.fp8_dot(x, w_IxO, *self.metas(module), self._spec(dtype, target))

    def dots(self, x, ws, metas, dtype, targets: tuple[str, ...]) -> tuple:
        """GEMMs of one input (`fp8.fp8_dots`: one cast of x), each in its projection's `NAME/gemm` scope; `metas`:
        each GEMM's `metas`."""
        return fp8_lib.fp8_dots(x, ws, metas, self._spec(dtype, targets[0])._replace(names=tuple(targets)))


@dataclasses.dataclass(frozen=True)
class TeFp8(_Fp8):
    """Transformer Engine JAX: its FP8 dot_general per projection, and with `fp8.te_layers` its fused
    RMSNorm + FP8 layers (`te_layers`); state in TE's own collections (`fp8.TE_COLLECTIONS`)."""

    def dot(self, module, x, w_IxO, dtype, target: str):
        _, te_flax, _ = fp8_lib.import_te()
        dot_general = te_flax.make_dot_general_cls(fp8_lib.te_recipe(self.fp8))()
        return dot_general(x.astype(dtype), w_IxO.astype(dtype), (((x.ndim - 1,), (0,)), ((), ()))).astype(dtype)

    def fuses_norms(self, model) -> bool:
        return self.fp8.te_layers and fp8_lib.fused_aligned(model)

    def norm_dense(self, eps: float, name: str):
        """TE's RMSNorm + FP8 GEMM over kernels side by side: `(x, scale, kernels) -> y` (a submodule)."""
        from yxanul_jax.model import te_layers

        return te_layers.NormDense(self.fp8, eps, name=name)

    def norm_swiglu(self, eps: float, name: str):
        """TE's RMSNorm + gate/up + SwiGLU + down: `(x, scale, gate, up, down) -> y` (a submodule)."""
        from yxanul_jax.model import te_layers

        return te_layers.NormSwiGLU(self.fp8, eps, name=name)


BACKENDS: dict[str, Any] = {"xla": XlaFp8, "te": TeFp8}


def dense_backend(fp8: FP8Config):
    """The backend object for an `FP8Config` (`PLAIN` when FP8 is off). Choosing one imports nothing:
    `fp8.check_backend` says whether it can run here (Transformer Engine is imported when a GEMM is
    traced), so abstract uses (`plan`, shapes) work on any machine."""
    return BACKENDS[fp8.backend](fp8) if fp8.active else PLAIN
