"""Benchmark: training-stream throughput (tokens/s out of `TrainStream.next_batch`) on Gutenberg shards.

    python scripts/bench_data.py [--data DIR] [--seconds 5] [--workers 0 2]

Without --data, prepares ../shared/data/train/gutenberg-*.parquet with the SuperBPE tokenizer once
into `$YXANUL_CACHE/bench-gutenberg-superbpe` (default ~/.cache/yxanul_jax/...). Each configuration
(seq_len 128 and 2048 at about 32k tokens per batch, in-process and with worker processes) runs
`--seconds` after a warm-up batch. Prints a table, then one JSON line whose `tokens_per_sec` is the
seq_len 2048 rate of the default configuration (num_workers=0, as in DataConfig).
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
from yxanul_jax.data.dataset import open_dataset  # noqa: E402
from yxanul_jax.data.loader import TrainStream  # noqa: E402

SHAPES = [(128, 256), (2048, 16)]  # (seq_len, batch_size): 32,768 tokens per batch each


def measure(ds, seq_len: int, batch_size: int, workers: int, seconds: float) -> float:
    # one lane per row: the most reads per batch a run can ask for (data.lanes)
    with TrainStream(ds, seed=0, lanes=batch_size, num_workers=workers, prefetch=4) as stream:
        stream.next_batch(seq_len, batch_size)  # warm-up: starts threads / worker processes
        tokens, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch = stream.next_batch(seq_len, batch_size)
            tokens += batch["targets"].size
        return tokens / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="prepared dataset (default: prepare Gutenberg once)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    if args.data is None:
        args.data = gutenberg_superbpe()
    ds = open_dataset(args.data)
    train = ds.manifest["splits"]["train"]
    print(f"dataset: {args.data} ({train['documents']:,} train documents, {train['tokens']:,} tokens, "
          f"{ds.manifest['dtype']}, vocab {ds.vocab_size:,})")
    print(f"{'seq_len':>7} {'batch':>5} {'workers':>7} {'tokens/s':>14}")
    results = []
    for workers in args.workers:
        for seq_len, batch_size in SHAPES:
            rate = measure(ds, seq_len, batch_size, workers, args.seconds)
            results.append({"seq_len": seq_len, "batch_size": batch_size, "num_workers": workers,
                            "tokens_per_sec": round(rate)})
            print(f"{seq_len:>7} {batch_size:>5} {workers:>7} {rate:>14,.0f}")
    default = next(r for r in results if r["seq_len"] == 2048 and r["num_workers"] == args.workers[0])
    print(json.dumps({"tokens_per_sec": default["tokens_per_sec"], "seq_len": 2048,
                      "num_workers": default["num_workers"], "results": results, "data": args.data,
                      "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
