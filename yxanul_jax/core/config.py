"""Typed configuration: frozen dataclasses hold every default; YAML and `key.sub=value` only override.

A config is built in three layers, each sparser than the last:

1. the dataclass defaults below (the tiny CPU model and its embedded demo corpus);
2. a YAML file (`configs/*.yaml`) naming only the fields it changes;
3. command-line overrides `model.d_model=256`, `curriculum.0.batch_size=8`.

Every key is checked against the dataclass fields (unknown keys get a close-match suggestion),
every value against the field's type, and the whole config against cross-field rules
(`validate`). Any failure raises `UserError` with one line naming the key.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional, Union

import yaml

from yxanul_jax.core.errors import UserError, one_line

FP8_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "head")
FUSED_TARGETS = ("q", "k", "v", "gate", "up", "down")  # what `fp8.te_layers` runs inside TE's fused layers


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the decoder-only transformer."""

    name: str = "tiny"
    """Label used in logs and the run directory."""
    vocab_size: int = 4096
    """Vocabulary of the model; must equal the tokenizer's vocabulary size."""
    vocab_pad_to: int = 1
    """Round the embedding/head rows up to a multiple of this (128 for tensor-core aligned GEMMs).
    Padded rows are masked out of the softmax, never sampled, and not counted as parameters."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Query heads."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide n_heads."""
    head_dim: int = 0
    """Per-head width; 0 means d_model // n_heads."""
    ffn_dim: int = 384
    """Hidden width of the SwiGLU MLP."""
    embed_rank: int = 0
    """Rank r of the factorized input embedding (vocab x r, then r x d); 0 = a full vocab x d table.
    The tiny default uses the full table: at d_model 128 a rank-32 tied head caps the output
    distribution at rank 32 and the demo ended 1.0 nats worse after 300 steps (docs/QUALITY.md)."""
    head: Literal["tied", "factorized", "untied"] = "tied"
    """Output head: `tied` reuses the embedding (both factors when factorized: d -> r -> vocab),
    `factorized` has its own d -> r projection then the shared vocab x r table, `untied` is a full
    d x vocab matrix."""
    rope_theta: float = 10_000.0
    """RoPE base frequency."""
    max_position: int = 4096
    """Longest sequence the model is trained for (and exported with): every stage's seq_len and
    eval.seq_len must fit. RoPE tables are computed for each sequence's own length."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init; output projections (o, down) use init_std / sqrt(2 * n_layers)."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Compute dtype of activations and matmuls outside FP8 (master weights stay float32)."""
    attention: Literal["auto", "cudnn", "xla"] = "auto"
    """`jax.nn.dot_product_attention` implementation: auto picks cuDNN flash attention on GPU for
    BF16 with head_dim <= 128 and XLA elsewhere; cudnn / xla force one."""
    remat: Literal["none", "full", "dots"] = "none"
    """Rematerialization of each block: none, full (save only block inputs), dots (save matmul
    outputs without batch dims)."""
    scan_layers: bool = False
    """Run the blocks with `nn.scan` (one compiled layer; much faster compiles for deep models)."""

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding table: vocab_size rounded up to a multiple of vocab_pad_to."""
        return -(-self.vocab_size // self.vocab_pad_to) * self.vocab_pad_to

    @property
    def vocab_padding_params(self) -> int:
        """Allocated values in padded vocabulary rows (embedding table, untied head): not parameters."""
        per_row = (self.embed_rank or self.d_model) + (self.d_model if self.head == "untied" else 0)
        return (self.padded_vocab - self.vocab_size) * per_row


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
    te_layers: bool = False
    """`te` backend: run each block's two norms fused with the FP8 GEMMs after them, through Transformer
    Engine's LayerNormDenseGeneral / LayerNormMLP kernels (RMSNorm + FP8 cast + the q,k,v GEMM as one;
    RMSNorm + gate/up + SwiGLU + down), on the model's own parameters (same names: checkpoints, `plan`
    and export are unchanged). Needs q, k, v, gate, up, down all in `targets`."""

    @property
    def active(self) -> bool:
        return self.enabled and self.backend != "none"

    @property
    def fused(self) -> bool:
        """Whether the blocks run TE's fused norm + FP8 layers (`te_layers`, FP8 on, `te` backend)."""
        return self.active and self.backend == "te" and self.te_layers


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


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with warmup and a cosine or WSD decay."""

    lr: float = 3e-3
    """Peak learning rate."""
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


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are streamed."""

    train: str = ""
    """Prepared dataset directory (`python -m yxanul_jax.prepare`); empty: the embedded demo corpus."""
    shuffle_seed: int = 0
    """Seed of the document shuffle."""
    lanes: int = 0
    """Lanes the shuffled stream is read in side by side, so one batch mixes that many places of the
    corpus (yxanul_jax/data/loader.py); must divide every stage's batch_size x grad_accum_steps. 0: the
    largest such count (their greatest common divisor)."""
    num_workers: int = 0
    """Grain worker processes (0: read in the main process)."""
    prefetch: int = 2
    """Batches prefetched per worker."""


@dataclass(frozen=True)
class EvalConfig:
    """Multi-domain validation."""

    domains: dict[str, str] = field(default_factory=dict)
    """Domain name -> prepared validation dataset; empty: the training data's held-out split."""
    interval: int = 250
    """Validate every this many steps (0: only at the end and in --eval-only)."""
    max_batches: int = 20
    """Batches per domain per validation (0: one full pass)."""
    batch_size: int = 16
    """Rows per validation batch."""
    seq_len: int = 0
    """Validation row length; 0: the current stage's seq_len."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoint rotation."""

    interval: int = 100
    """Save every this many steps (0: only at the end and on signals)."""
    max_to_keep: int = 3
    """Most recent checkpoints kept (the best by validation perplexity is kept in addition)."""
    keep_best: bool = True
    """Also keep the checkpoint with the lowest validation perplexity."""
    async_save: bool = True
    """Write checkpoints in a background thread."""


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh; -1 takes all remaining devices."""

    data: int = -1
    """Data-parallel axis size."""
    fsdp: int = 1
    """Fully-sharded axis size (parameters and optimizer state are sharded over it)."""
    coordinator_address: str = ""
    """Multi-host: host:port of process 0 (else JAX_COORDINATOR_ADDRESS; empty: single process)."""
    num_processes: int = 0
    """Multi-host: number of processes (else JAX_NUM_PROCESSES)."""
    process_id: int = -1
    """Multi-host: this process's index (else JAX_PROCESS_ID)."""


@dataclass(frozen=True)
class InitConfig:
    """Where a fresh run's parameters come from."""

    from_hf: str = ""
    """A Hugging Face Llama folder (config.json + model.safetensors): a fresh run starts from its
    weights, the model's sizes read from its config.json (full embedding, head tied or untied as
    saved; other model fields, such as dtype and remat, stay as configured). Empty: random init."""


@dataclass(frozen=True)
class ProfileConfig:
    """XLA profiling."""

    start_step: int = -1
    """First step captured by jax.profiler (-1: no trace)."""
    num_steps: int = 3
    """Steps captured."""
    dump_hlo: bool = False
    """Write each stage's optimized HLO text into the run directory."""


@dataclass(frozen=True)
class TrainConfig:
    """Loop-level settings."""

    steps: int = 1000
    """Total optimizer steps."""
    seed: int = 0
    """Seed of parameter init and every other random choice."""
    log_every: int = 10
    """Write a metrics row every this many steps."""
    loss_chunk: int = 4096
    """Tokens per chunk of the chunked cross-entropy (the full logits never exist at once)."""
    z_loss: float = 0.0
    """Weight of the z-loss (log(Z)^2) regularizer."""
    sample_prompt: str = "def "
    """Prompt of the short sample printed when a run finishes (the demo corpus is Python source)."""
    sample_tokens: int = 48
    """Tokens of that sample (temperature 0.8, top-k 40, seeded by train.seed); 0: no sample."""
    xla_options: dict[str, Union[bool, int, float, str]] = field(default_factory=dict)
    """XLA compiler options of the train step (e.g. `xla_gpu_enable_triton_gemm: false`), passed to
    `.compile(compiler_options=...)` and shown in the run header; empty: XLA's defaults (no GPU
    measurement has yet shown a faster setting, docs/BENCHMARKS.md)."""


def stream_lanes(cfg: "Config") -> int:
    """Lanes of the training stream: data.lanes, or (0) the gcd of every stage's rows per step."""
    return cfg.data.lanes or math.gcd(*(s.batch_size * s.grad_accum_steps for s in cfg.curriculum))


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
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    init: InitConfig = field(default_factory=InitConfig)


# --------------------------------------------------------------------------------------------
# Building from dicts, with type checks


def _suggest(key: str, choices, prefix: str = "") -> str:
    """A close match spelled as a full dotted key, else the list of valid keys."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{_join(prefix, close[0])}'?)"
    return f" (valid: {', '.join(sorted(choices))})"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str) -> Any:
    """Check `value` against the annotation `tp`; convert lossless cases (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UserError(f"config key '{key}' must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, key)
    if origin is Literal:
        if value not in args:
            raise UserError(f"config key '{key}' must be one of {_type_name(tp)}, got {value!r}"
                            + (_suggest(str(value), [str(a) for a in args]) if isinstance(value, str) else ""))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for i, option in enumerate(inner):  # the first type that takes the value, in the order written
            try:
                return _coerce(value, option, key)
            except UserError:
                if i == len(inner) - 1:
                    raise
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key '{key}' must be a list, got {value!r}")
        elem = args[0]
        return tuple(_coerce(v, elem, _join(key, i)) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"config key '{key}' must be a mapping, got {value!r}")
        kt, vt = args
        return {_coerce(k, kt, key): _coerce(v, vt, _join(key, k)) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise UserError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"config key '{key}' must be a string, got {value!r}")
        return str(value)
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")  # a bug, not a user error


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass `cls` from a (sparse) dict; unknown keys and bad types raise UserError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"config section '{prefix or '<root>'}' must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise UserError(f"unknown config key '{_join(prefix, key)}'{_suggest(str(key), names, prefix)}")
        kwargs[key] = _coerce(value, hints[key], _join(prefix, key))
    return cls(**kwargs)


def to_dict(obj) -> Any:
    """Plain dict/list form of a config (YAML- and JSON-safe)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# --------------------------------------------------------------------------------------------
# Dotted overrides


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _set_path(obj, path: list[str], raw: Any, done: str):
    """Return a copy of `obj` with `path` set to `raw` (type-checked against the field)."""
    key = path[0]
    here = _join(done, key)
    if isinstance(obj, tuple):
        if not key.lstrip("-").isdigit():
            raise UserError(f"config key '{here}': '{done}' is a list, index it with a number")
        i = int(key)
        if not -len(obj) <= i < len(obj):
            raise UserError(f"config key '{here}': index {i} out of range, '{done}' has {len(obj)} entries")
        items = list(obj)
        if len(path) == 1:
            raise UserError(f"config key '{here}': set a field of the entry, e.g. '{here}.seq_len=...'")
        items[i] = _set_path(items[i], path[1:], raw, here)
        return tuple(items)
    if isinstance(obj, dict):
        if len(path) != 1:
            raise UserError(f"config key '{here}' is nested too deep")
        return {**obj, key: raw}
    if not dataclasses.is_dataclass(obj):
        raise UserError(f"config key '{done}' has no sub-keys")
    names = {f.name for f in dataclasses.fields(obj)}
    if key not in names:
        raise UserError(f"unknown config key '{here}'{_suggest(key, names, done)}")
    tp = _hints(type(obj))[key]
    if len(path) == 1:
        value = _coerce(raw, tp, here)
    else:
        current = getattr(obj, key)
        value = _set_path(current, path[1:], raw, here)
        if isinstance(current, dict):
            value = _coerce(value, tp, here)
    return dataclasses.replace(obj, **{key: value})


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `key.sub=value` strings in order (values parsed as YAML scalars/lists)."""
    for item in overrides:
        if "=" not in item:
            if item.endswith((".yaml", ".yml")):
                raise UserError(f"'{item}' looks like a config file; did you mean --config {item}?")
            raise UserError(f"override '{item}' is not of the form key.sub=value")
        key, _, text = item.partition("=")
        key = key.strip()
        if not key:
            raise UserError(f"override '{item}' names no key")
        cfg = _set_path(cfg, key.split("."), _parse_value(text), "")
    return cfg


# --------------------------------------------------------------------------------------------
# Cross-field checks


def validate(cfg: Config) -> Config:
    """Raise UserError naming the key of the first rule the config breaks."""
    m, f = cfg.model, cfg.fp8
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_position"):
        if getattr(m, key) <= 0:
            raise UserError(f"config key 'model.{key}' must be positive, got {getattr(m, key)}")
    if m.vocab_pad_to < 1:
        raise UserError(f"config key 'model.vocab_pad_to' must be >= 1, got {m.vocab_pad_to}")
    if m.head_dim < 0 or m.embed_rank < 0:
        raise UserError("config keys 'model.head_dim' and 'model.embed_rank' must be >= 0")
    if m.n_heads % m.n_kv_heads:
        raise UserError(f"config key 'model.n_kv_heads' ({m.n_kv_heads}) must divide model.n_heads ({m.n_heads})")
    if not m.head_dim and m.d_model % m.n_heads:
        raise UserError(f"config key 'model.n_heads' ({m.n_heads}) must divide model.d_model ({m.d_model}), "
                        "or set model.head_dim")
    if m.resolved_head_dim % 2:
        raise UserError(f"head dimension {m.resolved_head_dim} must be even for RoPE (model.head_dim / model.n_heads)")
    if m.head == "factorized" and not m.embed_rank:
        raise UserError("config key 'model.head' is 'factorized' but model.embed_rank is 0; set embed_rank > 0")
    if m.norm_eps <= 0 or m.init_std <= 0 or m.rope_theta <= 0:
        raise UserError("config keys 'model.norm_eps', 'model.init_std', 'model.rope_theta' must be positive")
    for i, t in enumerate(f.targets):
        if t not in FP8_TARGETS:
            raise UserError(f"config key 'fp8.targets.{i}': unknown projection '{t}'{_suggest(t, FP8_TARGETS)}")
    if f.amax_history_len < 1:
        raise UserError(f"config key 'fp8.amax_history_len' must be >= 1, got {f.amax_history_len}")
    if f.te_layers and f.backend != "te":
        raise UserError(f"config key 'fp8.te_layers' is Transformer Engine's fused layers, but fp8.backend is "
                        f"'{f.backend}'; set fp8.backend=te or fp8.te_layers=false")
    missing = [t for t in FUSED_TARGETS if t not in f.targets]
    if f.te_layers and missing:
        raise UserError(f"config key 'fp8.te_layers' fuses q, k, v and gate, up, down, but fp8.targets lacks "
                        f"{','.join(missing)}; add them or set fp8.te_layers=false")
    if f.margin < 0:
        raise UserError(f"config key 'fp8.margin' must be >= 0, got {f.margin}")
    if not cfg.curriculum:
        raise UserError("config key 'curriculum' is empty; give at least one stage")
    if cfg.curriculum[0].start_step != 0:
        raise UserError(f"config key 'curriculum.0.start_step' must be 0, got {cfg.curriculum[0].start_step}")
    prev = -1
    for i, s in enumerate(cfg.curriculum):
        if s.start_step <= prev:
            raise UserError(f"config key 'curriculum.{i}.start_step' ({s.start_step}) must be greater than "
                            f"the previous stage's ({prev}); stages run in order")
        prev = s.start_step
        for key in ("seq_len", "batch_size", "grad_accum_steps"):
            if getattr(s, key) < 1:
                raise UserError(f"config key 'curriculum.{i}.{key}' must be >= 1, got {getattr(s, key)}")
        if s.seq_len > m.max_position:
            raise UserError(f"config key 'curriculum.{i}.seq_len' ({s.seq_len}) exceeds model.max_position "
                            f"({m.max_position}); raise max_position or shorten the stage")
        if s.lr_scale < 0 or s.grad_clip < 0 or s.warmup_steps < 0:
            raise UserError(f"config keys 'curriculum.{i}.lr_scale/grad_clip/warmup_steps' must be >= 0")
    if cfg.data.lanes < 0:
        raise UserError(f"config key 'data.lanes' must be >= 0 (0: automatic), got {cfg.data.lanes}")
    for i, s in enumerate(cfg.curriculum):
        if cfg.data.lanes and s.batch_size * s.grad_accum_steps % cfg.data.lanes:
            raise UserError(f"config key 'data.lanes' ({cfg.data.lanes}) must divide curriculum.{i}'s rows per "
                            f"step ({s.batch_size} x {s.grad_accum_steps}); set data.lanes=0 (automatic) or "
                            f"{stream_lanes(replace(cfg, data=replace(cfg.data, lanes=0)))}")
    if cfg.eval.seq_len < 0 or cfg.eval.seq_len > m.max_position:
        raise UserError(f"config key 'eval.seq_len' ({cfg.eval.seq_len}) must be in [0, model.max_position "
                        f"({m.max_position})]; 0 validates at each stage's seq_len")
    o = cfg.optim
    if o.lr <= 0:
        raise UserError(f"config key 'optim.lr' must be positive, got {o.lr}")
    if not 0 <= o.min_lr_ratio <= 1:
        raise UserError(f"config key 'optim.min_lr_ratio' must be in [0, 1], got {o.min_lr_ratio}")
    if not 0 < o.decay_fraction <= 1:
        raise UserError(f"config key 'optim.decay_fraction' must be in (0, 1], got {o.decay_fraction}")
    if o.warmup_steps < 0 or o.weight_decay < 0:
        raise UserError("config keys 'optim.warmup_steps' and 'optim.weight_decay' must be >= 0")
    if not (0 <= o.b1 < 1 and 0 <= o.b2 < 1):
        raise UserError("config keys 'optim.b1' and 'optim.b2' must be in [0, 1)")
    t = cfg.train
    if t.steps < 1:
        raise UserError(f"config key 'train.steps' must be >= 1, got {t.steps}")
    if t.sample_tokens < 0:
        raise UserError(f"config key 'train.sample_tokens' must be >= 0, got {t.sample_tokens}")
    if t.loss_chunk < 1 or t.log_every < 1:
        raise UserError("config keys 'train.loss_chunk' and 'train.log_every' must be >= 1")
    if cfg.mesh.data == 0 or cfg.mesh.fsdp == 0 or cfg.mesh.data < -1 or cfg.mesh.fsdp < -1:
        raise UserError("config keys 'mesh.data' and 'mesh.fsdp' must be positive or -1 (all remaining devices)")
    if cfg.mesh.data == -1 and cfg.mesh.fsdp == -1:
        raise UserError("only one of 'mesh.data' and 'mesh.fsdp' may be -1")
    if cfg.checkpoint.max_to_keep < 1:
        raise UserError(f"config key 'checkpoint.max_to_keep' must be >= 1, got {cfg.checkpoint.max_to_keep}")
    return cfg


# --------------------------------------------------------------------------------------------
# Loading


def read_yaml(path: str) -> dict:
    if not os.path.exists(path):
        raise UserError(f"config file '{path}' does not exist; pass an existing YAML file (see configs/)")
    if os.path.isdir(path):
        raise UserError(f"config file '{path}' is a directory; pass a YAML file in it (see configs/)")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"config file '{path}' is not valid YAML: {one_line(e)}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections (model:, fp8:, ...)")
    return data


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> Config:
    """Defaults <- YAML file <- dotted overrides, then `validate`."""
    cfg = from_dict(Config, read_yaml(path)) if path else Config()
    cfg = apply_overrides(cfg, list(overrides or []))
    return validate(cfg)


def keys_named(name: str, cls=None, prefix: str = "") -> list[str]:
    """The dotted config keys whose last part is `name` ("steps" -> ["train.steps"]), for hints."""
    found = []
    for f in dataclasses.fields(cls or Config):
        key = _join(prefix, f.name)
        tp = _hints(cls or Config)[f.name]
        if dataclasses.is_dataclass(tp):
            found += keys_named(name, tp, key)
        elif f.name == name:
            found.append(key)
    return found


def add_config_args(parser) -> None:
    """The `--config FILE` and trailing `key=value` arguments every command shares."""
    parser.add_argument("--config", default=None, help="YAML file overriding the defaults (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted config overrides")


def config_from_args(args) -> Config:
    return load_config(args.config, args.overrides)
