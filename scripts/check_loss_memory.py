"""Compiled memory of a train step, chunked loss vs the naive full-logits loss (AOT, no allocation).

Default: yxanul-197m, stage 0 of its curriculum (seq_len 8 x batch 8192 = 65,536 tokens), where
the full 200,005-wide logits alone would be 26 GB in BF16 (52 GB in FP32). Compiles on abstract
shapes with XLA's CPU backend, so it runs on any machine; prints a table and a final JSON line.

    python scripts/check_loss_memory.py [--config configs/yxanul_197m.yaml] [--stage 0] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import jax

from yxanul_jax.core.config import load_config
from yxanul_jax.training.stages import compile_stage, compiled_memory

GB = 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/yxanul_197m.yaml")
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides)
    stage = cfg.curriculum[args.stage]
    tokens = stage.seq_len * stage.batch_size
    start = time.perf_counter()
    mem = compiled_memory(compile_stage(cfg, stage))
    seconds = time.perf_counter() - start
    naive_logits = tokens * cfg.model.vocab_size * 2  # BF16 logits alone, before their gradient
    temp, args_b, out_b, peak = mem["temp_bytes"], mem["argument_bytes"], mem["output_bytes"], mem["peak_bytes"]
    print(f"config {args.config} stage {args.stage}: seq_len {stage.seq_len} x batch {stage.batch_size} = "
          f"{tokens:,} tokens, vocab {cfg.model.vocab_size:,}, loss chunk {cfg.train.loss_chunk:,} tokens")
    print(f"{'quantity':<40}{'GB':>10}")
    for name, value in [("arguments (state + batch)", args_b), ("outputs (new state + metrics)", out_b),
                        ("aliased (donated state)", mem["alias_bytes"]), ("temporaries", temp),
                        ("compiled peak estimate", peak), ("naive BF16 logits alone", naive_logits)]:
        print(f"{name:<40}{value / GB:>10.2f}")
    print(f"compile {seconds:.1f} s on {platform.machine()} ({jax.devices()[0].platform})")
    print(json.dumps({"config": args.config, "stage": args.stage, "tokens": tokens, "temp_bytes": temp,
                      "argument_bytes": args_b, "output_bytes": out_b, "alias_bytes": mem["alias_bytes"],
                      "peak_bytes": peak, "naive_logits_bytes": naive_logits, "compile_seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main()
