"""A PyTorch reference of the yxanul model, for numerics (same weights, same logits) and for speed.

    python scripts/torch_reference.py [--config F] [--stage N] [--steps 20] [--warmup 5] [--no-compile]

The same architecture, written the way a strong PyTorch user would: RMSNorm, RoPE in the GPT-NeoX /
Llama layout (channel pairs i, i + K/2), grouped-query attention through `scaled_dot_product_attention`
(flash on a GPU, `enable_gqa`), SwiGLU, no biases, the factorized embedding (vocab x r, r x d) with
the head tied through both factors (or a factorized / untied head as configured), and a
cross-entropy computed in chunks of rows under activation checkpointing, so the full
[tokens, vocab] logits never exist (our `train.loss_chunk`). Training: bf16 autocast, fused AdamW,
`torch.compile` of the transformer trunk (as nanoGPT compiles its model; the chunked loss and the
optimizer run eagerly: compiling the whole step unrolled 128 checkpointed loss chunks at stage 9 and
ran past 240 s on an H200, 2026-11-26).

`from_params(model_cfg, params)` builds it from yxanul-jax parameters (a checkpoint's or a fresh
init); tests/test_torch_reference.py checks its logits and loss against ours. Run as a script it
times the train step at a curriculum stage's shape on synthetic tokens (CUDA when present) and
prints a table and one JSON line; scripts/gpu_bench.py calls `time_train_step` for its PyTorch row.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yxanul_jax.core.config import ModelConfig, load_config  # noqa: E402
from yxanul_jax.model.hf import NORMS, PROJECTIONS, to_hf  # noqa: E402  (one layout of the per-layer tensors)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.arange(seq_len, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return angles.sin(), angles.cos()  # [L, K/2]


def apply_rope(x_BxHxLxK, sin, cos):
    x = x_BxHxLxK.float()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x_BxHxLxK.dtype)


class Block(nn.Module):
    def __init__(self, m: ModelConfig):
        super().__init__()
        D, H, G, K = m.d_model, m.n_heads, m.n_kv_heads, m.resolved_head_dim
        self.H, self.G, self.K = H, G, K
        self.attn_norm, self.mlp_norm = RMSNorm(D, m.norm_eps), RMSNorm(D, m.norm_eps)
        self.q, self.k, self.v = nn.Linear(D, H * K, bias=False), nn.Linear(D, G * K, bias=False), nn.Linear(D, G * K, bias=False)
        self.o = nn.Linear(H * K, D, bias=False)
        self.gate, self.up = nn.Linear(D, m.ffn_dim, bias=False), nn.Linear(D, m.ffn_dim, bias=False)
        self.down = nn.Linear(m.ffn_dim, D, bias=False)

    def forward(self, x_BxLxD, sin, cos):
        B, L, _ = x_BxLxD.shape
        h = self.attn_norm(x_BxLxD)
        q = apply_rope(self.q(h).view(B, L, self.H, self.K).transpose(1, 2), sin, cos)
        k = apply_rope(self.k(h).view(B, L, self.G, self.K).transpose(1, 2), sin, cos)
        v = self.v(h).view(B, L, self.G, self.K).transpose(1, 2)
        # query head j reads kv head j // (H / G), as jax.nn.dot_product_attention and Llama do
        o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True, enable_gqa=self.G != self.H)
        x_BxLxD = x_BxLxD + self.o(o.transpose(1, 2).reshape(B, L, self.H * self.K))
        h = self.mlp_norm(x_BxLxD)
        return x_BxLxD + self.down(F.silu(self.gate(h)) * self.up(h))


class TorchYxanul(nn.Module):
    def __init__(self, m: ModelConfig):
        super().__init__()
        self.m = m
        V, D, R = m.vocab_size, m.d_model, m.embed_rank
        self.embedding = nn.Parameter(torch.empty(V, R or D).normal_(std=m.init_std))
        self.embed_proj = nn.Parameter(torch.empty(R, D).normal_(std=R ** -0.5)) if R else None
        self.head_proj = nn.Parameter(torch.empty(D, R).normal_(std=m.init_std)) if m.head == "factorized" else None
        self.head_kernel = nn.Parameter(torch.empty(D, V).normal_(std=m.init_std)) if m.head == "untied" else None
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.n_layers))
        self.final_norm = RMSNorm(D, m.norm_eps)

    def hidden(self, tokens_BxL):
        x = self.embedding[tokens_BxL]
        if self.embed_proj is not None:
            x = x @ self.embed_proj
        sin, cos = rope_tables(tokens_BxL.shape[1], self.m.resolved_head_dim, self.m.rope_theta, tokens_BxL.device)
        for block in self.blocks:
            x = block(x, sin, cos)
        return self.final_norm(x)

    def logits(self, h_NxD):
        if self.head_kernel is not None:
            out = h_NxD @ self.head_kernel
        elif self.embed_proj is not None:
            proj_DxR = self.head_proj if self.head_proj is not None else self.embed_proj.T
            out = (h_NxD @ proj_DxR) @ self.embedding.T
        else:
            out = h_NxD @ self.embedding.T
        return out.float()

    def forward(self, tokens_BxL):
        return self.logits(self.hidden(tokens_BxL))

    def loss(self, inputs_BxL, targets_BxL, chunk: int = 4096):
        """Mean next-token cross-entropy, logits computed `chunk` rows at a time and recomputed in the
        backward pass (checkpointing), so no more than one chunk of logits is ever held."""
        h_NxD = self.hidden(inputs_BxL).reshape(-1, self.m.d_model)
        t_N = targets_BxL.reshape(-1)

        def chunk_nll(h, t):
            return F.cross_entropy(self.logits(h), t, reduction="sum")

        total = sum(checkpoint(chunk_nll, h_NxD[i:i + chunk], t_N[i:i + chunk], use_reentrant=False)
                    for i in range(0, h_NxD.shape[0], chunk))
        return total / t_N.numel()


def from_params(m: ModelConfig, params) -> TorchYxanul:
    """A float32 TorchYxanul holding yxanul-jax parameters (padded vocabulary rows dropped)."""
    model = TorchYxanul(m)
    _, tensors = to_hf(m, params)
    V = m.vocab_size
    f32 = lambda a: torch.tensor(np.asarray(a, np.float32))  # noqa: E731  (a copy: jax arrays are read-only)
    with torch.no_grad():
        model.embedding.copy_(f32(params["embedding"])[:V])
        if m.embed_rank:
            model.embed_proj.copy_(f32(params["embed_proj"]))
        if m.head == "factorized":
            model.head_proj.copy_(f32(params["head_proj"]))
        if m.head == "untied":
            model.head_kernel.copy_(f32(params["head_kernel"])[:, :V])
        model.final_norm.weight.copy_(f32(tensors["model.norm.weight"]))
        for i, block in enumerate(model.blocks):
            for (_, ours), theirs in PROJECTIONS.items():
                getattr(block, ours).weight.copy_(f32(tensors[f"model.layers.{i}.{theirs}.weight"]))
            for ours, theirs in NORMS.items():
                getattr(block, ours).weight.copy_(f32(tensors[f"model.layers.{i}.{theirs}.weight"]))
    return model


def time_train_step(m: ModelConfig, seq_len: int, batch_size: int, *, lr: float = 3e-4, steps: int = 20,
                    warmup: int = 5, loss_chunk: int = 4096, compile: bool = True, device: str | None = None) -> dict:
    """Median time of a full train step (forward, backward, clip, fused AdamW) on synthetic tokens."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = TorchYxanul(m).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)

    def step(inputs, targets):
        with autocast:
            loss = model.loss(inputs, targets, loss_chunk)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if compile:  # the trunk, compiled once per shape; the loss chunks and AdamW stay eager
        model.hidden = torch.compile(model.hidden)
    run = step
    tokens = torch.randint(0, m.vocab_size, (batch_size, seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = run(inputs, targets)
    sync()
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        run(inputs, targets)
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = run(inputs, targets)
        sync()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    return {"engine": "pytorch", "device": device, "compile": compile, "first_step_s": round(first, 3),
            "step_s": step_s, "tokens_per_sec": seq_len * batch_size / step_s, "loss": float(loss.detach()),
            "peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
            "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    stage = cfg.curriculum[args.stage]
    rows = stage.batch_size * stage.grad_accum_steps
    r = time_train_step(cfg.model, stage.seq_len, rows, lr=cfg.optim.peak_lr, steps=args.steps, warmup=args.warmup,
                        loss_chunk=cfg.train.loss_chunk, compile=not args.no_compile)
    print(f"{'model':>12} {'stage':>5} {'seq':>5} {'rows':>5} {'step ms':>9} {'tokens/s':>12} {'device':>6}")
    print(f"{cfg.model.name:>12} {args.stage:>5} {stage.seq_len:>5} {rows:>5} {1e3 * r['step_s']:>9.1f} "
          f"{r['tokens_per_sec']:>12,.0f} {r['device']:>6}")
    print(json.dumps({**r, "model": cfg.model.name, "stage": args.stage, "seq_len": stage.seq_len, "rows": rows,
                      "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
