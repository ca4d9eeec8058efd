"""Causal attention per curriculum stage: cuDNN flash attention against XLA's, forward + backward, at the
config's heads and each stage's batch; the measurement behind `model.attention=auto`'s choice.

    python scripts/attention_check.py [--config configs/yxanul_197m.yaml] [--stages 0 1 2 3 4 5] [--iters 10]

For each stage: q [B, L, H, K], k and v [B, L, G, K] (BF16, fresh random), the median of `--iters`
calls after 2 warm-ups of `value_and_grad` of sum(o * r) through `jax.nn.dot_product_attention(...,
is_causal=True, implementation=...)`, for `cudnn` and `xla`; one layer's attention, so the step
spends about `1.4 x n_layers` times it (forward + backward, and remat's second forward). The two outputs and
gradients are compared (|a - b| / |b|, BF16 operands: <= 2e-2). Needs a GPU for `cudnn`; on a CPU it
times `xla` alone. Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fused_ce_check import median_s, rel_err  # noqa: E402  (a sibling script: one timer, one error measure)

AGREE_RTOL = 2e-2


def measure(B: int, L: int, H: int, G: int, K: int, impls: list[str], iters: int) -> dict:
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.key(L), 4)
    q = jax.random.normal(k[0], (B, L, H, K), jnp.bfloat16)
    kk = jax.random.normal(k[1], (B, L, G, K), jnp.bfloat16)
    v = jax.random.normal(k[2], (B, L, G, K), jnp.bfloat16)
    r = jax.random.normal(k[3], (B, L, H, K), jnp.bfloat16)
    row = {"batch": B, "seq_len": L, "tokens": B * L}
    outs = {}
    for impl in impls:
        def f(q, kk, v, impl=impl):
            o = jax.nn.dot_product_attention(q, kk, v, is_causal=True, implementation=impl)
            return jnp.sum(o.astype(jnp.float32) * r.astype(jnp.float32))

        fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
        try:
            row[f"{impl}_ms"] = 1e3 * median_s(fn, (q, kk, v), iters)
            outs[impl] = fn(q, kk, v)
        except Exception as e:  # cuDNN refuses some shapes: recorded, not hidden
            row[f"{impl}_ms"] = None
            row[f"{impl}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if len(outs) == 2:
        (va, ga), (vb, gb) = outs["cudnn"], outs["xla"]
        row["rel_diff"] = max([rel_err(va, vb)] + [rel_err(a, b) for a, b in zip(ga, gb)])
        row["agree"] = row["rel_diff"] <= AGREE_RTOL
    if row.get("cudnn_ms") and row.get("xla_ms"):
        row["faster"] = "xla" if row["xla_ms"] < row["cudnn_ms"] else "cudnn"
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/yxanul_197m.yaml")
    p.add_argument("--stages", type=int, nargs="*", default=None, help="curriculum stages (default: all)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=None, help="cap B x L (small CPU runs)")
    args = p.parse_args(argv)
    import jax

    from yxanul_jax.core.config import load_config

    cfg = load_config(args.config)
    m = cfg.model
    device = jax.devices()[0]
    impls = ["cudnn", "xla"] if device.platform == "gpu" else ["xla"]
    stages = args.stages if args.stages is not None else range(len(cfg.curriculum))
    rows = []
    for s in stages:
        st = cfg.curriculum[s]
        B = st.batch_size
        if args.max_tokens:
            B = max(1, min(B, args.max_tokens // st.seq_len))
        row = {"stage": s, **measure(B, st.seq_len, m.n_heads, m.n_kv_heads, m.resolved_head_dim, impls, args.iters)}
        rows.append(row)
        print(f"stage {s}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "stage"), flush=True)
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print(f"{'stage':>5}{'seq':>6}{'batch':>7}{'cudnn ms':>10}{'xla ms':>9}{'faster':>8}{'rel diff':>10}")
    for r in rows:
        print(f"{r['stage']:>5}{r['seq_len']:>6}{r['batch']:>7}{fmt(r.get('cudnn_ms')):>10}{fmt(r.get('xla_ms')):>9}"
              f"{r.get('faster', '-'):>8}{'-' if 'rel_diff' not in r else format(r['rel_diff'], '.1e'):>10}")
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "device": device.device_kind,
                      "jax": jax.__version__, "config": m.name, "heads": m.n_heads, "kv_heads": m.n_kv_heads,
                      "head_dim": m.resolved_head_dim, "rows": rows}))
    return 0 if all(r.get("agree", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
