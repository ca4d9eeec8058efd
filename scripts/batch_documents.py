"""How many documents one training batch mixes, per curriculum stage, with lanes (data.lanes) and without.

    python scripts/batch_documents.py [--config F] [--data DIR] [--batches 20] [--seed 0]

Reads batch shapes from the config's curriculum (default: the demo's) and batches from a prepared
dataset (default: ../shared's Gutenberg books, SuperBPE, prepared once into the cache: whole books,
the case where the plain stream puts one book in a batch). For each stage and lane count it prints
the mean number of distinct documents in a batch and in its rows' first targets, over `--batches`
batches spread through the first epoch. Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared_datasets import gutenberg_superbpe  # noqa: E402
from yxanul_jax.core.config import load_config, stream_lanes  # noqa: E402
from yxanul_jax.data.dataset import open_dataset  # noqa: E402
from yxanul_jax.data.loader import TrainStream  # noqa: E402


def diversity(ds, seed: int, lanes: int, seq_len: int, rows: int, batches: int) -> tuple[float, float]:
    """(mean distinct documents per batch, mean distinct first-target documents per batch)."""
    fn = TrainStream(ds, seed=seed, lanes=lanes).batch_fn(seq_len, rows)
    per_epoch = fn.lanes.epoch_len // (seq_len * rows)
    ks = sorted({int(k) for k in (per_epoch * (i + 0.5) / batches for i in range(batches))})
    docs, firsts = [], []
    for k in ks:
        d_BxL = fn.documents(k)
        docs.append(len(set(d_BxL[d_BxL >= 0].tolist())))
        firsts.append(len(set(d_BxL[:, 1].tolist()) - {-1}))
    return sum(docs) / len(docs), sum(firsts) / len(firsts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML config (default: the built-in demo config)")
    parser.add_argument("--data", default=None, help="prepared dataset (default: Gutenberg, prepared once)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = load_config(args.config)
    ds = open_dataset(args.data or gutenberg_superbpe())
    auto = stream_lanes(cfg)
    print(f"dataset: {ds.path} ({ds.num_documents('train'):,} documents, {ds.num_tokens('train'):,} tokens); "
          f"config lanes: {auto}")
    print(f"{'stage':>5} {'seq_len':>7} {'rows':>6} {'lanes':>5} {'docs/batch':>10} {'row docs':>8}")
    results = []
    for i, stage in enumerate(cfg.curriculum):
        rows = stage.batch_size * stage.grad_accum_steps
        for lanes in sorted({1, auto}):
            docs, firsts = diversity(ds, args.seed, lanes, stage.seq_len, rows, args.batches)
            results.append({"stage": i, "seq_len": stage.seq_len, "rows": rows, "lanes": lanes,
                            "documents_per_batch": round(docs, 2), "row_documents": round(firsts, 2)})
            print(f"{i:>5} {stage.seq_len:>7} {rows:>6} {lanes:>5} {docs:>10.2f} {firsts:>8.2f}")
    laned = [r for r in results if r["lanes"] == auto]
    print(json.dumps({"min_documents_per_batch": min(r["documents_per_batch"] for r in laned), "lanes": auto,
                      "results": results, "data": ds.path, "config": args.config or "default",
                      "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
