"""Benchmark: `prepare` throughput against the raw `tokenizers` batch-encode rate on the same text.

    python scripts/bench_prepare.py [--input PATH...] [--tokenizer PATH] [--repeats 2]

Raw rate: every document already in memory, one `encode_batch_fast` call (all cores), ids read
out; nothing else. Prepare rate: the whole `prepare_dataset` path (read parquet, hash-split,
encode, convert, write shards + manifest) into a temp dir. Runs alternate (raw, prepare, raw, ...)
and the best of each is kept, because the machine may be shared; CPU seconds (all threads) per run
are reported too, a measure of prepare's extra work that other processes disturb less than wall
time. Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from yxanul_jax.data.prepare import prepare_dataset  # noqa: E402
from yxanul_jax.data.sources import DocumentSource  # noqa: E402
from yxanul_jax.data.tokenizer import load_tokenizer  # noqa: E402

SHARED = ROOT.parent / "shared"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", default=[str(SHARED / "data/train/gutenberg-00000-of-00004.parquet")])
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/superbpe-t80k"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    tok = load_tokenizer(args.tokenizer)
    texts = [t for batch in DocumentSource(args.input).batches() for t in batch]
    chars = sum(map(len, texts))
    tok.tokenizer.encode_batch_fast(texts)  # warm-up: thread pool and BPE word cache, for both paths alike
    raw, prep, raw_cpu, prep_cpu = [], [], [], []
    for _ in range(args.repeats):
        start, cpu = time.perf_counter(), time.process_time()
        encodings = tok.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        tokens = sum(len(e.ids) for e in encodings)
        raw.append(tokens / (time.perf_counter() - start))
        raw_cpu.append(time.process_time() - cpu)
        del encodings
        with tempfile.TemporaryDirectory() as tmp:
            start, cpu = time.perf_counter(), time.process_time()
            manifest = prepare_dataset(DocumentSource(args.input), tok, Path(tmp) / "out", progress=False)
            prep.append(manifest["tokens"] / (time.perf_counter() - start))
            prep_cpu.append(time.process_time() - cpu)
        assert manifest["tokens"] == tokens, "prepare and raw encode disagree on the token count"
    best_raw, best_prep = max(raw), max(prep)
    cpu_ratio = min(raw_cpu) / min(prep_cpu)
    print(f"inputs: {', '.join(args.input)}  ({len(texts):,} documents, {chars:,} characters, {tokens:,} tokens)")
    print(f"tokenizer: {tok.source} (vocab {tok.vocab_size:,}, superbpe={tok.superbpe})")
    print(f"{'path':<34} {'tokens/s (best)':>16} {'all runs':>30}")
    print(f"{'raw tokenizers encode_batch_fast':<34} {best_raw:>16,.0f} {str([round(r) for r in raw]):>30}")
    print(f"{'prepare (read+split+encode+write)':<34} {best_prep:>16,.0f} {str([round(r) for r in prep]):>30}")
    print(f"CPU seconds per run (min): raw {min(raw_cpu):.2f}, prepare {min(prep_cpu):.2f}")
    print(f"prepare / raw = {best_prep / best_raw:.3f} (wall, best of {args.repeats}); {cpu_ratio:.3f} (CPU time)")
    print(json.dumps({"raw_tokens_per_sec": round(best_raw), "prepare_tokens_per_sec": round(best_prep),
                      "ratio": round(best_prep / best_raw, 4), "cpu_ratio": round(cpu_ratio, 4), "documents": len(texts), "tokens": tokens,
                      "tokenizer": tok.source, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
