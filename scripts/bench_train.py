"""Train-step throughput per curriculum stage: tokens/s, step time and MFU, FP8 on and off.

Each stage's step is compiled ahead of time (compile time reported separately), warmed up, then
timed over `--steps` steps on random tokens (throughput does not depend on the text). Run it on the
machine you want numbers for; it prints a table and a final JSON line.

    python scripts/bench_train.py --config configs/yxanul_197m.yaml [--stages 0,4,9] [--steps 20] [--fp8 on,off]
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time

import jax
import jax.numpy as jnp

from yxanul_jax.config import load_config
from yxanul_jax.accounting import flops_per_token
from yxanul_jax.monitor import mfu, peak_flops_per_device
from yxanul_jax.stages import compile_stage
from yxanul_jax.steps import init_train_state


def bench_stage(cfg, i: int, steps: int, warmup: int) -> dict:
    stage = cfg.curriculum[i]
    t0 = time.perf_counter()
    step = compile_stage(cfg, stage)
    compile_s = time.perf_counter() - t0
    state = jax.jit(lambda k: init_train_state(cfg, k))(jax.random.key(0))
    shape = (stage.grad_accum_steps, stage.batch_size, stage.seq_len + 1)
    tokens = jax.random.randint(jax.random.key(1), shape, 0, cfg.model.vocab_size)
    batch = {"inputs": tokens[..., :-1], "targets": tokens[..., 1:],
             "mask": jnp.ones(tokens[..., 1:].shape, jnp.float32)}
    # Delayed FP8 scaling: the first warm-up step runs on a fresh state's unit scales (training runs
    # it once with current scaling instead, steps.fp8_bootstrap_config); later steps, the timed ones,
    # quantize with the histories it filled. Only the timing is read here.
    for _ in range(warmup):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    dt = (time.perf_counter() - t0) / steps
    tps = stage.tokens_per_step / dt
    util = mfu(tps, flops_per_token(cfg.model, stage.seq_len), jax.device_count(), peak_flops_per_device(jax.devices()[0]))
    return {"stage": i, "seq_len": stage.seq_len, "batch_size": stage.batch_size, "accum": stage.grad_accum_steps,
            "fp8": cfg.fp8.active, "compile_s": round(compile_s, 2), "step_s": dt, "tokens_per_sec": tps,
            "mfu": util, "loss": float(metrics["loss"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--stages", default="all", help="comma-separated stage indices, or all")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fp8", default="on,off", help="on, off, or on,off")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    base = load_config(args.config, args.overrides)
    stages = range(len(base.curriculum)) if args.stages == "all" else [int(s) for s in args.stages.split(",")]
    rows = []
    for mode in args.fp8.split(","):
        cfg = dataclasses.replace(base, fp8=dataclasses.replace(base.fp8, enabled=(mode == "on")))
        rows += [bench_stage(cfg, i, args.steps, args.warmup) for i in stages]
    device = jax.devices()[0]
    print(f"{args.config} on {jax.device_count()} x {device.device_kind} ({device.platform}), "
          f"{datetime.date.today().isoformat()}")
    print(f"{'fp8':<5}{'stage':>6}{'seq':>6}{'batch':>7}{'accum':>6}{'compile s':>10}{'step ms':>10}"
          f"{'tokens/s':>12}{'MFU':>8}")
    for r in rows:
        util = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{'on' if r['fp8'] else 'off':<5}{r['stage']:>6}{r['seq_len']:>6}{r['batch_size']:>7}{r['accum']:>6}"
              f"{r['compile_s']:>10.1f}{1000 * r['step_s']:>10.1f}{r['tokens_per_sec']:>12,.0f}{util:>8}")
    print(json.dumps({"config": args.config, "device": device.device_kind, "n_devices": jax.device_count(),
                      "date": datetime.date.today().isoformat(), "rows": rows,
                      "tokens_per_sec": rows[-1]["tokens_per_sec"]}))


if __name__ == "__main__":
    main()
