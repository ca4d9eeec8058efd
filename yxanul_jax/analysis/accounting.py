"""Counts derived from a config alone, one formula each: parameters, FLOPs, FP8 GEMMs, train-state bytes.

Everything that reports one of these (plan, memory, the train loop's MFU, analyze, the benchmarks)
calls the function here; the tests check each against the real model (parameter tree, abstract
train state, compiled HLO).
"""
from __future__ import annotations

import math

import jax

from yxanul_jax.core.config import Config, FP8Config, ModelConfig
from yxanul_jax.model.fp8 import fused_aligned, gemm_aligned
from yxanul_jax.model.loss import n_chunks


# --------------------------------------------------------------------------------------------
# Parameters


COMPONENTS = ("embedding", "attention", "mlp", "norms", "head")


def component_of(path: tuple[str, ...]) -> str:
    """Which component a parameter path belongs to (for the plan's breakdown)."""
    names = set(path)
    if names & {"attn"} and "attn_norm" not in names:
        return "attention"
    if "mlp" in names:
        return "mlp"
    if names & {"attn_norm", "mlp_norm", "final_norm"}:
        return "norms"
    if names & {"head_proj", "head_kernel"}:
        return "head"
    if names & {"embedding", "embed_proj"}:
        return "embedding"
    raise ValueError(f"unclassified parameter {'/'.join(path)}")


def param_breakdown(params, cfg: ModelConfig | None = None) -> dict[str, int]:
    """Parameter count per component (embedding, attention, mlp, norms, head). With `cfg`, the
    padded vocabulary rows (`model.vocab_pad_to`) are left out: they are allocated, never trained."""
    out = {k: 0 for k in COMPONENTS}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = tuple(str(getattr(p, "key", p)) for p in path)
        n = int(math.prod(leaf.shape))
        if cfg is not None and keys[-1] in ("embedding", "head_kernel"):
            n = n // cfg.padded_vocab * cfg.vocab_size
        out[component_of(keys)] += n
    return out


def layer_kernels(cfg: Config) -> dict[str, tuple[int, int]]:
    """(inputs, outputs) of each GEMM kernel of one transformer block: q, k, v, o, gate, up, down (separate
    parameters even where `model.fuse_projections` / `fuse_mlp` run them as one GEMM)."""
    m = cfg.model
    D, F, K = m.d_model, m.ffn_dim, m.resolved_head_dim
    q, kv = m.n_heads * K, m.n_kv_heads * K
    return {"q": (D, q), "k": (D, kv), "v": (D, kv), "o": (q, D), "gate": (D, F), "up": (D, F), "down": (F, D)}


def layer_params(cfg: Config) -> int:
    """Parameters of one transformer block (GEMM kernels and the two norm scales)."""
    return sum(i * o for i, o in layer_kernels(cfg).values()) + 2 * cfg.model.d_model


def muon_param_count(cfg: Config) -> int:
    """Parameters Muon trains under `optim.name: muon` (the blocks' attention and FFN kernels;
    `optim.muon_labels` picks the same ones, tested)."""
    return cfg.model.n_layers * sum(i * o for i, o in layer_kernels(cfg).values())


MUON_NS_STEPS = 5
"""Newton-Schulz iterations of Muon's orthogonalization (optax's and Keller Jordan's default; training/muon.py
runs it)."""


def newton_schulz_flops(cfg: Config) -> int:
    """FLOPs of one optimizer step's Newton-Schulz iterations under `optim.name: muon` (0 under AdamW): per
    kernel of m x n (m <= n; training/muon.py turns the taller ones) and iteration, A = X X^T (2 m^2 n), A @ A
    (2 m^3) and B X (2 m^2 n). Not model FLOPs (MFU leaves them out); `analyze` shows them beside the HLO's, which count
    them (tested)."""
    if cfg.optim.name != "muon":
        return 0
    per_layer = sum(4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3 for s in layer_kernels(cfg).values())
    return MUON_NS_STEPS * cfg.model.n_layers * per_layer


def vocab_matrix_elements(cfg: Config) -> int:
    """Elements of vocabulary-sized parameter matrices (embedding table, untied head)."""
    m = cfg.model
    n = m.padded_vocab * (m.embed_rank or m.d_model)
    if m.head == "untied":
        n += m.padded_vocab * m.d_model
    return n


def param_count(cfg: Config) -> int:
    """Parameters of the model, from its shapes (equal to `param_breakdown`; tested). Padded
    vocabulary rows are not parameters (`allocated_param_count` includes them)."""
    m = cfg.model
    V, D, R = m.vocab_size, m.d_model, m.embed_rank
    n = m.n_layers * layer_params(cfg) + D  # blocks and the final norm
    n += V * R + R * D if R else V * D
    if m.head == "factorized":
        n += D * R
    elif m.head == "untied":
        n += D * V
    return n


def allocated_param_count(cfg: Config) -> int:
    """Float32 values of the parameter tree: the parameters plus the padded vocabulary rows."""
    return param_count(cfg) + cfg.model.vocab_padding_params



# --------------------------------------------------------------------------------------------
# FLOPs


def matmul_params(m: ModelConfig) -> int:
    """Parameters that take part in a matmul for every token (what 6N counts).

    Per layer: q (d x H*K), k and v (d x KV*K each), o (H*K x d), SwiGLU gate/up/down (3 x d x ffn).
    The factorized input embedding's r -> d projection is a matmul on every token and counts;
    the row lookup (vocab x r or vocab x d) does not. The output head is d -> vocab, or
    d -> r -> vocab when it goes through the rank-r factors (tied with embed_rank > 0, factorized).
    """
    d, k = m.d_model, m.resolved_head_dim
    attn = d * m.n_heads * k + 2 * d * m.n_kv_heads * k + m.n_heads * k * d
    mlp = 3 * d * m.ffn_dim
    embed_proj = m.embed_rank * d
    if m.head == "untied" or not m.embed_rank:
        head = d * m.vocab_size
    else:
        head = d * m.embed_rank + m.embed_rank * m.vocab_size
    return m.n_layers * (attn + mlp) + embed_proj + head


def flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 * matmul_params + attention.

    Attention scores and values cost 2 matmuls of seq_len x head_dim per head and token, i.e.
    12 * n_layers * n_heads * head_dim * seq_len with the backward pass. The causal mask is counted
    as full attention, as PaLM and nanoGPT do, so MFU is comparable with theirs (flash attention
    actually skips about half of it).
    """
    m = model_cfg
    return 6.0 * matmul_params(m) + 12.0 * m.n_layers * m.n_heads * m.resolved_head_dim * seq_len


# --------------------------------------------------------------------------------------------
# FP8 GEMMs


def fp8_gemms(model: ModelConfig, fp8: FP8Config) -> list[tuple[str, int, int]]:
    """(target, I, O) of every GEMM that runs in FP8, per layer then the head: the configured targets
    whose kernel [I, O] is `gemm_aligned` (the model's own rule, see `transformer.Matmul`). One entry per
    layer GEMM (not multiplied by n_layers); the head last. With TE's fused layers (`fp8.fused`) the
    q, k, v GEMMs are one (`qkv`, their kernels side by side) and LayerNormMLP's two GEMMs are `mlp`
    ([gate | up]) and `down` (in the HLO both are `mlp`: one TE call); with `model.fuse_projections`
    q, k, v are `qkv`."""
    if not fp8.active:
        return []
    D, F, K = model.d_model, model.ffn_dim, model.resolved_head_dim
    H, G = model.n_heads * K, model.n_kv_heads * K
    head_in = model.d_model if model.head == "untied" or not model.embed_rank else model.embed_rank
    if fp8.fused and fused_aligned(model):
        shapes = [("qkv", D, H + 2 * G), ("o", H, D), ("mlp", D, 2 * F), ("down", F, D)]
        targets = {"qkv", "mlp", *fp8.targets}
    elif model.fuse_projections:  # our fused q/k/v GEMM: FP8 when all three are targets (transformer._fused_matmul)
        shapes = [("qkv", D, H + 2 * G), ("o", H, D), ("gate", D, F), ("up", D, F), ("down", F, D)]
        targets = set(fp8.targets) | ({"qkv"} if {"q", "k", "v"} <= set(fp8.targets) else set())
    else:
        shapes = [("q", D, H), ("k", D, G), ("v", D, G), ("o", H, D), ("gate", D, F), ("up", D, F), ("down", F, D)]
        targets = set(fp8.targets)
    shapes.append(("head", head_in, model.padded_vocab))
    return [(t, i, o) for t, i, o in shapes if t in targets and gemm_aligned(i, o)]


def fp8_gemm_count(cfg: Config) -> int:
    """GEMMs that run in FP8 (each keeps one state per operand: input, kernel, gradient)."""
    gemms = fp8_gemms(cfg.model, cfg.fp8)
    return cfg.model.n_layers * sum(t != "head" for t, _, _ in gemms) + sum(t == "head" for t, _, _ in gemms)


def fp8_state_floats(fp8: FP8Config) -> int:
    """float32 values of FP8 state per GEMM operand: ours keep the amax history, the scale, the non-finite
    count and the underflow share; TE's delayed scaling the history and the scale; current scaling none."""
    if not fp8.active:
        return 0
    if fp8.backend == "te":
        return 0 if fp8.scaling == "current" else fp8.amax_history_len + 1
    return fp8.amax_history_len + 3


def expected_fp8_gemms(cfg: Config, stage_index: int) -> dict[str, int]:
    """FP8 GEMMs one train step of the stage should execute (either backend, fused or not), by role.

    Per micro-batch, each FP8 layer GEMM runs forward, input gradient and weight gradient once (the weight
    gradient in BF16 with `fp8.wgrad: bf16`, `xla` backend);
    with `remat: full` (or `attention`) its forward runs again in the backward pass, except `down`, whose output
    only feeds the block's output (nothing of the block's backward needs it, so XLA drops it). The
    head runs once per loss chunk, and its chunk is rematerialized (forward again in the backward).
    """
    if cfg.model.remat == "auto":  # what it recomputes depends on the device: `memory.with_stage_remat` first
        raise ValueError("expected_fp8_gemms needs model.remat resolved for the stage (memory.with_stage_remat)")
    stage = cfg.curriculum[stage_index].split(cfg.train.micro_split)  # the micro-batches the step runs
    a = stage.grad_accum_steps
    gemm_list = fp8_gemms(cfg.model, cfg.fp8)
    layer = [t for t, _, _ in gemm_list if t != "head"]
    head = n_chunks(stage.batch_size * stage.seq_len, cfg.train.loss_chunk) if any(
        t == "head" for t, _, _ in gemm_list) else 0
    L = cfg.model.n_layers
    recomputes = cfg.model.remat in ("full", "attention")
    recompute_layer = len([t for t in layer if t != "down"]) if recomputes else 0
    bf16_wgrad = cfg.fp8.native and cfg.fp8.wgrad == "bf16"  # our weight gradients in BF16: none in FP8
    out = {"forward": a * (L * len(layer) + head), "recompute": a * (L * recompute_layer + head),
           "input_grad": a * (L * len(layer) + head), "weight_grad": 0 if bf16_wgrad else a * (L * len(layer) + head)}
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------------------------
# Train state


def state_bytes(cfg: Config) -> dict[str, int]:
    """Bytes of the train state by part (equal to `steps.abstract_train_state`; tested)."""
    P = allocated_param_count(cfg)
    optimizer = 8 * P + 8  # AdamW: mu, nu, and the Adam and schedule step counts
    if cfg.optim.name == "muon":  # the blocks' kernels keep one momentum buffer, not two; Muon's counts and
        optimizer += -4 * muon_param_count(cfg) + 4 + 12 + 4  # Newton-Schulz coefficients
    # FP8 state per operand: amax history, scale, non-finite counter, underflow share (float32).
    return {"weights": 4 * P, "optimizer": optimizer,
            "fp8_state": fp8_gemm_count(cfg) * 3 * fp8_state_floats(cfg.fp8) * 4,
            "misc_state": 4}  # the step counter (int32)
