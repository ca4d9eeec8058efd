"""Typed configuration: frozen dataclasses hold every default; YAML and `key.sub=value` only override.

A config is built in three layers, each sparser than the last (`yxanul_jax.core.coerce` does the typed
building; this module holds the schema and its rules):

1. the dataclass defaults below (the tiny CPU model and its embedded demo corpus);
2. a YAML file (`configs/*.yaml`) naming only the fields it changes;
3. command-line overrides `model.d_model=256`, `curriculum.0.batch_size=8`.

Every key is checked against the dataclass fields (unknown keys get a close-match suggestion),
every value against the field's type, and the whole config against cross-field rules
(`validate`, which runs each section's `check` in schema order). Any failure raises `UserError` with one
line naming the key. Fields a resumed run may change carry `metadata=RESUME` (`resumable(key)`).
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from yxanul_jax.core.coerce import apply_overrides, from_dict, read_yaml, suggest, to_dict
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.names import safe_name
from yxanul_jax.core.tiles import MOSAIC_WIDTHS, parse_tiles

FP8_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "head")
FUSED_TARGETS = ("q", "k", "v", "gate", "up", "down")  # what `fp8.te_layers` runs inside TE's fused layers
FUSED_CE_MAX_K = 128
"""The fused head + loss kernels' widest head input (model/fused_ce.py): at 256 their default tiles would need
262-299 KB of shared memory on sm_90, over its 227 KB."""
FUSED_CE_WIDTHS = f"a power of 2 from 16 to {FUSED_CE_MAX_K}"
"""`fused_ce_takes` in words, for error messages: Triton's blocks are powers of 2."""


def fused_ce_takes(k: int) -> bool:
    """Whether the fused head + loss kernels take a head input of width k (`FUSED_CE_WIDTHS`)."""
    return 16 <= k <= FUSED_CE_MAX_K and k & (k - 1) == 0


MIXTURE_NAME = re.compile(r"[A-Za-z0-9_-]+")
"""A dataset name of a mixture (data.train / data.weights keys): safe in dotted keys, metric names and paths."""
TRITON_GEMM_OPTION = "xla_gpu_enable_triton_gemm"
"""The XLA option that lets Triton take GEMM fusions (default on), which FP8's `dequant` form needs off."""
MAX_SEED = 2**63 - 1
"""The largest seed (train.seed, data.shuffle_seed, generate --seed): JAX's PRNG keys take a signed 64-bit int (one
more was a traceback after the run directory was written); the data order reduces its seed itself."""
SEED_RANGE = "in [0, 2**63 - 1]"


def triton_gemm_asked(xla_options) -> bool:
    """Whether XLA options set Triton GEMMs to anything but off (unset: XLA's default, which the caller decides)."""
    return xla_options.get(TRITON_GEMM_OPTION) not in (None, False)


def each_in_range(section_obj, section: str, names: tuple[str, ...], ok, words: str) -> None:
    """UserError naming the first of `names` (fields of `section_obj`, config section `section`) whose value fails
    `ok`, with that value: "config key 'train.log_every' must be >= 1, got 0"."""
    for name in names:
        value = getattr(section_obj, name)
        if not ok(value):
            raise UserError(f"config key '{section}.{name}' must be {words}, got {value!r}")


RESUME = {"resumable": True}
"""Field metadata: a resumed run may change this field (and all below it), as it changes neither the model
nor the data stream. The rest (model, FP8, curriculum, optimizer shape, data, seed, mesh) is refused by the
run directory's guard; optim.lr is allowed (the NaN advice says to lower it) and recorded."""
WEIGHTS = {"weights": True}
"""Field metadata (model fields): trained weights mean something only in a model with this field's value (it
sets their shapes, their layout or the function they compute), so a checkpoint is read only into a model
that agrees on every such field (`model_mismatch`); the others (name, dtype, attention, remat, ...) may differ."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the decoder-only transformer."""

    name: str = "tiny"
    """Label used in logs and the run directory."""
    vocab_size: int = field(default=4096, metadata=WEIGHTS)
    """Vocabulary of the model; must equal the tokenizer's vocabulary size."""
    vocab_pad_to: int = field(default=1, metadata=WEIGHTS)
    """Round the embedding/head rows up to a multiple of this (128 for tensor-core aligned GEMMs).
    Padded rows are masked out of the softmax, never sampled, and not counted as parameters."""
    d_model: int = field(default=128, metadata=WEIGHTS)
    """Width of the residual stream."""
    n_layers: int = field(default=4, metadata=WEIGHTS)
    """Number of transformer blocks."""
    n_heads: int = field(default=4, metadata=WEIGHTS)
    """Query heads."""
    n_kv_heads: int = field(default=2, metadata=WEIGHTS)
    """Key/value heads (grouped-query attention); must divide n_heads."""
    head_dim: int = field(default=0, metadata=WEIGHTS)
    """Per-head width; 0 means d_model // n_heads."""
    ffn_dim: int = field(default=384, metadata=WEIGHTS)
    """Hidden width of the SwiGLU MLP."""
    embed_rank: int = field(default=0, metadata=WEIGHTS)
    """Rank r of the factorized input embedding (vocab x r, then r x d); 0 = a full vocab x d table.
    The tiny default uses the full table: at d_model 128 a rank-32 tied head caps the output
    distribution at rank 32 and the demo ended 1.0 nats worse after 300 steps (docs/QUALITY.md)."""
    head: Literal["tied", "factorized", "untied"] = field(default="tied", metadata=WEIGHTS)
    """Output head: `tied` reuses the embedding (both factors when factorized: d -> r -> vocab),
    `factorized` has its own d -> r projection then the shared vocab x r table, `untied` is a full
    d x vocab matrix."""
    rope_theta: float = field(default=10_000.0, metadata=WEIGHTS)
    """RoPE base frequency."""
    max_position: int = 4096
    """Longest sequence the model is trained for (and exported with): every stage's seq_len and
    eval.seq_len must fit. RoPE tables are computed for each sequence's own length."""
    norm_eps: float = field(default=1e-6, metadata=WEIGHTS)
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init; output projections (o, down) use init_std / sqrt(2 * n_layers)."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Compute dtype of activations and matmuls outside FP8 (master weights stay float32)."""
    attention: Literal["auto", "cudnn", "xla", "short"] = field(default="auto", metadata=RESUME)
    """Attention implementation (a resume may change it: the same function by another kernel). auto, on a GPU: `short`
    (`transformer.short_attention`: batched GEMMs in the tokens' layout, without XLA's transposes) up to 32 tokens
    (`transformer.SHORT_ATTENTION_MAX_SEQ`), cuDNN flash attention beyond for BF16 with head_dim <= 128 (else
    XLA's); XLA's (`jax.nn.dot_product_attention`) everywhere else. cudnn / xla / short force one (`short` keeps
    [L·H x L·G] float32 scores per row of the batch: short rows only)."""
    remat: Literal["none", "full", "attention", "dots", "auto"] = field(default="none", metadata=RESUME)
    """Rematerialization of each block (a resume may change it: memory against time, the same sums): none, full (save
    only block inputs), attention (block inputs and cuDNN attention's output and softmax statistics: its forward
    does not run again; as full where the attention is XLA's), dots (save matmul outputs without batch dims), auto
    (per stage, the fastest of `memory.AUTO_REMAT` (or, without a loop over the layers,
    `memory.AUTO_REMAT_UNROLLED`: `none` first, with each micro-batch run in 2 or 4 where whole it does not fit:
    `train.micro_split`) whose planned peak fits the device's memory: `memory.stage_choice`)."""
    scan_layers: bool = field(default=False, metadata=WEIGHTS)
    """Run the blocks with `nn.scan`: their parameters stacked [n_layers, ...]; with `scan_unroll: 1`, one
    compiled layer in a loop (much faster compiles for deep models)."""
    scan_unroll: int = field(default=1, metadata=RESUME)
    """Layers per iteration of the scanned layers' loop (`scan_layers`; the parameters stay stacked either way, so a
    resume may change it):
    1 compiles one layer and loops over them; n_layers compiles every layer, without a loop: XLA then writes
    what the backward pass keeps without stacking copies, schedules across layers, and `remat: auto` may save
    everything (`memory.AUTO_REMAT_UNROLLED`). A slower compile: about a minute a stage for yxanul-197m on 2 CPU
    cores (docs/BENCHMARKS.md, seventh session, gives the step times)."""
    fuse_projections: bool = field(default=False, metadata=WEIGHTS)
    """q, k, v as one GEMM (their kernels side by side; the same parameters): under FP8 the normed input
    is quantized once, not three times, and one state serves the three. Gate and up stay two FP8 GEMMs: fused,
    the sm_90 step was predicted slower (XLA re-reads their joint gradient for its amax; docs/BENCHMARKS.md;
    again 2026-11-26 with the dequant form and `swiglu`'s backward: 644.4 against 635.0 ms at 197m stage 9,
    the [N, 2F] gradient's concatenation splitting the one SwiGLU-backward kernel into three; in BF16 they
    may fuse: `fuse_mlp`). Changes the FP8 state's layout: a run keeps the value it started with."""
    fuse_mlp: bool = False
    """gate and up as one GEMM where neither runs in FP8 (their kernels side by side; the same parameters
    and FP8 state either way): one GEMM for their input gradient too. Under FP8 they stay two GEMMs
    (`transformer.fuse_mlp` says why)."""

    @property
    def layer_loop(self) -> bool:
        """Whether the compiled step loops over the layers (scanned and not fully unrolled: `scan_unroll`)."""
        return self.scan_layers and self.scan_unroll < self.n_layers

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def head_width(self) -> int:
        """K of the output head's GEMM (`Yxanul.head_operands`): embed_rank through the rank-r factors, else d_model."""
        return self.embed_rank if self.embed_rank and self.head != "untied" else self.d_model

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding table: vocab_size rounded up to a multiple of vocab_pad_to."""
        return -(-self.vocab_size // self.vocab_pad_to) * self.vocab_pad_to

    @property
    def vocab_padding_params(self) -> int:
        """Allocated values in padded vocabulary rows (embedding table, untied head): not parameters."""
        per_row = (self.embed_rank or self.d_model) + (self.d_model if self.head == "untied" else 0)
        return (self.padded_vocab - self.vocab_size) * per_row

    def check(self) -> None:
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_position"):
            if getattr(self, key) <= 0:
                raise UserError(f"config key 'model.{key}' must be positive, got {getattr(self, key)}")
        if self.vocab_pad_to < 1:
            raise UserError(f"config key 'model.vocab_pad_to' must be >= 1, got {self.vocab_pad_to}")
        if self.padded_vocab > 2**31 - 1:
            raise UserError(f"config key 'model.vocab_size' ({self.vocab_size:,}, padded {self.padded_vocab:,}) is "
                            "beyond int32 token ids (2,147,483,647); set it to your tokenizer's vocabulary size")
        each_in_range(self, "model", ("head_dim", "embed_rank"), lambda v: v >= 0, ">= 0")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"config key 'model.n_kv_heads' ({self.n_kv_heads}) must divide model.n_heads "
                            f"({self.n_heads})")
        if not self.head_dim and self.d_model % self.n_heads:
            raise UserError(f"config key 'model.n_heads' ({self.n_heads}) must divide model.d_model "
                            f"({self.d_model}), or set model.head_dim")
        if self.resolved_head_dim % 2:
            raise UserError(f"head dimension {self.resolved_head_dim} must be even for RoPE "
                            "(model.head_dim / model.n_heads)")
        if self.head == "factorized" and not self.embed_rank:
            raise UserError("config key 'model.head' is 'factorized' but model.embed_rank is 0; set embed_rank > 0")
        if self.scan_unroll < 1:
            raise UserError(f"config key 'model.scan_unroll' must be >= 1 (1: a loop over the layers, n_layers: "
                            f"no loop), got {self.scan_unroll}")
        if self.layer_loop and self.n_layers % self.scan_unroll:
            # jax would run the leftover layers outside the loop, where remat's CSE barrier is off (`layer_loop`)
            raise UserError(f"config key 'model.scan_unroll' ({self.scan_unroll}) must divide model.n_layers "
                            f"({self.n_layers}) or be at least it; set model.scan_unroll={self.n_layers} for no loop")
        each_in_range(self, "model", ("norm_eps", "init_std", "rope_theta"), lambda v: v > 0, "positive")
        safe_name("config key 'model.name'", self.name)  # runs/<model.name>: a name, never a path


@dataclass(frozen=True)
class FP8Config:
    """FP8 dense layers (delayed scaling, HYBRID formats)."""

    enabled: bool = True
    """Train the target projections in FP8; false (or --disable-fp8) trains the same model in BF16."""
    backend: Literal["xla", "te", "none"] = "xla"
    """`xla`: native JAX FP8 (runs everywhere; cuBLASLt FP8 GEMMs on Hopper), `te`: Transformer
    Engine JAX (GPU only), `none`: plain BF16 dense layers."""
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    """Which projections run in FP8; add `head` to put the output head in FP8 too."""
    amax_history_len: int = 1024
    """Length of the amax history of delayed scaling."""
    margin: int = 0
    """Headroom in powers of two: the amax maps to fp8_max / 2**margin."""
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    """How the scale's amax is taken from the history."""
    scaling: Literal["delayed", "current"] = "delayed"
    """`delayed`: each step quantizes with the scale from the amax history of earlier steps (TE's
    DelayedScaling; the first step of a fresh run uses `current` once to fill the history);
    `current`: the scale from each tensor's own amax in this step (TE's Float8CurrentScaling)."""
    underflow_stats: bool = False
    """Measure, per FP8 operand and step, the share of nonzero values the cast flushes to zero, and
    log the gradients' mean as `fp8_grad_underflow` (`xla` backend; costs a reduction per cast)."""
    gemm_form: Literal["auto", "f32", "direct", "dequant"] = field(default="auto", metadata=RESUME)
    """`xla` backend: how each FP8 GEMM is written for XLA (the same FP8 product; `model.fp8.GEMM_FORMS` says
    what each form compiles to). `auto`: `dequant` on a GPU (the train step then compiles with Triton GEMMs
    off; faster there, docs/BENCHMARKS.md), `f32` on a CPU (exact emulation) or where train.xla_options turns
    Triton GEMMs on."""
    wgrad: Literal["fp8", "bf16"] = field(default="fp8", metadata=RESUME)
    """`xla` backend: the weight gradient's GEMM in FP8 (E4M3 x E5M2, which needs both operands transposed for
    cuBLASLt) or in BF16 (the forward and the input gradient stay FP8)."""
    te_layers: bool = False
    """`te` backend: run each block's two norms fused with the FP8 GEMMs after them, through Transformer
    Engine's LayerNormDenseGeneral / LayerNormMLP kernels (RMSNorm + FP8 cast + the q,k,v GEMM as one;
    RMSNorm + gate/up + SwiGLU + down), on the model's own parameters (same names: checkpoints, `plan`
    and export are unchanged). Needs q, k, v, gate, up, down all in `targets`."""

    @property
    def active(self) -> bool:
        return self.enabled and self.backend != "none"

    @property
    def native(self) -> bool:
        """Whether our own XLA FP8 GEMMs run (FP8 on, `xla` backend): what `gemm_form` and `wgrad` apply to."""
        return self.active and self.backend == "xla"

    @property
    def fused(self) -> bool:
        """Whether the blocks run TE's fused norm + FP8 layers (`te_layers`, FP8 on, `te` backend)."""
        return self.active and self.backend == "te" and self.te_layers

    def check(self) -> None:
        for i, t in enumerate(self.targets):
            if t not in FP8_TARGETS:
                raise UserError(f"config key 'fp8.targets.{i}': unknown projection '{t}'{suggest(t, FP8_TARGETS)}")
        if self.amax_history_len < 1:
            raise UserError(f"config key 'fp8.amax_history_len' must be >= 1, got {self.amax_history_len}")
        if self.te_layers and self.backend != "te":
            raise UserError(f"config key 'fp8.te_layers' is Transformer Engine's fused layers, but fp8.backend is "
                            f"'{self.backend}'; set fp8.backend=te or fp8.te_layers=false")
        missing = [t for t in FUSED_TARGETS if t not in self.targets]
        if self.te_layers and missing:
            raise UserError(f"config key 'fp8.te_layers' fuses q, k, v and gate, up, down, but fp8.targets lacks "
                            f"{','.join(missing)}; add them or set fp8.te_layers=false")
        if self.margin < 0:
            raise UserError(f"config key 'fp8.margin' must be >= 0, got {self.margin}")


@dataclass(frozen=True)
class StageConfig:
    """One curriculum stage; it runs from `start_step` until the next stage starts."""

    start_step: int = 0
    """Optimizer step at which this stage begins."""
    seq_len: int = 128
    """Tokens per row."""
    batch_size: int = 16
    """Rows per micro-batch (global, across all devices)."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated into one optimizer step."""
    lr_scale: float = 1.0
    """Multiplier on the scheduled learning rate during this stage."""
    grad_clip: float = 1.0
    """Global-norm gradient clip for this stage (0 disables)."""
    warmup_steps: int = 0
    """Extra linear warmup of lr_scale at the start of this stage (0: none)."""
    description: str = ""
    """Free text shown in logs."""

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum_steps

    def split(self, k: int) -> "StageConfig":
        """The stage as a train step runs it with each micro-batch cut into k (`train.micro_split`): k times the
        micro-batches of 1/k the rows, the same rows per step (`training.batch.split_micro_batches`)."""
        if self.batch_size % k:
            raise ValueError(f"a micro-batch of {self.batch_size} rows does not split in {k}")
        return self if k == 1 else dataclasses.replace(self, batch_size=self.batch_size // k,
                                                       grad_accum_steps=self.grad_accum_steps * k)

    def check(self, i: int, max_position: int) -> None:
        """The rules of stage `i` on its own (their order is `check_curriculum`'s)."""
        for key in ("seq_len", "batch_size", "grad_accum_steps"):
            if getattr(self, key) < 1:
                raise UserError(f"config key 'curriculum.{i}.{key}' must be >= 1, got {getattr(self, key)}")
        if self.seq_len > max_position:
            raise UserError(f"config key 'curriculum.{i}.seq_len' ({self.seq_len}) exceeds model.max_position "
                            f"({max_position}); raise max_position or shorten the stage")
        for key in ("lr_scale", "grad_clip", "warmup_steps"):
            if getattr(self, key) < 0:
                raise UserError(f"config key 'curriculum.{i}.{key}' must be >= 0, got {getattr(self, key)}")


def check_curriculum(stages: tuple[StageConfig, ...], max_position: int) -> None:
    """UserError naming the key of the first rule the curriculum breaks: stages start at 0, in order."""
    if not stages:
        raise UserError("config key 'curriculum' is empty; give at least one stage")
    if stages[0].start_step != 0:
        raise UserError(f"config key 'curriculum.0.start_step' must be 0, got {stages[0].start_step}")
    prev = -1
    for i, s in enumerate(stages):
        if s.start_step <= prev:
            raise UserError(f"config key 'curriculum.{i}.start_step' ({s.start_step}) must be greater than "
                            f"the previous stage's ({prev}); stages run in order")
        prev = s.start_step
        s.check(i, max_position)


DEFAULT_LR = {"adamw": 3e-3, "muon": 0.012}
"""`optim.lr` left unset, per `optim.name`: the AdamW parameters' peak rate. AdamW alone and the AdamW group beside
Muon (the embedding table, its tied head, the norms) train best at different rates on the demo (docs/QUALITY.md)."""


def peak_rate(name: str, lr: float | None) -> float:
    """The AdamW parameters' peak rate of optimizer `name` with `optim.lr` = `lr` (None: `DEFAULT_LR[name]`)."""
    return DEFAULT_LR[name] if lr is None else lr


@dataclass(frozen=True)
class OptimConfig:
    """Muon for the hidden matrices and AdamW for the rest (or AdamW throughout), with warmup and a cosine or WSD
    decay."""

    name: Literal["adamw", "muon"] = "muon"
    """`muon` (the default since 2026-11-28, when it reached AdamW's loss in 0.53-0.66x the tokens on the demo and
    0.42-0.56x on the 8k study, every seed: docs/QUALITY.md): Newton-Schulz orthogonalized Nesterov momentum for the
    attention and FFN kernels (training/optim.py), AdamW (the keys below) for embeddings, the head and norms; or
    `adamw` for every parameter. A saved config without this key was trained with AdamW (`SAVED_WITHOUT`)."""
    lr: float | None = field(default=None, metadata=RESUME)
    """Peak learning rate of the AdamW parameters: every parameter under `adamw`; under `muon` the AdamW group (the
    embedding table, the head's factors, the norm scales). Unset (null): the optimizer's own (`DEFAULT_LR`, read as
    `peak_lr`): 0.003 under `adamw`, 0.012 under `muon`, each the better of a sweep on the demo (docs/QUALITY.md,
    2026-11-29, three seeds each: at 0.012 rather than 0.003 AdamW alone ends 0.51 higher, the AdamW group beside Muon
    0.10 lower)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    warmup_steps: int = 20
    """Linear warmup from 0 to the peak."""
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    """Decay after warmup: cosine, warmup-stable-decay, or constant."""
    decay_fraction: float = 0.2
    """WSD only: fraction of the steps spent decaying at the end."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices only (not norms)."""
    b1: float = 0.9
    """Adam beta1."""
    b2: float = 0.95
    """Adam beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    muon_lr: float = field(default=0.01, metadata=RESUME)
    """`muon` only: peak learning rate of the Muon group (same warmup, decay and stage scaling as `lr`). The
    default has the lowest mean of 0.0025/0.005/0.01 at the demo's `optim.lr` (0.012): against 0.005 on five seeds
    4.088 +- 0.036 and 4.114 +- 0.043, no effect detected by the seed spread, but lower on every seed (paired
    -0.026 +- 0.010 nats; docs/QUALITY.md, 2026-11-29). A sweep on
    seed 0 with `optim.lr` at 0.003 had put 0.005 first (0.0025: 4.279, 0.005: 4.187, 0.01: 4.198, 0.02: 4.295,
    0.04: 4.468; 2026-11-28). The yxanul configs set 0.02, the 8k study's."""
    muon_momentum: float = 0.95
    """`muon` only: Nesterov momentum of the Muon group."""
    muon_ns_dtype: Literal["float32", "bfloat16"] = field(default="bfloat16", metadata=RESUME)
    """`muon` only: the dtype the Newton-Schulz iterations run in (`training/muon.py`): the momentum is normalized in
    float32, cast to it for the iterations, and the orthogonalized update cast back (the momentum itself stays
    float32). `bfloat16`, Keller Jordan's Muon's, runs them as BF16 GEMMs (float32 products, rounded once: by the
    GEMM itself on a GPU without FSDP, `muon.products_dtype`) where `float32` (optax's, in the momentum's dtype) runs
    TF32 GEMMs on a GPU at twice the bytes: predicted 6.9 ms less a step on an H100 (yxanul-197m: 485.2 -> 478.3 ms at
    stage 9, 198.7 -> 191.8 at stage 0; docs/BENCHMARKS.md). On the demo, three seeds each, 4.082 +- 0.058 against
    float32's 4.084 +- 0.047: no effect detected (docs/QUALITY.md, 2026-11-29). A saved config without this key ran
    float32 (`SAVED_WITHOUT`)."""
    muon_weight_decay: float = 0.0
    """`muon` only: decoupled weight decay of the Muon group (times its learning rate)."""
    cautious_weight_decay: bool = False
    """Decay a weight only where its update and the weight agree in sign (cautious weight decay), in
    every group that decays."""
    continue_as: Literal["none", "decay", "wsd"] = field(default="none", metadata=RESUME)
    """Written by the trainer, not typed: how the schedule goes on after `continue_from`, the step at which
    train.steps was changed with `train.extend` (training/optim.py); `none`: as configured throughout."""
    continue_from: int = field(default=0, metadata=RESUME)
    """Written by the trainer: the step from which `continue_as` replaces the configured decay."""
    continue_lr: float = field(default=0.0, metadata=RESUME)
    """Written by the trainer: the learning rate (before stage scaling) at `continue_from`, where `decay` starts."""
    continue_peak: float = field(default=0.0, metadata=RESUME)
    """Written by the trainer: `optim.lr` (`peak_lr`) when `continue_lr` was recorded, so that a later change of `lr`
    scales the continuation as it scales the rest of the schedule (0: recorded before this key, `continue_lr` as is)."""

    @property
    def peak_lr(self) -> float:
        """`lr`, or when unset the optimizer's default (`DEFAULT_LR`): the AdamW parameters' peak rate."""
        return peak_rate(self.name, self.lr)

    def with_rate(self) -> "OptimConfig":
        """This section with `lr` written out (`peak_lr`): what a run records (config.yaml, checkpoints, W&B), so that
        a later change of `DEFAULT_LR` shows as a change of the run's rate when it resumes."""
        return dataclasses.replace(self, lr=self.peak_lr)

    def lower_rate(self) -> str:
        """The advice "a lower learning rate" in words for this optimizer: under Muon the blocks' matrices step at
        `muon_lr`, so naming `lr` alone (the embeddings', the head's and the norms') would leave most of the model's
        rate as it was."""
        if self.name == "muon":
            return f"a lower optim.muon_lr and optim.lr (now {self.muon_lr:g} and {self.peak_lr:g})"
        return f"a lower optim.lr (now {self.peak_lr:g})"

    def check(self) -> None:
        each_in_range(self, "optim", ("lr",), lambda v: v is None or v > 0, "positive, or null for the optimizer's own")
        each_in_range(self, "optim", ("muon_lr",), lambda v: v > 0, "positive")
        each_in_range(self, "optim", ("muon_momentum",), lambda v: 0 <= v < 1, "in [0, 1)")
        each_in_range(self, "optim", ("muon_weight_decay",), lambda v: v >= 0, ">= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UserError(f"config key 'optim.min_lr_ratio' must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.decay_fraction <= 1:
            raise UserError(f"config key 'optim.decay_fraction' must be in (0, 1], got {self.decay_fraction}")
        each_in_range(self, "optim", ("warmup_steps", "weight_decay"), lambda v: v >= 0, ">= 0")
        each_in_range(self, "optim", ("b1", "b2"), lambda v: 0 <= v < 1, "in [0, 1)")
        if self.eps <= 0:
            raise UserError(f"config key 'optim.eps' must be positive, got {self.eps}")
        each_in_range(self, "optim", ("continue_from", "continue_lr", "continue_peak"), lambda v: v >= 0,
                      ">= 0 (the trainer writes it; set train.extend instead)")
        if self.continue_as != "none" and self.continue_from <= 0:
            raise UserError(f"config key 'optim.continue_as' is {self.continue_as!r} with no optim.continue_from: the "
                            "trainer writes these when a run's train.steps changes; set train.extend instead")


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are streamed."""

    train: Union[str, dict[str, str]] = ""
    """Prepared dataset directory (`python -m yxanul_jax.prepare`), or a weighted mixture of several: a mapping
    name -> directory (`{books: prepared/books, code: prepared/code}`; names of letters, digits, `_` and `-`),
    every row of a batch drawn from one of them by `data.weights` (yxanul_jax/data/mixture.py); all must share
    one tokenizer. Empty: the embedded demo corpus."""
    weights: dict[str, float] = field(default_factory=dict)
    """A mixture's sampling weights by name (`{books: 0.7, code: 0.3}`; positive, normalized to sum 1), one for
    every dataset of data.train; empty: equal weights."""
    shuffle_seed: int = 0
    """Seed of the document shuffle."""
    lanes: int = 0
    """Lanes the shuffled stream is read in side by side, so one batch mixes that many places of the
    corpus (yxanul_jax/data/loader.py); must divide every stage's batch_size x grad_accum_steps. 0: the
    largest such count (their greatest common divisor)."""
    num_workers: int = field(default=0, metadata=RESUME)
    """Grain worker processes (0: read in the main process)."""
    prefetch: int = field(default=2, metadata=RESUME)
    """Batches prefetched per worker."""

    def mixture(self) -> dict[str, float] | None:
        """name -> normalized weight of a mixture (data.train a mapping), in data.train's order; None for one dataset."""
        if not isinstance(self.train, dict):
            return None
        raw = {name: self.weights.get(name, 1.0) for name in self.train}
        return {name: w / sum(raw.values()) for name, w in raw.items()}

    def check(self, stages: tuple[StageConfig, ...]) -> None:
        if isinstance(self.train, dict):
            if not self.train:
                raise UserError("config key 'data.train' is an empty mapping; name at least one prepared dataset "
                                "(data.train={books: DIR, code: DIR}) or give one directory")
            for name, path in self.train.items():
                if not MIXTURE_NAME.fullmatch(str(name)):
                    raise UserError(f"config key 'data.train': {name!r} is not a dataset name; use letters, digits, "
                                    "'_' and '-' only (no '/', '.', '..' or spaces), e.g. books")
                if not path:
                    raise UserError(f"config key 'data.train.{name}' is empty; give a prepared dataset directory")
        elif self.weights:
            raise UserError("config key 'data.weights' weighs the datasets of a mixture, but data.train is one "
                            "dataset; set data.train={a: DIR, b: DIR} or remove data.weights")
        for name, w in self.weights.items():
            if name not in self.train:
                raise UserError(f"config key 'data.weights.{name}' names no dataset of data.train"
                                + suggest(name, list(self.train), "data.weights"))
            if not (math.isfinite(w) and w > 0):
                raise UserError(f"config key 'data.weights.{name}' must be a positive number, got {w}")
        missing = [n for n in self.train if n not in self.weights] if self.weights else []
        if missing:
            raise UserError(f"config key 'data.weights' has no weight for '{missing[0]}'; set "
                            f"data.weights.{missing[0]}=W, or remove data.weights for equal weights")
        if self.lanes < 0:
            raise UserError(f"config key 'data.lanes' must be >= 0 (0: automatic), got {self.lanes}")
        each_in_range(self, "data", ("shuffle_seed",), lambda v: 0 <= v <= MAX_SEED, SEED_RANGE)
        for key in ("num_workers", "prefetch"):
            if getattr(self, key) < 0:
                raise UserError(f"config key 'data.{key}' must be >= 0, got {getattr(self, key)}")
        for i, s in enumerate(stages):
            if self.lanes and s.batch_size * s.grad_accum_steps % self.lanes:
                raise UserError(f"config key 'data.lanes' ({self.lanes}) must divide curriculum.{i}'s rows per "
                                f"step ({s.batch_size} x {s.grad_accum_steps}); set data.lanes=0 (automatic) or "
                                f"{auto_lanes(stages)}")


@dataclass(frozen=True)
class EvalConfig:
    """Multi-domain validation."""

    domains: dict[str, str] = field(default_factory=dict)
    """Domain name -> prepared validation dataset, or a raw parquet/jsonl/txt file (`FILE::{template}`), validated
    beside the training data's held-out split (eval.in_domain)."""
    in_domain: bool = True
    """Also validate on the training data's own held-out split, as domain `heldout` (a mixture: `heldout-<name>`
    per dataset); false: only eval.domains."""
    interval: int = 250
    """Validate every this many steps (0: only at the end and in --eval-only)."""
    max_batches: int = 20
    """Batches per domain per validation (0: one full pass); the documents come in one fixed shuffled order, so
    a capped pass is the same random sample of the split at every validation."""
    batch_size: int = 16
    """Rows per validation batch."""
    seq_len: int = 0
    """Validation row length; 0: the current stage's seq_len."""

    def check(self, max_position: int) -> None:
        if not self.in_domain and not self.domains:
            raise UserError("config key 'eval.in_domain' is false and eval.domains is empty: nothing to validate on; "
                            "name a domain (eval.domains.NAME=PATH) or set eval.in_domain=true")
        if self.seq_len < 0 or self.seq_len > max_position:
            raise UserError(f"config key 'eval.seq_len' ({self.seq_len}) must be in [0, model.max_position "
                            f"({max_position})]; 0 validates at each stage's seq_len")
        each_in_range(self, "eval", ("batch_size",), lambda v: v >= 1, ">= 1")
        each_in_range(self, "eval", ("max_batches",), lambda v: v >= 0, ">= 0")
        if self.interval < 0:
            raise UserError(f"config key 'eval.interval' must be >= 0 (0: only at the end), got {self.interval}")
        for name in self.domains:  # the cache's eval/<name>-<hash>: a name, never a path
            safe_name("config key 'eval.domains': domain", name, example="code")


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoint rotation."""

    interval: int = field(default=100, metadata=RESUME)
    """Save every this many steps (0: only at the end and on signals)."""
    max_to_keep: int = field(default=3, metadata=RESUME)
    """Most recent checkpoints kept (the best by validation perplexity is kept in addition)."""
    keep_best: bool = True
    """Also keep the checkpoint with the lowest validation perplexity. It also sets the validation length (the last
    stage's, so that perplexities compare), so a resume keeps it as the run began."""
    async_save: bool = field(default=True, metadata=RESUME)
    """Write checkpoints in a background thread."""

    def check(self) -> None:
        if self.max_to_keep < 1:
            raise UserError(f"config key 'checkpoint.max_to_keep' must be >= 1, got {self.max_to_keep}")
        if self.interval < 0:
            raise UserError(f"config key 'checkpoint.interval' must be >= 0 (0: only at the end), got {self.interval}")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh; -1 takes all remaining devices."""

    data: int = field(default=-1, metadata=RESUME)
    """Data-parallel axis size. It, fsdp and the process count may change on resume: the checkpoint is read
    resharded onto the new mesh, the data stream goes on with the same global batches (docs/CLUSTER.md)."""
    fsdp: int = field(default=1, metadata=RESUME)
    """Fully-sharded axis size (parameters and optimizer state are sharded over it)."""
    coordinator_address: str = field(default="", metadata=RESUME)
    """Multi-host: host:port of process 0 (else JAX_COORDINATOR_ADDRESS; empty: single process)."""
    num_processes: int = field(default=0, metadata=RESUME)
    """Multi-host: number of processes (else JAX_NUM_PROCESSES)."""
    process_id: int = field(default=-1, metadata=RESUME)
    """Multi-host: this process's index (else JAX_PROCESS_ID)."""
    cluster: Literal["auto", "none", "slurm", "ompi", "k8s"] = field(default="auto", metadata=RESUME)
    """How the processes of a multi-host run find each other (training/sharding.py, docs/CLUSTER.md). `slurm`:
    an `srun` step (SLURM_PROCID of SLURM_NTASKS; coordinator: the step's first node, port 61440 + SLURM_JOB_ID %
    4096, as JAX derives it); `ompi`: `mpirun` (OMPI_COMM_WORLD_RANK of OMPI_COMM_WORLD_SIZE, coordinator from
    OMPI_MCA_orte_hnp_uri); `k8s`: a Kubernetes Indexed Job (JOB_COMPLETION_INDEX; the coordinator address and
    process count given as below, which the pod spec sets). The three flags above (or their JAX_* variables)
    may replace the coordinator address and must agree with the cluster's count and index. `none`: only those
    flags. `auto`: the cluster whose launcher started several processes (ompi, then slurm, then an Indexed Job
    given a count or coordinator), else the flags, else a single process."""
    heartbeat_timeout_s: int = field(default=100, metadata=RESUME)
    """Multi-host: seconds without a heartbeat after which JAX's coordination service declares a process dead
    and ends every other one (JAX's default). A process that dies (SIGKILL, node loss) leaves the others
    blocked in a collective until then; they end with "another task died" and the job restarts from the
    last checkpoint."""
    init_timeout_s: int = field(default=300, metadata=RESUME)
    """Multi-host: seconds a process waits for all the others to join at the coordinator before JAX ends it
    (an unreachable coordinator, a process that never started: "DEADLINE_EXCEEDED ... RegisterTask")."""

    def check(self) -> None:
        each_in_range(self, "mesh", ("data", "fsdp"), lambda v: v >= 1 or v == -1,
                      "positive or -1 (all remaining devices)")
        if self.data == -1 and self.fsdp == -1:
            raise UserError("only one of 'mesh.data' and 'mesh.fsdp' may be -1")
        each_in_range(self, "mesh", ("heartbeat_timeout_s", "init_timeout_s"), lambda v: v >= 1, ">= 1 second")
        if self.num_processes < 0:
            raise UserError(f"config key 'mesh.num_processes' must be >= 0 (0: from the environment), got "
                            f"{self.num_processes}")
        if self.process_id < -1 or (self.num_processes and self.process_id >= self.num_processes):
            raise UserError(f"config key 'mesh.process_id' ({self.process_id}) must be -1 (from the environment) or "
                            f"in [0, mesh.num_processes)")


@dataclass(frozen=True)
class InitConfig:
    """Where a fresh run's parameters come from."""

    from_hf: str = ""
    """A Hugging Face Llama folder (config.json + model.safetensors): a fresh run starts from its
    weights, the model's sizes read from its config.json (full embedding, head tied or untied as
    saved; other model fields, such as dtype and remat, stay as configured). Empty: random init."""
    from_checkpoint: str = ""
    """A checkpoint of ours (a run's checkpoints folder: its latest step; or one step folder): a fresh run starts
    from its parameters, with a fresh optimizer at step 0 and a fresh FP8 state (the first step calibrates it), on
    its own data and schedule (another optimizer, learning rate or dataset; the same tokenizer). The model's sizes
    are the checkpoint's, as with from_hf. Read only when a run starts fresh: a resume takes the sizes from its own
    checkpoints, so the source may be gone by then. Not `--checkpoint`, which continues a whole train state: step,
    optimizer moments, data position."""

    def check(self) -> None:
        if self.from_hf and self.from_checkpoint:
            raise UserError("config keys 'init.from_hf' and 'init.from_checkpoint' both name the starting weights; "
                            "keep one")


@dataclass(frozen=True)
class ProfileConfig:
    """XLA profiling."""

    start_step: int = -1
    """First step captured by jax.profiler (-1: no trace)."""
    num_steps: int = 3
    """Steps captured."""
    dump_hlo: bool = False
    """Write each stage's optimized HLO text into the run directory."""

    def check(self) -> None:
        if self.start_step < -1:
            raise UserError(f"config key 'profile.start_step' must be -1 (no trace) or >= 0, got {self.start_step}")
        if self.num_steps < 1:
            raise UserError(f"config key 'profile.num_steps' must be >= 1, got {self.num_steps}")


@dataclass(frozen=True)
class MonitorConfig:
    """Where the metrics go besides metrics.jsonl and TensorBoard."""

    wandb: bool = False
    """Also log every scalar written to TensorBoard to Weights & Biases, from process 0 (needs the optional
    extra: pip install -e ".[wandb]"). The W&B run's id is kept in the run directory, so a resumed run
    continues the same W&B run; W&B's files go to `<run dir>/wandb/`."""
    wandb_project: str = "yxanul-jax"
    """W&B project."""
    wandb_entity: str = ""
    """W&B entity (user or team); empty: your default entity."""
    wandb_name: str = ""
    """Display name of the W&B run; empty: the run directory's name."""
    wandb_mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """`online` (needs `wandb login`), `offline` (files only: `wandb sync <run dir>/wandb/offline-run-*`
    uploads them later), `disabled` (no files), or `auto`: the WANDB_MODE environment variable, else online."""


@dataclass(frozen=True)
class TrainConfig:
    """Loop-level settings."""

    steps: int = field(default=1000, metadata=RESUME)
    """Total optimizer steps."""
    extend: Literal["refuse", "decay", "wsd"] = field(default="refuse", metadata=RESUME)
    """When a resumed run's train.steps differs from its checkpoint's and the schedule would jump at the
    first new step (a finished run asked for more steps): `refuse` (one line saying what would happen,
    nothing changed), `decay` (go on from the current learning rate down to the floor at the new end, no
    jump), or `wsd` (a warmup-stable-decay continuation: back at the peak, decaying over the last
    optim.decay_fraction of the new total). The choice is recorded as optim.continue_*."""
    seed: int = 0
    """Seed of parameter init and every other random choice."""
    log_every: int = field(default=10, metadata=RESUME)
    """Write a metrics row every this many steps."""
    loss_chunk: int = field(default=4096, metadata=RESUME)
    """Tokens per chunk of the chunked cross-entropy (the full logits never exist at once). Memory against time, the
    same sums and FP8 state (tests/test_steps.py), so a resume may change it."""
    loss_kernel: Literal["auto", "chunked", "fused"] = field(default="auto", metadata=RESUME)
    """The output head + cross-entropy: `chunked` (XLA, logits chunk by chunk), `fused` (Pallas kernels
    that never write logits: model/fused_ce.py; on a CPU they run in Pallas interpret mode, slowly), or
    `auto`: fused on a single GPU for a BF16 model whose head is not FP8 and is 16, 32, 64 or 128 wide, else
    chunked (on several devices XLA would gather the kernels' inputs onto each)."""
    fused_ce_tiles: str = field(default="default", metadata=RESUME)
    """Block sizes and launch of the fused head + loss kernels: `default` (`core.tiles.DEFAULT_TILES`: the
    forward 128 x 64 in 3 stages, the training forward (`dx`) and the table gradient 128 x 128 in 2, 8 warps each;
    on a Hopper GPU (H100, H200) at head widths 64 and 128 those two run warp-specialized in Mosaic GPU,
    model/fused_ce_ws.py, in 29 % less time on an H200, and in Triton elsewhere), or comma-separated changes, e.g.
    `fwd=256x64,dx=128x64s3` (KERNEL=BTxBV[wWARPS][sSTAGES], KERNEL fwd, dx or dw, each once; powers of 2 from 16
    to 256, at most 8 stages; a kernel given so runs in Triton). A `:mosaic` ending on dx or dw
    (`dx=128x128s2:mosaic`) asks for the Mosaic GPU kernel outright (head widths 64 or 128, a Hopper GPU; refused
    where it cannot run or build), `:mosaic-rs` for its RS form, whose GEMMs take their left operand from registers
    (not yet timed on a GPU), `:auto` for the Mosaic GPU kernel where it can run.
    `scripts/fused_ce_check.py --tiles` checks and times them on a GPU. Speed only: the loss is the same sum in
    another order."""
    z_loss: float = 0.0
    """Weight of the z-loss (log(Z)^2) regularizer."""
    micro_split: int = field(default=1, metadata=RESUME)
    """Each micro-batch run as this many smaller ones inside the step (every k-th row of it: the loader, the data
    and the sums are unchanged, the float rounding is not): must divide every stage's batch_size. `model.remat:
    auto` sets it per stage, from 1, to 2 or 4 where that lets `none` fit the device (memory.AUTO_SPLITS): a step
    without recomputation in more, smaller micro-batches is predicted faster than one that recomputes."""
    sample_prompt: str = field(default="def ", metadata=RESUME)
    """Prompt of the short sample printed when a run finishes (the demo corpus is Python source)."""
    sample_tokens: int = field(default=48, metadata=RESUME)
    """Tokens of that sample (drawn as `generate` draws by default, seeded by train.seed); 0: no sample."""
    xla_options: dict[str, Union[bool, int, float, str]] = field(default_factory=dict, metadata=RESUME)
    """XLA compiler options of the train step (e.g. `xla_gpu_enable_triton_gemm: false`), passed to
    `.compile(compiler_options=...)` and shown in the run header; empty: XLA's defaults (no GPU
    measurement has yet shown a faster setting, docs/BENCHMARKS.md)."""

    def check(self) -> None:
        if self.steps < 1:
            raise UserError(f"config key 'train.steps' must be >= 1, got {self.steps}")
        if self.sample_tokens < 0:
            raise UserError(f"config key 'train.sample_tokens' must be >= 0, got {self.sample_tokens}")
        each_in_range(self, "train", ("loss_chunk", "log_every"), lambda v: v >= 1, ">= 1")
        each_in_range(self, "train", ("z_loss",), lambda v: v >= 0, ">= 0")
        each_in_range(self, "train", ("seed",), lambda v: 0 <= v <= MAX_SEED, SEED_RANGE)
        if self.micro_split < 1:
            raise UserError(f"config key 'train.micro_split' must be >= 1, got {self.micro_split}")
        try:
            parse_tiles(self.fused_ce_tiles)
        except ValueError as e:
            raise UserError(f"config key 'train.fused_ce_tiles': {e}") from None


def auto_lanes(stages) -> int:
    """The automatic lane count (`data.lanes: 0`): the gcd of every stage's rows per step."""
    return math.gcd(*(s.batch_size * s.grad_accum_steps for s in stages))


def stream_lanes(cfg: "Config") -> int:
    """Lanes of the training stream: data.lanes, or (0) `auto_lanes`."""
    return cfg.data.lanes or auto_lanes(cfg.curriculum)


def _default_curriculum() -> tuple[StageConfig, ...]:
    # The demo shows a stage change: short rows first, then the full length (same tokens per step).
    return (StageConfig(start_step=0, seq_len=64, batch_size=32, description="short rows"),
            StageConfig(start_step=150, seq_len=128, batch_size=16, description="full rows"))


@dataclass(frozen=True)
class Config:
    """Everything a run needs; saved resolved next to every checkpoint."""

    model: ModelConfig = field(default_factory=ModelConfig)
    fp8: FP8Config = field(default_factory=FP8Config)
    curriculum: tuple[StageConfig, ...] = field(default_factory=_default_curriculum)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=RESUME)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig, metadata=RESUME)
    init: InitConfig = field(default_factory=InitConfig, metadata=RESUME)  # read at a fresh start only
    monitor: MonitorConfig = field(default_factory=MonitorConfig, metadata=RESUME)


def check_finite(obj, prefix: str = "") -> None:
    """UserError naming the first float field of a config (section, stage) that is NaN or infinite: no range
    rule below would catch NaN (every comparison with it is false)."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"config key '{key}' must be a finite number, got {value}")
        if dataclasses.is_dataclass(value):
            check_finite(value, f"{key}.")
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_finite(item, f"{key}.{i}.")


def validate(cfg: Config) -> Config:
    """Raise UserError naming the key of the first rule the config breaks (the sections' rules in schema order)."""
    check_finite(cfg)
    cfg.model.check()
    cfg.fp8.check()
    check_curriculum(cfg.curriculum, cfg.model.max_position)
    cfg.data.check(cfg.curriculum)
    cfg.eval.check(cfg.model.max_position)
    for section in (cfg.optim, cfg.train, cfg.mesh, cfg.checkpoint, cfg.profile, cfg.init):
        section.check()
    k = cfg.train.micro_split
    if (bad := next((i for i, s in enumerate(cfg.curriculum) if s.batch_size % k), None)) is not None:
        raise UserError(f"config key 'train.micro_split' ({k}) must divide every stage's batch_size, but "
                        f"curriculum.{bad}.batch_size is {cfg.curriculum[bad].batch_size}; set train.micro_split=1 "
                        "(or leave it to model.remat=auto)")
    if cfg.fp8.native and cfg.fp8.gemm_form == "dequant" and triton_gemm_asked(cfg.train.xla_options):
        raise UserError(f"fp8.gemm_form=dequant needs Triton GEMMs off, but train.xla_options.{TRITON_GEMM_OPTION} is "
                        f"{cfg.train.xla_options[TRITON_GEMM_OPTION]}: its FP8 GEMMs would run in BF16; drop that option "
                        "or set fp8.gemm_form=auto")
    head_k = cfg.model.head_width
    if cfg.train.loss_kernel == "fused":  # the kernels' limits, named before anything runs
        if cfg.fp8.active and "head" in cfg.fp8.targets:
            raise UserError("train.loss_kernel=fused runs the head in BF16, but fp8.targets has 'head'; remove "
                            "'head' from fp8.targets or set train.loss_kernel=chunked")
        if not fused_ce_takes(head_k):
            raise UserError(f"train.loss_kernel=fused takes a head width that is {FUSED_CE_WIDTHS} (this head is "
                            f"{head_k} wide); set train.loss_kernel=chunked or auto")
    fused_possible = cfg.train.loss_kernel != "chunked" and fused_ce_takes(head_k)
    if fused_possible and parse_tiles(cfg.train.fused_ce_tiles).mosaic and head_k not in MOSAIC_WIDTHS:
        raise UserError(f"train.fused_ce_tiles asks for a mosaic training kernel, which takes a head width in "
                        f"{MOSAIC_WIDTHS} (this head is {head_k} wide); drop ':mosaic' (or ':mosaic-rs') from the "
                        "tiles")
    return cfg


def resumable(key: str) -> bool:
    """Whether a resumed run may change the dotted config `key`: it, or a section above it, carries
    `metadata=RESUME`. Keys inside a list (`curriculum.0.seq_len`) and unknown keys are not resumable."""
    cls, marked = Config, False
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            break  # inside a dict value (eval.domains.web, train.xla_options.x): its field decides
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return False
        marked = marked or bool(fields[part].metadata.get("resumable"))
        cls = typing.get_type_hints(cls)[part]
    return marked


def weight_fields() -> tuple[str, ...]:
    """The ModelConfig fields that shape the weights (`WEIGHTS`): what a checkpoint's parameters fix."""
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("weights"))


def model_mismatch(saved: dict, model: ModelConfig) -> tuple[str, object, object] | None:
    """(dotted key, saved value, value of `model`) of the first `WEIGHTS` field on which a checkpoint's saved
    model config (a dict; a field it lacks counts as its default, as the code that saved it behaved) and
    `model` disagree, or None. head_dim is compared as resolved (0 means d_model // n_heads)."""
    defaults = ModelConfig()
    for name in weight_fields():
        was, now = saved.get(name, getattr(defaults, name)), getattr(model, name)
        if name == "head_dim":
            was = was or saved.get("d_model", defaults.d_model) // max(saved.get("n_heads", defaults.n_heads), 1)
            now = model.resolved_head_dim
        if was != now:
            return f"model.{name}", was, now
    return None


def fp8_mismatch(saved: dict, fp8: FP8Config) -> tuple[str, object, object] | None:
    """As `model_mismatch`, for a saved `fp8` section and `fp8`: the first field a resume may not change (they set
    the FP8 state a checkpoint holds, or how it is used) on which they disagree, or None."""
    defaults, now_dict = to_dict(FP8Config()), to_dict(fp8)
    for f in dataclasses.fields(FP8Config):
        if not resumable(f"fp8.{f.name}") and saved.get(f.name, defaults[f.name]) != now_dict[f.name]:
            return f"fp8.{f.name}", saved.get(f.name, defaults[f.name]), now_dict[f.name]
    return None


SAVED_WITHOUT = {"optim.name": "adamw", "optim.muon_ns_dtype": "float32"}
"""Keys whose default changed after saved configs could lack them: the value a saved resolved config (a run
directory's config.yaml, a checkpoint's meta) that lacks the key was trained with, where the default would now say
otherwise. `optim.muon_ns_dtype` came with its default `bfloat16` (2026-11-29); Muon ran its iterations in float32
before. `optim.name` came with Muon (2026-11-24), AdamW then the only optimizer; its default is `muon` since
2026-11-28."""


def as_saved(saved: dict) -> dict:
    """A saved resolved config dict with the `SAVED_WITHOUT` keys it lacks set to the values it was trained with (a
    section it lacks, or one that is not a mapping, is left for `from_dict` to default or refuse)."""
    out = dict(saved)
    for key, value in SAVED_WITHOUT.items():
        section, name = key.split(".")
        if isinstance(out.get(section), dict) and name not in out[section]:
            out[section] = {**out[section], name: value}
        elif section not in out:
            out[section] = {name: value}
    return out


def from_saved(saved: dict) -> Config:
    """The Config of a saved resolved config dict (`as_saved`: keys added since take their defaults, keys whose
    default changed since take what the code that saved it used). Not validated."""
    return from_dict(Config, as_saved(saved))


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None, *, run: bool = False) -> Config:
    """Defaults <- YAML file <- dotted overrides, then `validate`. `run`: the file is a run directory's resolved
    config (`read_yaml`; read with `from_saved`)."""
    if not path:
        cfg = Config()
    else:
        data = read_yaml(path, run=True) if run else read_yaml(path)
        try:
            cfg = from_saved(data) if run else from_dict(Config, data)
        except UserError as e:  # an unknown key or a wrong type in the file: which file
            raise UserError(f"{path}: {e}") from None
    cfg = apply_overrides(cfg, list(overrides or []))
    return validate(cfg)

