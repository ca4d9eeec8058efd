"""What FP8 operands would do to the output head's logits and loss: a trained run, its own validation tokens.

    python scripts/fp8_head_error.py [--run-dir runs/tiny | --checkpoint P] [--tokens 8192] [--seq-len 128]

Issue 25 asks whether FP8 can pay in the K-wide head GEMM (logits = x . w, K = embed_rank or d_model). This
measures the accuracy side on a real model: the head operands (`Yxanul.head_operands`) of the run's validation
stream (its dataset's val split, the first one's for a mixture: the packed stream validation reads, cut into rows of
seq_len + 1) are rounded as a head GEMM's operands would be, and the logits and per-token losses compared with those
of the operands as the model holds them (x in the model's compute dtype, BF16 by default, so there the BF16 row
rounds the table alone; w as stored, float32), all multiplied exactly (float64): only operand rounding is measured.
  * bf16: both operands rounded to BF16 (what the fused kernels multiply);
  * e4m3: both cast to E4M3 with a per-tensor scale of 448 / amax (current scaling, the finest per-tensor scale the
    FP8 GEMMs use), then scaled back.
For each: the mean loss and its change, the mean |change| of a token's loss, the RMS and largest change of a logit
(beside the logits' standard deviation). `model_loss` is the model's own loss on the same targets (its head,
`Yxanul.logits`, on the same hidden states): the operands reproduce it. Only the logits GEMM is rounded; the
softmax's GEMMs (softmax @ w, dlogits^T x) carry probabilities and gradients, not the operands measured here. Rows are processed in chunks
(CHUNK), so a 200,005-word vocabulary needs ~2 GB (1.7 GB peak for 512 random rows, 2-core box, 2026-11-28). Prints
a table and one JSON line; a run or data it cannot read is one line, exit 2.
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
CHUNK = 128  # logit rows at a time: 200 MB of float64 each at a 200,005-word vocabulary


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


def head_operands(trained, tokens: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(x [N, K], w [K, V real], targets [N], the model's own mean loss on them) of the first `tokens` targets of the
    run's validation stream. UserError where that stream cannot be read or is shorter than one row."""
    import jax.numpy as jnp

    from yxanul_jax.core.errors import UserError
    from yxanul_jax.data.dataset import open_dataset
    from yxanul_jax.data.loader import TokenStream
    from yxanul_jax.data.corpus import training_dataset_path
    from yxanul_jax.model.transformer import Yxanul

    ds = open_dataset(training_dataset_path(trained.cfg.data.train, trained.cfg.model.vocab_size))
    stream = TokenStream(ds.split("val"), ds.eos_id, seed=None)
    rows = min(tokens // seq_len, (stream.length - 1) // (seq_len + 1))
    if rows < 1:
        raise UserError(f"the validation stream has {stream.length:,} tokens, fewer than one row of --seq-len "
                        f"{seq_len} + 1; pass a smaller --seq-len")
    ids = stream.read(0, rows * (seq_len + 1)).astype(np.int32).reshape(rows, seq_len + 1)
    model = Yxanul(trained.cfg.model, trained.cfg.fp8)
    inputs, targets = jnp.asarray(ids[:, :-1]), ids[:, 1:].reshape(-1)
    h = model.apply(trained.variables, inputs, method=Yxanul.hidden)
    x, w = model.apply(trained.variables, h.reshape(-1, h.shape[-1]), method=Yxanul.head_operands)
    V = trained.cfg.model.vocab_size
    at_once = max(1, CHUNK // seq_len)  # rows of the model's own head's [rows, seq_len, V] logits at a time
    own = sum(token_losses(np.asarray(model.apply(trained.variables, h[a:a + at_once], method=Yxanul.logits)[..., :V],
                                      np.float64).reshape(-1, V), ids[a:a + at_once, 1:].reshape(-1)).sum()
              for a in range(0, rows, at_once))
    return np.asarray(x, np.float32), np.asarray(w, np.float32)[:, :V], targets, float(own / len(targets))


def measure(x: np.ndarray, w: np.ndarray, targets: np.ndarray, chunk: int = 0) -> dict:
    """The module docstring's numbers, over chunks of `chunk` rows (CHUNK: a few [chunk, V] float64 arrays at a
    time)."""
    chunk = chunk or CHUNK
    forms = {form: (rounded(x, form).astype(np.float64), rounded(w, form).astype(np.float64))
             for form in ("bf16", "e4m3")}
    w64 = w.astype(np.float64)
    ref_sum = ref_sq = 0.0
    sums = {form: {"loss": 0.0, "change": 0.0, "sq": 0.0, "max": 0.0} for form in forms}
    ref_total = 0.0
    for a in range(0, len(targets), chunk):
        rows, t = slice(a, a + chunk), targets[a:a + chunk]
        ref = x[rows].astype(np.float64) @ w64
        ref_losses = token_losses(ref, t)
        ref_total += ref_losses.sum()
        ref_sum, ref_sq = ref_sum + ref.sum(), ref_sq + (ref ** 2).sum()
        for form, (xf, wf) in forms.items():
            logits = xf[rows] @ wf
            losses, err = token_losses(logits, t), logits - ref
            s = sums[form]
            s["loss"] += losses.sum()
            s["change"] += np.abs(losses - ref_losses).sum()
            s["sq"] += (err ** 2).sum()
            s["max"] = max(s["max"], float(np.abs(err).max()))
    n, cells = len(targets), len(targets) * w.shape[1]
    loss = ref_total / n
    out = {"tokens": int(n), "k": int(x.shape[1]), "vocab": int(w.shape[1]), "loss": float(loss),
           "logit_std": float(np.sqrt(ref_sq / cells - (ref_sum / cells) ** 2))}
    for form, s in sums.items():
        out[form] = {"loss": float(s["loss"] / n), "loss_change": float(s["loss"] / n - loss),
                     "token_loss_change": float(s["change"] / n), "logit_rms_error": float(np.sqrt(s["sq"] / cells)),
                     "logit_max_error": s["max"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--tokens", type=int, default=8192, help="validation targets measured")
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args(argv)
    if not 1 <= args.seq_len <= args.tokens:
        print(f"error: --seq-len {args.seq_len} must be from 1 to --tokens ({args.tokens}): the tokens come in rows "
              "of seq_len", file=sys.stderr)
        return 2
    from yxanul_jax.core.errors import UserError, one_line
    from yxanul_jax.inference.trained import load_trained

    try:
        trained = load_trained(args.run_dir or (None if args.checkpoint else "runs/tiny"), args.checkpoint)
        x, w, targets, model_loss = head_operands(trained, args.tokens, args.seq_len)
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    r = measure(x, w, targets)
    r.update({"model_loss": model_loss, "model": trained.cfg.model.name, "dtype": trained.cfg.model.dtype,
              "step": trained.step, "seed": trained.cfg.train.seed, "shuffle_seed": trained.cfg.data.shuffle_seed,
              "date": datetime.date.today().isoformat(), "machine": platform.node()})
    print(f"{trained.cfg.model.name} (train.seed {r['seed']}) at step {trained.step}: {r['tokens']:,} validation "
          f"targets, K {r['k']}, vocabulary {r['vocab']:,}; loss {r['loss']:.4f} (the model's own {model_loss:.4f}), "
          f"logits' std {r['logit_std']:.3f}")
    print(f"{'operands':<10}{'loss':>9}{'change':>10}{'|token change|':>16}{'logit rms err':>15}{'max err':>9}")
    for form in ("bf16", "e4m3"):
        f = r[form]
        print(f"{form:<10}{f['loss']:>9.4f}{f['loss_change']:>+10.5f}{f['token_loss_change']:>16.5f}"
              f"{f['logit_rms_error']:>15.5f}{f['logit_max_error']:>9.3f}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
