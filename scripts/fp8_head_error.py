"""What FP8 operands would do to the output head's logits and loss: a trained run, its own validation tokens.

    python scripts/fp8_head_error.py [--run-dir runs/tiny | --checkpoint P] [--tokens 8192] [--seq-len 128]

Issue 25 asks whether FP8 can pay in the K-wide head GEMM (logits = x . w, K = embed_rank or d_model). This
measures the accuracy side on a real model: the head operands (`Yxanul.head_operands`) of the run's validation
stream (its dataset's val split, the packed stream validation reads) are rounded as a head GEMM's operands would be,
and the logits and per-token losses compared with float64 ones from the unrounded operands:
  * bf16: both operands rounded to BF16 (what the fused kernels multiply; float32 accumulation);
  * e4m3: both cast to E4M3 with a per-tensor scale of 448 / amax (current scaling, the finest per-tensor scale the
    FP8 GEMMs use), then scaled back: float32 accumulation of the FP8 products.
For each: the mean loss and its change, the mean |change| of a token's loss, the RMS and largest change of a logit
(beside the logits' standard deviation). Only the logits GEMM is rounded; the softmax's GEMMs (softmax @ w,
dlogits^T x) carry probabilities and gradients, not the operands measured here. Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

E4M3_MAX = 448.0


def token_losses(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Cross-entropy of each row of float64 logits against its target, in nats."""
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    return lse - logits[np.arange(len(targets)), targets]


def rounded(a: np.ndarray, form: str) -> np.ndarray:
    """`a` (float32) as a head GEMM's operand in `form` (bf16, e4m3), back in float32."""
    import ml_dtypes

    if form == "bf16":
        return a.astype(ml_dtypes.bfloat16).astype(np.float32)
    scale = E4M3_MAX / float(np.abs(a).max())
    return (a * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / scale


def head_operands(trained, tokens: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x [N, K], w [K, V real], targets [N]) of the first `tokens` targets of the run's validation stream."""
    import jax.numpy as jnp

    from yxanul_jax.data.dataset import open_dataset
    from yxanul_jax.data.loader import TokenStream
    from yxanul_jax.inference.trained import dataset_path_of
    from yxanul_jax.model.transformer import Yxanul

    ds = open_dataset(dataset_path_of(trained.cfg))
    stream = TokenStream(ds.split("val"), ds.eos_id, seed=None)
    rows = min(tokens // seq_len, (stream.length - 1) // (seq_len + 1))
    if rows < 1:
        raise SystemExit(f"error: the validation stream has {stream.length} tokens, fewer than --seq-len {seq_len} + 1")
    ids = stream.read(0, rows * (seq_len + 1)).astype(np.int32).reshape(rows, seq_len + 1)
    model = Yxanul(trained.cfg.model, trained.cfg.fp8)
    h = model.apply(trained.variables, jnp.asarray(ids[:, :-1]), method=Yxanul.hidden)
    x, w = model.apply(trained.variables, h.reshape(-1, h.shape[-1]), method=Yxanul.head_operands)
    return (np.asarray(x, np.float32), np.asarray(w, np.float32)[:, :trained.cfg.model.vocab_size],
            ids[:, 1:].reshape(-1))


def measure(x: np.ndarray, w: np.ndarray, targets: np.ndarray) -> dict:
    ref = x.astype(np.float64) @ w.astype(np.float64)
    ref_losses = token_losses(ref, targets)
    out = {"tokens": int(len(targets)), "k": int(x.shape[1]), "vocab": int(w.shape[1]),
           "loss": float(ref_losses.mean()), "logit_std": float(ref.std())}
    for form in ("bf16", "e4m3"):
        logits = rounded(x, form).astype(np.float64) @ rounded(w, form).astype(np.float64)
        losses = token_losses(logits, targets)
        err = logits - ref
        out[form] = {"loss": float(losses.mean()), "loss_change": float(losses.mean() - ref_losses.mean()),
                     "token_loss_change": float(np.abs(losses - ref_losses).mean()),
                     "logit_rms_error": float(np.sqrt((err ** 2).mean())), "logit_max_error": float(np.abs(err).max())}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--tokens", type=int, default=8192, help="validation targets measured")
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args(argv)
    from yxanul_jax.core.errors import UserError
    from yxanul_jax.inference.trained import load_trained

    try:
        trained = load_trained(args.run_dir or (None if args.checkpoint else "runs/tiny"), args.checkpoint)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    r = measure(*head_operands(trained, args.tokens, args.seq_len))
    r.update({"model": trained.cfg.model.name, "step": trained.step, "date": datetime.date.today().isoformat(),
              "machine": platform.node()})
    print(f"{trained.cfg.model.name} at step {trained.step}: {r['tokens']:,} validation targets, K {r['k']}, "
          f"vocabulary {r['vocab']:,}; float64 loss {r['loss']:.4f}, logits' std {r['logit_std']:.3f}")
    print(f"{'operands':<10}{'loss':>9}{'change':>10}{'|token change|':>16}{'logit rms err':>15}{'max err':>9}")
    for form in ("bf16", "e4m3"):
        f = r[form]
        print(f"{form:<10}{f['loss']:>9.4f}{f['loss_change']:>+10.5f}{f['token_loss_change']:>16.5f}"
              f"{f['logit_rms_error']:>15.5f}{f['logit_max_error']:>9.3f}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
