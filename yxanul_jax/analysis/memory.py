"""Memory estimate of one curriculum stage's train step, from shapes alone (no compile, no allocation).

The estimate follows what `steps.make_train_step` does, compiled with `donate_argnums=0`:

    peak = arguments + outputs - aliased + temporaries            (XLA's own memory analysis)
         = state + batch + temporaries                            (the state is donated: outputs alias it)

* state (exact; `state_bytes` equals `steps.abstract_train_state`, tested): float32 params (4 P
  bytes), the optimizer's (AdamW mu and nu, 8 P; under Muon, the default, 4 bytes a Muon parameter less:
  `accounting.state_bytes`), FP8 state (per FP8 GEMM 3 operands x (amax_history_len + 1)
  float32) and the step counter. P is `param_count` (equal to the plan's parameter count, tested).
* batch (exact): inputs, targets (int32) and mask (float32) of all A micro-batches: 12 A B L bytes.
* temporaries: the larger of two phases of the backward pass of one micro-batch of N = B L tokens,

      loss phase  = g_l G + saved + k_l a C V                 (the chunked loss runs)
      layer phase = g_b G + saved + N w_layer                  (a layer's backward pass runs)
      temp        = max(loss phase, layer phase) + e 4 V r + t_h 4 N D

  - G = 4 P bytes of float32 gradients, plus g_accum 4 P when grad_accum_steps > 1 (accumulator
    and micro-batch gradient both alive); g_l, g_b: how much of it is alive in each phase.
  - `saved`: what the forward pass keeps for the backward pass, n_layers x N x s(remat) bytes.
    Per token and layer (a = bytes of model.dtype, K head dim, H/G query/kv heads, F ffn width):
      none  s = 2 (8 D + 8)                      RMSNorm: float32 input and normalized copy, 2 stats
              + GEMM inputs                      a D per norm output feeding BF16 GEMMs, 1 byte per
                                                 FP8 GEMM input (q, k, v, gate, up: D; o: H K; down: F;
                                                 one D for a fused q/k/v and, `xla` backend in the
                                                 `dequant` form, for gate and up: `fp8.fp8_dots`),
                                                 a H K (o) and a F (down) when those are BF16; with
                                                 fp8.wgrad=bf16 every GEMM keeps its BF16 input;
                                                 unrolled on a GPU: fp8_norm_keep a D per norm read
                                                 only by FP8 GEMMs, and no BF16 F for an FP8 down
                                                 with BF16 weight gradients (XLA recomputes it)
              + a (H K + 2 G K)                  RoPE'd q and k, v
              + H L (9 + a) + 8 H                causal mask, float32 scores and exp, probabilities
              + 2 a F                            gate and up outputs (`transformer.swiglu`'s backward
                                                 recomputes silu from them)
      dots  s = a (H K + 2 G K + D + 2 F) + a D  GEMM outputs (q, k, v, o, gate, up) and input; 4 bytes
                                                 for an FP8 GEMM's output in the `f32` form
                                                 (`fp8.gemm_form`; auto: dequant on a GPU, f32 on a CPU)
      attention s = a D + a H K + 4 H            block input, cuDNN attention's output and float32
                                                 softmax statistics (a D as full without cuDNN)
      full  s = a D                              block input only
    These equal, byte for byte, what `jax.ad_checkpoint.print_saved_residuals` lists for the real
    model (tested for FP8 on/off/partial, bfloat16/float32, none/dots/full).
  - `w_layer`: one layer's backward working set per token: its recomputed `none` residuals (when
    remat is on) plus t_D D + t_F F + t_S H L bytes of gradients in flight, and on CPU the float32
    copies of `transformer.swiglu`'s backward (12 F; `swiglu_f32`).
  - k_l a C V: the chunked cross-entropy's logits and their gradient (in the head GEMM's dtype, a bytes),
    C = min(train.loss_chunk, N); k_l = loss_multi with several chunks, loss_single when one chunk covers
    the micro-batch (XLA then inlines the one-step loop).
    With the fused head + loss (`train.loss_kernel` resolving to `fused` on the `gpu` platform) there
    are no logits: the term is the kernels' own buffers (per token float32 lse, target logit and their
    gradients, the head input and its gradient; the table's compute-dtype copy and float32 gradient).
  - e 4 V r: float32 copies of the vocabulary-sized matrices (embedding gradient and its scatter;
    r = embed_rank, or d_model; an untied head adds its D x V); t_h 4 N D: hidden-state buffers.

Calibration. The coefficients (`Calibration`) were fitted (robust least squares on the relative
error of the peak) to XLA's CPU memory analysis of the real step (`compile_stage(...)
.memory_analysis()`, jax 0.10.2, 60 compiles): tiny, a 4-layer 256-wide model, pythia-70m-capped,
yxanul-197m and yxanul-270m shapes, remat none/dots/full, scanned and unrolled layers, FP8 on,
off and on the head, bfloat16 and float32, untied/factorized/tied heads, sequence lengths 8 to
2,048, one and several loss chunks, 1 to 32 accumulated micro-batches. Fit residuals: largest
13.5 %, RMS 5 %. scripts/check_plan.py compares the planner with fresh compiles (docs/MEMORY.md:
largest error 9.5 % over 10 curriculum stages, 5 of them not in the fit). Two platforms:

* `cpu` reproduces what XLA's CPU backend does: it keeps the residual stream (block inputs) in
  float32 whatever model.dtype is; bfloat16 and float32 models take the same memory (measured within
  3 %), so the formula runs with a = 2 for both; a scanned layer without remat keeps cpu_scan_none
  times its residuals; and remat saves nothing for unrolled layers (`scan_layers: false`, or
  `scan_unroll` = n_layers): XLA CPU schedules the recomputation early, so remat there costs what none
  costs (measured).
* `gpu` (the default for planning) uses model.dtype for a and the residual stream, honors remat
  for unrolled layers, and has coefficients of its own (`GPU_CALIBRATION`), fitted to XLA's sm_90
  memory analysis of deviceless H100 compiles (`scripts/fit_plan.py collect --target h100`);
  `scripts/check_plan.py --target h100` compares it with fresh ones (docs/MEMORY.md).

Attention: XLA's attention materializes the H x L x L scores: the H L terms above, quadratic in the
sequence length. On the `gpu` platform `model.attention: cudnn`, and `auto` for BF16 with head_dim
<= 128 (which the model then runs on cuDNN, see `transformer.attention_implementation`), is planned
as flash attention: float32 row statistics (4 H bytes per token) instead of the scores, and no
score term in the working set (not measured here: cuDNN does not run on CPU). `short` attention (auto's
choice on a GPU up to 32 tokens) adds `SHORT_SCORE_BYTES` per score to the working set.

Not modeled: the CUDA context and cuBLAS/cuDNN workspaces (a few hundred MB, outside JAX's pool;
that is what the headroom is for), activation sharding across devices (the estimate is for one
device holding the whole micro-batch), and the FP8 state of the Transformer Engine backend (its
own collections; `fp8.backend: te` is planned with the activations of the xla backend).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Literal

from yxanul_jax.analysis import gpus
from yxanul_jax.analysis.accounting import fp8_gemms, param_count, state_bytes, vocab_matrix_elements
from yxanul_jax.core.config import Config, StageConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model.fp8 import gemm_form
from yxanul_jax.model.loss import loss_kernel
from yxanul_jax.model.transformer import attention_implementation

Platform = Literal["gpu", "cpu"]
MiB, GiB = 2 ** 20, 2 ** 30

JAX_DEFAULT_MEM_FRACTION = 0.75  # JAX preallocates this share of GPU memory unless told otherwise
# The share of JAX's pool `plan` keeps free by default. 0.20 since the first GPU measurement (H200, JAX 0.11.2,
# 2026-11-26): yxanul-197m's real peaks were 9-19 % above this planner (12.8 GiB against 11.7 at stage 9
# BF16, 13.7 FP8, 8.5 against 7.2 at stage 0), JAX 0.11 compiling 7-11 % more than the JAX 0.10 compiles
# the planner is fitted to. 0.10 would have let a plan that fits on paper run out of memory.
DEFAULT_HEADROOM = 0.20


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Coefficients fitted to XLA's CPU memory analysis (robust least squares over 60 compiles;
    module docstring). They are fitted, not derived: g_layer < 1, for instance, says that XLA frees
    or reuses part of the gradient buffers while a layer's backward pass runs."""

    g_loss: float = 1.03  # float32 parameter copies alive during the loss (gradient accumulator, ...)
    g_layer: float = 0.56  # ... and during the layers' backward pass
    g_accum: float = 0.5  # extra copies when grad_accum_steps > 1 (accumulator + micro-batch gradient)
    embed: float = 0.78  # float32 copies of the vocabulary-sized matrices (embedding gradient, scatter)
    t_D: float = 7.5  # bytes per token per d_model unit of gradients in flight in one layer
    t_F: float = 8.2  # ... per ffn_dim unit
    t_S: float = 5.3  # ... per attention score (H x L per token)
    t_h: float = 1.6  # float32 hidden-state buffers (final norm, its gradient) per token per d_model
    loss_multi: float = 11.64  # bytes per chunk x vocab logit and byte of the compute dtype, several loss chunks
    loss_single: float = 6.63  # ... with one chunk (XLA inlines the loop)
    cpu_scan_none: float = 1.6  # XLA CPU keeps this much more for a scanned layer without remat
    norm_keep: float = 1.0  # share of the RMSNorms' float32 residuals kept (XLA GPU fuses the norms)
    mlp_keep: float = 1.0  # share of the SwiGLU's 2 a F residual bytes kept
    recompute: float = 1.0  # share of a rematerialized layer's residuals alive in its backward pass
    swiglu_f32: float = 1.0  # float32 copies of gate, up and their gradient in `swiglu`'s backward (XLA GPU fuses them)
    fp8_norm_keep: float = 1.0  # a D per norm kept when only FP8 GEMMs with FP8 weight gradients read it (fitted)


CALIBRATION = Calibration()
# loss_multi, loss_single refitted alone (the others held) to the 31 CPU compiles of scripts/fit_plan.py after the
# chunked loss began to keep the head GEMM's dtype (2026-11-27, jax 0.10.2): RMS error 16.9 % (17.0 % before on the
# same set; its largest, 74 %, is yxanul-197m stage 9 without remat, as before).
# Fitted to XLA's sm_90 memory analysis: 61 deviceless H100 compiles (scripts/fit_plan.py, jax 0.10.2, 2026-11-29;
# rows and start in docs/bench/fit_plan_sm90_*2026-11-29*) of tiny, pythia-70m-capped, yxanul-197m and -270m variants:
# remat none/dots/attention/full, FP8 on/off/head, bfloat16/float32, untied head, accumulation, a wider tiny, the
# 197m's layers in a loop and (as its config runs them) without one at 8, 14 and 28 layers, `none` whole and split,
# cuDNN's, XLA's and short attention from 8 to 2,048 tokens, `full` up to 524,288 tokens a micro-batch, and the
# narrow models `plan --gpu gtx1650` suggests. Largest error 10.1 % (an 8-layer cut with XLA's attention at 128
# tokens), RMS 4.1 %; the configs' own path (cuDNN attention, no loop) within 7.3 % (the 270m's stage 0, over; the
# 197m's within 5.4 %). The coefficients before (fitted 2026-11-21 to 29 compiles whose 197m and 270m rows all had
# 28 layers and cuDNN's attention) planned XLA's attention at 2,048 tokens 54-59 % under XLA and an 8-layer cut 10-16 %
# over (docs/MEMORY.md). They are a fit, not a measurement each: the data identifies them poorly (fitting again from
# them lands elsewhere with similar errors), so trust the errors over the rows, not one coefficient's value as "the
# share XLA keeps".
GPU_CALIBRATION = Calibration(g_loss=0.637, g_layer=0.831, g_accum=1.868, embed=0.187, t_D=0.466, t_F=0.462,
                              t_S=5.687, t_h=6.187, loss_multi=1.146, loss_single=1.2, norm_keep=0.018,
                              mlp_keep=0.802, recompute=0.345, swiglu_f32=0.033, fp8_norm_keep=1.142)


# --------------------------------------------------------------------------------------------
# GPU budget


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    mem_fraction: float
    headroom: float

    @property
    def budget_bytes(self) -> int:
        """Bytes a train step may use: JAX's pool (mem_fraction of the card) less the headroom."""
        return int(self.total_bytes * self.mem_fraction * (1.0 - self.headroom))


def mem_fraction_from_env() -> float:
    """XLA_PYTHON_CLIENT_MEM_FRACTION if set (JAX's preallocated share), else JAX's default 0.75."""
    raw = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if raw is None:
        return JAX_DEFAULT_MEM_FRACTION
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r} is not a number; set it to e.g. 0.90 or unset it")
    if not 0 < value <= 1:
        raise UserError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw} must be in (0, 1]")
    return value


def parse_gpu(spec: str, headroom: float = DEFAULT_HEADROOM, mem_fraction: float | None = None) -> Gpu:
    """A GPU by name (`rtx4090`, `4090`, `h100`, `a100-40`, ...: `analysis.gpus`) or by memory size with a
    unit (`24GB`, GiB as nvidia-smi counts). A bare number that is no GPU's name is refused: `24` could be
    either."""
    if not 0 <= headroom < 1:
        raise UserError(f"--headroom {headroom} must be in [0, 1), e.g. 0.1 for 10 %")
    fraction = mem_fraction_from_env() if mem_fraction is None else mem_fraction
    known = gpus.lookup(spec)
    if known is not None:
        return Gpu(known.key, known.memory_bytes, fraction, headroom)
    key = spec.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(gb|gib|g)", key)
    if m and float(m.group(1)) > 0:
        return Gpu(f"{float(m.group(1)):g} GB", int(float(m.group(1)) * GiB), fraction, headroom)
    if m:
        raise UserError(f"--gpu {spec}: a memory size must be more than 0, e.g. 24GB")
    if re.fullmatch(r"\d+(?:\.\d+)?", key):
        raise UserError(f"--gpu {spec} is ambiguous: a GPU name or a memory size? Write {spec}GB for a size, or "
                        f"one of {', '.join(gpus.names())}")
    close = gpus.closest(spec)
    hint = f" (did you mean '{close}'?)" if close else ""
    raise UserError(f"unknown GPU '{spec}'{hint}; use one of {', '.join(gpus.names())} or a size such as 24GB")


# --------------------------------------------------------------------------------------------
# Shapes


def _dtype_bytes(name: str) -> int:
    return {"bfloat16": 2, "float32": 4}[name]


def _fp8_targets(cfg: Config) -> set[str]:
    """Projections whose GEMM runs in FP8 (TE's fused `qkv` and `mlp` GEMMs stand for their projections)."""
    names = {t for t, _, _ in fp8_gemms(cfg.model, cfg.fp8)}
    return names | ({"q", "k", "v"} if "qkv" in names else set()) | ({"gate", "up"} if "mlp" in names else set())


def saved_bytes_per_token(cfg: Config, seq_len: int, remat: str, residual_bytes: int | None = None,
                          act_bytes: int | None = None, flash: bool = False, cal: "Calibration | None" = None,
                          platform: Platform = "cpu") -> float:
    """Bytes one layer keeps for the backward pass per token (module docstring: `s`).

    `act_bytes` overrides a (the bytes of model.dtype), `residual_bytes` the bytes of the block input;
    `flash`: cuDNN attention keeps float32 row statistics instead of the H x L x L scores; `platform` resolves
    `fp8.gemm_form: auto` (an FP8 GEMM that writes BF16 leaves a BF16 output to `dots`)."""
    m = cfg.model
    a = _dtype_bytes(m.dtype) if act_bytes is None else act_bytes
    r = a if residual_bytes is None else residual_bytes
    D, F, H, G, K, L = m.d_model, m.ffn_dim, m.n_heads, m.n_kv_heads, m.resolved_head_dim, seq_len
    if remat == "full":
        return r * D
    if remat == "attention":  # the block input, and what cuDNN's forward returns (transformer._save_attention)
        return r * D + (a * H * K + 4 * H if flash else 0)
    fp8 = _fp8_targets(cfg)
    if remat == "dots":  # every GEMM output but down's: the compute dtype's, float32 from an FP8 GEMM of the f32 form
        writes_out_dtype = cfg.fp8.native and gemm_form(cfg.fp8, cfg.train.xla_options, platform) != "f32"
        widths = {"q": H * K, "k": G * K, "v": G * K, "o": D, "gate": F, "up": F}
        return sum(w * (4 if t in fp8 and not writes_out_dtype else a) for t, w in widths.items()) + r * D
    norm_keep, mlp_keep, fp8_norm_keep = ((cal.norm_keep, cal.mlp_keep, cal.fp8_norm_keep) if cal is not None
                                          else (1.0, 1.0, 1.0))
    # an FP8 GEMM keeps its quantized input (1 byte) for the weight gradient, or its BF16 input with fp8.wgrad=bf16
    fp8_in = set() if cfg.fp8.native and cfg.fp8.wgrad == "bf16" else fp8
    s = norm_keep * 2 * (8 * D + 8)
    unrolled_gpu = platform == "gpu" and not m.layer_loop
    for group in (("q", "k", "v"), ("gate", "up")):
        if not fp8_in:
            s += a * D  # the norm's output, shared by the group's GEMMs
            continue
        if unrolled_gpu and all(t in fp8_in for t in group):
            # No BF16 GEMM keeps the norm's output; XLA keeps about a norm's worth beside the FP8 inputs (fitted:
            # Calibration.fp8_norm_keep)
            s += fp8_norm_keep * a * D
        # one quantized input: a fused q/k/v GEMM's; gate and up's one cast (`fp8.fp8_dots`) in the `dequant` form
        # (in the others each GEMM keeps a handle of its own: `fp8._apart`)
        one_cast = (m.fuse_projections if group == ("q", "k", "v")
                    else cfg.fp8.native and gemm_form(cfg.fp8, cfg.train.xla_options, platform) == "dequant")
        if one_cast and all(t in fp8 for t in group):
            s += D
            continue
        if any(t not in fp8 for t in group):
            s += a * D  # the norm's output, shared by the group's BF16 GEMMs
        s += D * sum(t in fp8 for t in group)
    s += H * K if "o" in fp8_in else a * H * K
    # down's input: its FP8 copy, or its BF16 self; except for an FP8 down with BF16 weight gradients unrolled on a
    # GPU, where XLA computes it again in the backward from gate and up (kept below; `transformer.swiglu`'s float32
    # product), which their backward reads anyway (sm_90, yxanul-197m, 2026-11-27: 7.2 GB less at stage 9; a BF16
    # model keeps it)
    s += F if "down" in fp8_in else 0 if unrolled_gpu and "down" in fp8 else a * F
    s += a * (H * K + 2 * G * K) + (4 * H if flash else H * L * (9 + a) + 8 * H)
    s += mlp_keep * 2 * a * F
    if platform == "gpu" and not fp8 and not m.layer_loop:
        # Fitted, not derived: without FP8 GEMMs and without a loop over the layers XLA keeps 2 a D bytes more per
        # token and layer (sm_90 compiles of yxanul-197m stage 0, remat none, jax 0.10.2, 2026-11-27: BF16 against
        # FP8, 5.32 GB more at 28 layers, 1.19 at 8: 3.1 KB per token and layer)
        s += 2 * a * D
    return s


# --------------------------------------------------------------------------------------------
# The estimate


def estimate_stage(cfg: Config, stage: StageConfig, platform: Platform = "gpu", remat: str | None = None,
                   state: dict | None = None, cal: Calibration | None = None, budget: int | None = None,
                   split: int | None = None) -> dict:
    """Bytes of one stage's compiled train step, by component (all ints, JSON-ready).

    Keys: weights, gradients (float32 copies alive at the peak), optimizer, fp8_state, batch,
    activations (saved for the backward pass), working (one layer's backward working set), logits
    (the chunked loss's logits and their gradient), other (embedding-gradient copies, hidden-state
    buffers, the step counter), temp, bytes_total (the peak), phase ('loss' or 'layer': the part of the
    backward pass that sets the peak; only that phase's `logits` or `working` counts in the total), remat (the
    policy planned: `auto` resolved), micro_split (the micro-batch's split: `train.micro_split`, or `auto`'s).
    `remat` overrides model.remat; `state` reuses `state_bytes(cfg)` across calls; `budget` (bytes) is what
    `remat: auto` chooses for (`stage_choice`); `split` overrides train.micro_split (with `auto`: the only split
    it may choose).
    """
    m = cfg.model
    cal = cal or (GPU_CALIBRATION if platform == "gpu" else CALIBRATION)
    st = state if state is not None else state_bytes(cfg)
    if remat is None:
        remat, split = stage_choice(cfg, stage, budget, platform, st, split)
    split = cfg.train.micro_split if split is None else split
    stage = stage.split(split)
    P = st["weights"] // 4
    a = _dtype_bytes(m.dtype)
    N = stage.batch_size * stage.seq_len
    effective = remat
    residual = a
    if platform == "cpu":
        a, residual = 2, 4  # XLA CPU: the same bytes for bfloat16 and float32 models, a float32 residual stream
        if not m.layer_loop:
            effective = "none"  # XLA CPU hoists the recomputation of unrolled layers: no saving
    flash = platform == "gpu" and attention_implementation(m, "gpu", stage.seq_len) == "cudnn"
    keep = cal
    if platform == "gpu" and m.layer_loop and effective == "none":
        # A scanned layer without remat hands every residual out of the loop body as a stacked buffer: XLA
        # cannot fuse the norms or the SwiGLU away there (sm_90: float32 [N, D] and several [N, F] stacks).
        keep = dataclasses.replace(cal, norm_keep=1.0, mlp_keep=1.0)
    saved = m.n_layers * N * saved_bytes_per_token(cfg, stage.seq_len, effective, residual, a, flash, keep, platform)
    if platform == "cpu" and m.layer_loop and effective == "none":
        saved *= cal.cpu_scan_none  # XLA CPU keeps extra copies of an unrematerialized scanned layer
    # A rematerialized layer's recomputed residuals, counted by the rules without XLA GPU's fusions (`cpu`) on every
    # platform, a choice, not an oversight: with the `gpu` rules the 61 sm_90 rows of 2026-11-29 fit to 11.5-12.3 %
    # at worst from three starts, against GPU_CALIBRATION's 10.1 % (scripts/fit_plan.py fit, 2026-11-29)
    recompute = 0 if effective == "none" else cal.recompute * saved_bytes_per_token(cfg, stage.seq_len, "none",
                                                                                    residual, a, flash, cal, "cpu")
    scores = 0 if flash else cal.t_S * m.n_heads * stage.seq_len
    if attention_implementation(m, platform, stage.seq_len) == "short":
        scores += SHORT_SCORE_BYTES * m.n_heads * m.n_kv_heads * stage.seq_len
    w_layer = recompute + cal.t_D * m.d_model + (cal.t_F + 12 * cal.swiglu_f32) * m.ffn_dim + scores
    chunk = max(1, min(cfg.train.loss_chunk, N))
    k_l = cal.loss_single if chunk >= N else cal.loss_multi
    logits = k_l * a * chunk * m.padded_vocab  # the logits and their gradient in the head GEMM's dtype
    if loss_kernel(cfg.train.loss_kernel, m, cfg.fp8, platform) == "fused":
        # The fused kernels keep no logits: float32 lse, target logit and their gradients per token, the
        # head input x and its gradient (a N K each), the training forward's float32 a = softmax @ w (4 N K), the
        # table's compute-dtype copy and its float32 gradient.
        K = m.head_width
        logits = 4 * 4 * N + (2 * a + 4) * N * K + (a + 4) * m.padded_vocab * K
    grads = 4 * P
    if stage.grad_accum_steps > 1:  # the accumulator and this micro-batch's gradient are both alive
        grads += cal.g_accum * 4 * P
    loss_phase = cal.g_loss * grads + logits
    layer_phase = cal.g_layer * grads + N * w_layer
    phase = "loss" if loss_phase >= layer_phase else "layer"
    other = cal.embed * 4 * vocab_matrix_elements(cfg) + cal.t_h * 4 * N * m.d_model
    temp = saved + max(loss_phase, layer_phase) + other
    batch = 12 * stage.grad_accum_steps * N
    total = st["weights"] + st["optimizer"] + st["fp8_state"] + st["misc_state"] + batch + temp
    g_live = cal.g_loss if phase == "loss" else cal.g_layer
    return {k: int(round(v)) for k, v in {
        "weights": st["weights"], "gradients": g_live * grads, "optimizer": st["optimizer"],
        "fp8_state": st["fp8_state"], "batch": batch, "activations": saved, "working": N * w_layer,
        "logits": logits, "other": other + st["misc_state"], "temp": temp, "bytes_total": total}.items()} | {
        "phase": phase, "remat": remat, "micro_split": split}


# `transformer.short_attention` holds its float32 [L*H x L*G] scores per row of the batch (G times the L x H
# a token needs: the other kv heads' pairs are masked) beyond what XLA's attention keeps: sm_90 compiles of
# yxanul-197m stage 2 (seq 32, G = 2), jax 0.10.2, 2026-11-26: 14.286 GB against XLA's attention 13.984, 3.0
# bytes per H x L x G score of a token. (Its first form, broadcast products, took 7.6-11.8 per H x L score.)
SHORT_SCORE_BYTES = 3.0

# `model.remat: auto` takes the first of these whose planned peak fits, fastest first as the performance model
# ranks them (`analyze --target h100`, yxanul-197m stage 9 FP8, jax 0.10.2, 2026-11-26: attention 651.4 ms, full
# 665.9; `none` 1172 and `dots` 706 are slower even where they fit: XLA stacks every residual of a scanned layer,
# 224 against 183 ms at batch 16). The last one is taken when none fits.
AUTO_REMAT = ("attention", "full")
# Without a loop over the layers (`model.scan_unroll` = n_layers) nothing is stacked, and `none` comes first where
# it fits: analyze --target h100, yxanul-197m FP8, jax 0.10.2, 2026-11-27: stage 0 `none` 224.5 ms (XLA's peak
# 40.8 GB, planned 41.2) against `full` 265.6 in the loop; stage 9 `attention` 597.6 (19.1 GB) against 619.3.
AUTO_REMAT_UNROLLED = ("none", "attention", "full")
# ... and `none` may run each micro-batch in 2 or 4 (`train.micro_split`) where whole it does not fit: a step without
# recomputation in smaller micro-batches beats one that recomputes. analyze --target h100, yxanul-197m stage 9
# (64 rows of 2,048), jax 0.10.2, 2026-11-27, after the fused CE's single forward: FP8 `none` in 2 micro-batches
# 530.7 ms (XLA's peak 39.7 GB, planned 40.3), in 4: 549.2 (21.5 GB, planned 22.1), against `attention` whole
# 577.3 (in 2: 595.8: a split costs ~18 ms there, so the other policies are not split); BF16 `none` in 2: 534.6.
# Stage 0 (8 x 8192): `none` whole 214.3, in 2 225.7, in 4 245.5, `full` whole 252.2.
AUTO_SPLITS = (1, 2, 4)


def stage_choice(cfg: Config, stage: StageConfig, budget: int | None, platform: Platform = "gpu",
                 state: dict | None = None, split: int | None = None, devices: int = 1) -> tuple[str, int]:
    """(remat policy, micro-batch split) `stage`'s train step runs with: model.remat and train.micro_split, or for
    `auto` the first of `AUTO_REMAT` (`AUTO_REMAT_UNROLLED` without a loop over the layers, `none` split by each of
    `AUTO_SPLITS` in turn that divides the stage's batch_size) whose planned peak fits `budget` bytes (without a
    budget, the last policy: the one that saves the most memory). `split` given, or train.micro_split set (not 1):
    that split only. On several `devices` `auto` does not split (the budget is planned as if one device held the
    whole micro-batch, so a split there is rarely needed, and each piece would gather FSDP's weights again).
    `attention` is `full` where the stage's attention is not cuDNN's, and is then named so."""
    if cfg.model.remat != "auto":
        return cfg.model.remat, cfg.train.micro_split if split is None else split
    if split is None and (cfg.train.micro_split != 1 or devices > 1):
        split = cfg.train.micro_split  # set by hand, or on a mesh: that split only
    order = AUTO_REMAT if cfg.model.layer_loop else AUTO_REMAT_UNROLLED
    if budget is None:
        return order[-1], split or 1
    cudnn = platform == "gpu" and attention_implementation(cfg.model, "gpu", stage.seq_len) == "cudnn"
    for policy in order[:-1]:
        if policy == "attention" and not cudnn:
            continue
        splits = (split,) if split is not None else AUTO_SPLITS if policy == "none" else (1,)
        for k in (k for k in splits if stage.batch_size % k == 0):
            if estimate_stage(cfg, stage, platform, policy, state, split=k)["bytes_total"] <= budget:
                return policy, k
    return order[-1], split or 1


def remat_label(remat: str, split: int) -> str:
    """A stage's policy and split in words for tables and logs: `none`, or `none/2` (each micro-batch run in 2)."""
    return remat if split == 1 else f"{remat}/{split}"


def step_device(device=None):
    """The device a train step is planned and built for: `device`, or this process's first (every process of a
    multi-host run asks its own, which are alike)."""
    import jax

    return device or jax.local_devices()[0]


def device_budget(device=None, headroom: float = DEFAULT_HEADROOM) -> tuple[int | None, Platform]:
    """(bytes a train step may use on `device`, its planner platform): JAX's pool as the device reports it
    (`bytes_limit`), else the pool of its GPU model (a compile-only device: `gpus.of_device_kind`), else, for
    a CPU, the host's memory; less `headroom`. None for a GPU that reports neither (`auto` then takes the
    policy that saves the most). Default device: `step_device`'s. The budget is one device's, planned as if it
    held the whole micro-batch: on a mesh that shards the batch, `auto` errs toward saving memory."""
    device = step_device(device)
    platform: Platform = "gpu" if device.platform == "gpu" else "cpu"
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except (RuntimeError, NotImplementedError, AttributeError):  # compile-only devices keep no statistics
        limit = None
    spec = gpus.of_device_kind(device.device_kind) if platform == "gpu" and not limit else None
    if limit:  # JAX's pool itself
        pool = Gpu(device.device_kind, int(limit), 1.0, headroom)
    elif spec is not None:
        pool = Gpu(spec.key, spec.memory_bytes, mem_fraction_from_env(), headroom)
    elif platform == "cpu":
        pool = Gpu("host", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), 1.0, headroom)
    else:
        return None, platform
    return pool.budget_bytes, platform


def with_stage_remat(cfg: Config, stage: StageConfig, device=None) -> Config:
    """`cfg` with model.remat and train.micro_split as `stage` runs them on `device` (`stage_choice` within
    `device_budget`)."""
    if cfg.model.remat != "auto":
        return cfg
    import jax

    budget, platform = device_budget(device)
    remat, split = stage_choice(cfg, stage, budget, platform, devices=1 if device is not None else jax.device_count())
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat),
                               train=dataclasses.replace(cfg.train, micro_split=split))


def max_batch_size(cfg: Config, stage: StageConfig, budget: int, platform: Platform = "gpu",
                   state: dict | None = None, limit: int = 1 << 20) -> int:
    """Largest micro-batch (rows, a multiple of train.micro_split) of `stage` whose estimate fits `budget` bytes,
    split as train.micro_split says (never more: `auto`'s own splits are a step's way to run a layout, not a
    layout); 0 if not even the smallest does."""
    st = state if state is not None else state_bytes(cfg)
    k = cfg.train.micro_split

    def fits(units: int) -> bool:
        rows = dataclasses.replace(stage, batch_size=units * k)
        return estimate_stage(cfg, rows, platform, state=st, budget=budget, split=k)["bytes_total"] <= budget

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi * k <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit // k + 1)
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * k


# --------------------------------------------------------------------------------------------
# A configuration that fits


def _divisors(n: int) -> list[int]:
    """Divisors of n, largest first."""
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)


def _largest_fitting(cfg: Config, s: StageConfig, budget: int, platform: Platform, st: dict,
                     above: int = 0) -> StageConfig | None:
    """`s` with the largest micro-batch above `above` rows that fits `budget`, among the divisors of its rows per
    step (grad_accum_steps set so tokens per step stay the same); None when none does."""
    rows, k = s.batch_size * s.grad_accum_steps, cfg.train.micro_split
    cap = max(1, max_batch_size(cfg, s, budget, platform, state=st))  # prunes the divisor scan
    for b in _divisors(rows):  # largest first
        if above < b <= cap and b % k == 0:
            new = dataclasses.replace(s, batch_size=b, grad_accum_steps=rows // b)
            if estimate_stage(cfg, new, platform, state=st, budget=budget, split=k)["bytes_total"] <= budget:
                return new
    return None


def _fit_batches(cfg: Config, budget: int, platform: Platform) -> tuple[Config, bool]:
    """Each stage that does not fit gets the largest micro-batch that does among the divisors of its
    rows per step, with grad_accum_steps raised so tokens per step stay the same.
    (config, every stage fits)."""
    st = state_bytes(cfg)
    stages, ok = [], True
    for s in cfg.curriculum:
        k = cfg.train.micro_split
        if estimate_stage(cfg, s, platform, state=st, budget=budget, split=k)["bytes_total"] <= budget:
            stages.append(s)
            continue
        new = _largest_fitting(cfg, s, budget, platform, st)
        ok &= new is not None
        stages.append(new or dataclasses.replace(s, batch_size=k, grad_accum_steps=s.batch_size * s.grad_accum_steps // k))
    return dataclasses.replace(cfg, curriculum=tuple(stages)), ok


def largest_micro_batches(cfg: Config, budget: int, platform: Platform = "gpu") -> Config:
    """`cfg` with each stage's largest micro-batch that fits `budget` bytes, among the divisors of its rows per
    step (grad_accum_steps lowered to match: tokens per step unchanged, the same sums): fewer, larger GEMMs and
    one FP8 cast of each weight per micro-batch fewer. A stage that cannot grow keeps its layout, and so does one
    whose grown micro-batch `remat: auto` would run in pieces no larger than before (`stage_choice`'s split)."""
    st = state_bytes(cfg)

    def piece(s: StageConfig) -> int:  # the rows a step runs at once, `auto`'s split applied
        return s.batch_size // stage_choice(cfg, s, budget, platform, st)[1]

    def grown(s: StageConfig) -> StageConfig:
        new = _largest_fitting(cfg, s, budget, platform, st, s.batch_size)
        return new if new is not None and piece(new) > piece(s) else s

    return dataclasses.replace(cfg, curriculum=tuple(grown(s) for s in cfg.curriculum))


def _round_to(x: float, q: int) -> int:
    return max(q, int(round(x / q)) * q)


def _shrunk(cfg: Config, width: float, depth: float) -> Config:
    """The model at `width` x d_model (head_dim kept, so fewer heads) and `depth` x n_layers; FFN and
    embedding rank keep their ratio to d_model; vocabulary (the tokenizer's) unchanged."""
    m = cfg.model
    K = m.resolved_head_dim
    heads = max(1, int(round(m.n_heads * width)))
    kv = max(1, int(round(heads * m.n_kv_heads / m.n_heads)))  # about the same GQA ratio
    while heads % kv:
        kv -= 1
    d = heads * K
    ffn = _round_to(m.ffn_dim * d / m.d_model, 64)
    rank = min(_round_to(m.embed_rank * d / m.d_model, 16), d) if m.embed_rank else 0
    model = dataclasses.replace(m, d_model=d, n_heads=heads, n_kv_heads=kv, head_dim=m.head_dim and K, ffn_dim=ffn,
                                n_layers=max(1, int(round(m.n_layers * depth))), embed_rank=rank)
    return dataclasses.replace(cfg, model=model)


def suggest_config(cfg: Config, budget: int, platform: Platform = "gpu", tag: str = "fit",
                   min_loss_chunk: int = 256) -> tuple[Config, list[str], bool]:
    """A configuration close to `cfg` whose every stage fits `budget` bytes.

    In order, each step only if the previous ones were not enough: (1) lower the micro-batch and
    raise grad_accum_steps (tokens per step unchanged); (2) full remat with scanned layers and a
    smaller loss chunk; (3) a narrower, then shallower model (same vocabulary and head dimension).
    The model is renamed `<name>-<tag>` so that its runs get their own directory.
    Returns (config, what changed in words, whether it fits).
    """
    m, t = cfg.model, cfg.train
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(m, name=f"{m.name}-{tag}"))
    out, ok = _fit_batches(cfg, budget, platform)
    if ok:
        return out, batch_notes(cfg, out), True
    notes: list[str] = []
    saving = m.remat if m.remat in ("full", "auto") else "full"  # auto takes full where nothing else fits
    saver = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=saving, scan_layers=True))
    if (saving, m.scan_layers) != (m.remat, True):
        notes.append("remat full with scanned layers (keep only each block's input for the backward pass)")
    chunks = [t.loss_chunk]
    while chunks[-1] > min_loss_chunk:
        chunks.append(max(min_loss_chunk, chunks[-1] // 2))
    for chunk in chunks:  # the largest loss chunk that lets every stage fit
        saver = dataclasses.replace(saver, train=dataclasses.replace(t, loss_chunk=chunk))
        out, ok = _fit_batches(saver, budget, platform)
        if ok:
            break
    if saver.train.loss_chunk < t.loss_chunk:
        notes.append(f"loss chunk {t.loss_chunk:,} -> {saver.train.loss_chunk:,} tokens (a smaller logits block)")
    if ok:
        return out, notes + batch_notes(cfg, out), True
    # Shrink the model (the seeds' GTX 1650 recipe: same vocabulary, narrower): the largest of these
    # widths x depths whose every stage fits.
    candidates = [(w, dd) for dd in (1.0, 0.75, 0.5, 0.25) for w in (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25)
                  if (w, dd) != (1.0, 1.0)]
    candidates.sort(key=lambda wd: -param_count(_shrunk(saver, *wd)))
    for w, dd in candidates:
        small = _shrunk(saver, w, dd)
        out, ok = _fit_batches(small, budget, platform)
        if ok:
            sm = out.model
            notes.append(f"model {m.n_layers} x {m.d_model} (FFN {m.ffn_dim}, {m.n_heads}/{m.n_kv_heads} heads) -> "
                         f"{sm.n_layers} x {sm.d_model} (FFN {sm.ffn_dim}, {sm.n_heads}/{sm.n_kv_heads} heads"
                         f"{f', embed rank {sm.embed_rank}' if sm.embed_rank != m.embed_rank else ''}): "
                         f"{param_count(cfg) / 1e6:.1f} M -> {param_count(out) / 1e6:.1f} M parameters")
            return out, notes + batch_notes(cfg, out), True
    # Why not: the smallest candidate's vocabulary-sized matrices (they narrow with the width) with their gradients
    # and AdamW state (16 bytes an element) alone, or the rest of a model at a quarter of its depth and width
    smallest = _shrunk(saver, 0.25, 0.25)
    if 16 * vocab_matrix_elements(smallest) > budget:
        why = ("no smaller model of this vocabulary fits either: the vocabulary-sized matrices and their optimizer "
               "state alone are too large; use a smaller tokenizer")
    else:
        why = (f"no model of this vocabulary down to a quarter of this depth and width fits either "
               f"({param_count(smallest) / 1e6:,.1f} M parameters there); set a much smaller "
               "model.n_layers or model.d_model")
    return saver, notes + [why], False


def batch_notes(before: Config, after: Config) -> list[str]:
    """Each stage whose micro-batch layout differs between the two configs, in words."""
    out = []
    for i, (a, b) in enumerate(zip(before.curriculum, after.curriculum)):
        if (a.batch_size, a.grad_accum_steps) != (b.batch_size, b.grad_accum_steps):
            out.append(f"stage {i}: batch {a.batch_size} x accum {a.grad_accum_steps} -> "
                       f"{b.batch_size} x {b.grad_accum_steps} (same {b.tokens_per_step:,} tokens per step)")
    return out
