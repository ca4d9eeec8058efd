"""Does the train loop keep the device busy? The real `train()` loop vs the bare compiled step, per stage.

    python scripts/loop_efficiency.py [--config F] [--stages 0,1] [--steps 40] [--skip 5] [key=value ...]

For each chosen stage of the config, a run of `--steps` steps per stage (the stages back to back, no
validation or checkpoint inside the loop) goes through the real `yxanul_jax.train.train` on the
config's data (`data.train`, or the demo corpus): loader, host-to-device transfer, metrics and
progress included. Its tokens/s per stage is the median over the steps after the first `--skip`
(the loop's own per-step figure, which leaves compile waits out). The bare step is the same stage's
compiled step run `--steps` times back to back on one synthetic batch already on the device, timed
as a whole. Reported per stage: both rates, their ratio (goal >= 0.95: nothing in the loop stalls
the device), and at each stage change the stall: what the stage's first step waited for its compile
(prefetched while the previous stage trained; with a warm compilation cache it is a cache read) plus
how much longer that step took than the stage's median.

Prints a table and a final JSON line. Runs on CPU (tiny config by default) and on a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time


def loop_config(cfg, stages: list[int], steps: int):
    """`cfg` with only `stages`, each `steps` long, and nothing but training inside the loop."""
    chosen = [dataclasses.replace(cfg.curriculum[s], start_step=i * steps) for i, s in enumerate(stages)]
    return dataclasses.replace(
        cfg, curriculum=tuple(chosen),
        train=dataclasses.replace(cfg.train, steps=steps * len(stages), log_every=1, sample_tokens=0),
        eval=dataclasses.replace(cfg.eval, interval=0),
        checkpoint=dataclasses.replace(cfg.checkpoint, interval=10**9, async_save=False))


def bare_tokens_per_sec(cfg, stage, steps: int) -> float:
    """The compiled step alone: `steps` back to back on one device-resident batch, timed as a whole."""
    import jax

    from yxanul_jax.training.stages import compile_stage, synthetic_inputs

    step = compile_stage(cfg, stage)
    state, batch = synthetic_inputs(cfg, stage)
    for _ in range(2):  # warm-up
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    return stage.tokens_per_step * steps / (time.perf_counter() - t0)


def measure(cfg, stages: list[int], steps: int, skip: int) -> dict:
    from yxanul_jax.plot import read_metrics
    from yxanul_jax.training.loop import fit

    run_cfg = loop_config(cfg, stages, steps)
    with tempfile.TemporaryDirectory(prefix="loop-efficiency-") as run_dir:
        result = fit(run_cfg, run_dir)
        rows = [r for r in read_metrics(run_dir) if "tokens_per_sec" in r]
    waits = result.stage_waits
    out = []
    for i, s in enumerate(stages):
        stage = run_cfg.curriculum[i]
        mine = [r for r in rows if r["stage"] == i]
        rates = [r["tokens_per_sec"] for r in mine[skip:]]
        if not rates:
            raise SystemExit(f"error: --steps {steps} leaves no step after --skip {skip}; raise --steps")
        loop_tps = statistics.median(rates)
        bare = bare_tokens_per_sec(run_cfg, stage, steps)
        step_s = stage.tokens_per_step / loop_tps
        first_extra = max(stage.tokens_per_step / mine[0]["tokens_per_sec"] - step_s, 0.0) if mine else 0.0
        row = {"stage": s, "seq_len": stage.seq_len, "tokens_per_step": stage.tokens_per_step,
               "loop_tokens_per_sec": loop_tps, "bare_tokens_per_sec": bare, "ratio": loop_tps / bare,
               "loop_steps": len(mine)}
        if i > 0:  # the change into this stage
            row["stall_s"] = waits.get(i, 0.0) + first_extra
            row["compile_wait_s"] = waits.get(i, 0.0)
        out.append(row)
    return {"stages": out, "times": {k: v for k, v in result.times.items() if k != "stage_waits"}}


def table(rows: list[dict]) -> str:
    lines = [f"{'stage':>5} {'seq':>6} {'tok/step':>9} {'loop tok/s':>12} {'bare tok/s':>12} {'ratio':>7} {'stall s':>8}"]
    for r in rows:
        stall = f"{r['stall_s']:.2f}" if "stall_s" in r else "-"
        lines.append(f"{r['stage']:>5} {r['seq_len']:>6} {r['tokens_per_step']:>9,} {r['loop_tokens_per_sec']:>12,.0f} "
                     f"{r['bare_tokens_per_sec']:>12,.0f} {r['ratio']:>7.3f} {stall:>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="config YAML (default: the embedded tiny default)")
    p.add_argument("--stages", default=None, help="comma-separated stage indices (default: every stage)")
    p.add_argument("--steps", type=int, default=40, help="steps per stage, in the loop and bare")
    p.add_argument("--skip", type=int, default=5, help="first loop steps of each stage left out of its median")
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import jax

    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.errors import UserError

    try:
        cfg = load_config(args.config, args.overrides)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stages = list(range(len(cfg.curriculum))) if args.stages is None else [int(s) for s in args.stages.split(",")]
    bad = [s for s in stages if not 0 <= s < len(cfg.curriculum)]
    if bad or args.steps <= args.skip or args.skip < 0:
        print(f"error: --stages {bad} out of range 0..{len(cfg.curriculum) - 1}, or --steps {args.steps} not above "
              f"--skip {args.skip}; pick existing stages and more steps than skipped", file=sys.stderr)
        return 2
    result = measure(cfg, stages, args.steps, args.skip)
    device = jax.devices()[0]
    print(f"{cfg.model.name} on {device.device_kind} ({device.platform}), {args.steps} steps per stage, median after "
          f"{args.skip}; {time.strftime('%Y-%m-%d')}\n")
    print(table(result["stages"]))
    print(json.dumps({"config": cfg.model.name, "device": device.device_kind, "platform": device.platform,
                      "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "skip": args.skip, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
