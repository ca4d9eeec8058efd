"""Count-model reference losses of a prepared dataset: what a model must beat to have learned anything.

    python scripts/reference_losses.py [--data DIR] [--max-targets N]  (default: the embedded demo dataset)

Both models are fitted on the train split's packed stream (`EOS d EOS d ...`, in stored order) and scored in
nats per token on the val split's packed stream in validation's order (`loader.EVAL_ORDER_SEED`), every token a
target once:
  * unigram: token frequencies, add-one smoothed;
  * bigram: P(b | a) = lam * c(a, b) / c(a) + (1 - lam) * P_unigram(b), lam chosen on the last
    10 % of the train stream after fitting on the rest (never on val), then refitted on all of it.
`--max-targets N` scores only the first N targets of the val stream: what validation with
`eval.max_batches` B reads (N = B x eval.batch_size x seq_len; the default run: 20 x 16 x 128).
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from yxanul_jax.data.dataset import PreparedDataset, open_dataset  # noqa: E402
from yxanul_jax.data.loader import EVAL_ORDER_SEED, TokenStream  # noqa: E402

LAMBDAS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


def packed(ds: PreparedDataset, split: str) -> np.ndarray:
    """The split's whole stream, int64: the train split in stored order, the val split in the order validation
    reads it (`eval_batches`), so its first N targets are a capped validation's."""
    seed = EVAL_ORDER_SEED if split == "val" else None
    stream = TokenStream(ds.split(split), ds.eos_id, seed=seed, finite=True)
    return stream.read(0, stream.length).astype(np.int64)


class Bigram:
    """Counts of a token stream; `nll(stream, lam)` scores another stream."""

    def __init__(self, tokens: np.ndarray, vocab: int):
        self.V = vocab
        self.unigram = (np.bincount(tokens, minlength=vocab) + 1.0) / (len(tokens) + vocab)
        self.context = np.bincount(tokens[:-1], minlength=vocab).astype(np.float64)
        self.pairs, self.pair_counts = np.unique(tokens[:-1] * vocab + tokens[1:], return_counts=True)

    def unigram_nll(self, tokens: np.ndarray) -> float:
        return float(-np.log(self.unigram[tokens[1:]]).mean())

    def nll(self, tokens: np.ndarray, lam: float) -> float:
        code = tokens[:-1] * self.V + tokens[1:]
        at = np.clip(np.searchsorted(self.pairs, code), 0, len(self.pairs) - 1)
        count = np.where(self.pairs[at] == code, self.pair_counts[at], 0)
        ctx = self.context[tokens[:-1]]
        p_bigram = np.divide(count, ctx, out=np.zeros(len(code)), where=ctx > 0)
        return float(-np.log(lam * p_bigram + (1 - lam) * self.unigram[tokens[1:]]).mean())


def reference_losses(ds: PreparedDataset, max_targets: int = 0) -> dict:
    """{"unigram", "bigram" (nats per val token), "lambda", "val_tokens"}."""
    train, val = packed(ds, "train"), packed(ds, "val")
    if max_targets:
        val = val[:max_targets + 1]
    cut = int(len(train) * 0.9)
    tune = Bigram(train[:cut], ds.vocab_size)
    lam = min(LAMBDAS, key=lambda x: tune.nll(train[cut:], x))
    full = Bigram(train, ds.vocab_size)
    return {"unigram": round(full.unigram_nll(val), 4), "bigram": round(full.nll(val, lam), 4), "lambda": lam,
            "val_tokens": int(len(val) - 1), "train_tokens": int(len(train))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="prepared dataset (default: the embedded demo dataset)")
    parser.add_argument("--max-targets", type=int, default=0, help="score the first N val targets only (0: all)")
    args = parser.parse_args()
    if args.data is None:
        from yxanul_jax.core.config import ModelConfig
        from yxanul_jax.data.corpus import ensure_demo_dataset

        args.data = str(ensure_demo_dataset(vocab_size=ModelConfig().vocab_size))
    ref = reference_losses(open_dataset(args.data), args.max_targets)
    print(f"dataset: {args.data} ({ref['train_tokens']:,} train tokens, {ref['val_tokens']:,} val targets)")
    print(f"{'model':>8} {'val nats':>9} {'ppl':>9}")
    for name in ("unigram", "bigram"):
        print(f"{name:>8} {ref[name]:>9.4f} {np.exp(ref[name]):>9.1f}")
    print(json.dumps({**ref, "data": args.data, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
