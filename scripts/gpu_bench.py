"""The benchmark kit: yxanul-jax train-step speed per stage and precision, beside a PyTorch reference.

    python scripts/gpu_bench.py [--config configs/yxanul_197m.yaml] [--stages 0 4 9]
        [--baseline configs/yxanul_197m_baseline.yaml] [--precisions bf16 fp8-xla fp8-te]
        [--steps 20] [--warmup 5] [--torch | --no-torch] [--out bench]

For every (config, stage, precision) cell, in its own process (a clean device-memory peak and
compile): the stage's train step compiled ahead of time (compile seconds), `--warmup` steps, then
`--steps` timed steps, each synchronized (median step time), on synthetic tokens. Reported:
tokens/s; MFU by model FLOPs (6 N + attention, `accounting.flops_per_token`) and by executed FLOPs
(XLA's cost analysis of the compiled step: remat recompute and everything else counted);
device-memory peak (`memory_stats()["peak_bytes_in_use"]`, GPU only) beside the planner's estimate;
and, with `--torch` (default on a GPU), scripts/torch_reference.py's step at the same shape, so
the ratio yxanul-jax / PyTorch is measured in the same run. `fp8-te` rows run only where
Transformer Engine imports (the reason is recorded otherwise).

Writes `OUT/bench.json` and `OUT/bench.md`, prints the table and one JSON line. On a CPU it runs
too (use `--config configs/tiny.yaml --stages 0`: tests/test_gpu_bench.py does).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRECISIONS = ("bf16", "fp8-xla", "fp8-te")


def precision_config(cfg, precision: str):
    """The config of one precision: BF16 (FP8 off), FP8 with the `xla` or the `te` backend."""
    if precision == "bf16":
        return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    backend = {"fp8-xla": "xla", "fp8-te": "te"}[precision]
    return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=True, backend=backend))


def bench_cell(config: str | None, stage_index: int, precision: str, steps: int, warmup: int, torch_ref: bool) -> dict:
    """One cell, in this process: compile, warm up, time; the PyTorch reference at the same shape."""
    import jax

    from yxanul_jax.analysis.accounting import flops_per_token
    from yxanul_jax.analysis.memory import estimate_stage
    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.errors import UserError
    from yxanul_jax.model import fp8 as fp8_lib
    from yxanul_jax.training.monitor import peak_flops_per_device
    from yxanul_jax.training.stages import compile_stage, compiled_memory, synthetic_inputs

    cfg = precision_config(load_config(config), precision)
    stage = cfg.curriculum[stage_index]
    row = {"config": cfg.model.name, "stage": stage_index, "precision": precision, "seq_len": stage.seq_len,
           "rows": stage.batch_size * stage.grad_accum_steps, "tokens_per_step": stage.tokens_per_step}
    try:
        fp8_lib.check_backend(cfg.fp8)
    except UserError as e:
        return {**row, "skipped": str(e)}
    device = jax.devices()[0]
    t0 = time.perf_counter()
    step = compile_stage(cfg, stage)
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    cost = step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    executed_flops = float((cost or {}).get("flops", 0.0)) or None
    state, batch = synthetic_inputs(cfg, stage)
    # Delayed FP8 scaling: the first warm-up step quantizes with a fresh state's unit scales (a real
    # run bootstraps it with current scaling, steps.fp8_bootstrap_config); only timing is read here.
    for _ in range(max(warmup, 1)):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tps = stage.tokens_per_step / step_s
    peak = peak_flops_per_device(device)
    model_flops = flops_per_token(cfg.model, stage.seq_len) * stage.tokens_per_step
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    row.update({
        "device": device.device_kind, "platform": device.platform, "step_s": step_s, "step_s_spread":
        round(statistics.pstdev(times) / step_s, 4), "tokens_per_sec": tps, "loss": float(metrics["loss"]),
        "model_tflops_per_step": model_flops / 1e12,
        "executed_tflops_per_step": None if executed_flops is None else executed_flops / 1e12,
        "mfu_model": None if peak is None else model_flops / step_s / peak,
        "mfu_executed": None if peak is None or executed_flops is None else executed_flops / step_s / peak,
        "peak_bytes": (stats or {}).get("peak_bytes_in_use"),
        "xla_peak_bytes": compiled_memory(step)["peak_bytes"],
        "planner_bytes": estimate_stage(cfg, stage, "gpu")["bytes_total"]})
    if torch_ref and precision == "bf16":
        from torch_reference import time_train_step

        del state, step  # the reference gets the device to itself
        ref = time_train_step(cfg.model, stage.seq_len, row["rows"], lr=cfg.optim.lr, steps=steps, warmup=warmup,
                              loss_chunk=cfg.train.loss_chunk, compile=device.platform == "gpu")
        row["torch"] = ref
        row["ratio_vs_torch"] = tps / ref["tokens_per_sec"]
    return row


def run_cell(args, config: str, stage: int, precision: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--cell", json.dumps([config, stage, precision]),
           "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--torch"] if args.torch else ["--no-torch"])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"config": config, "stage": stage, "precision": precision, "failed": tail}
    return json.loads(lines[-1])


def _gb(b) -> str:
    return "-" if b is None else f"{b / 2**30:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(rows: list[dict]) -> str:
    cols = ["config", "stage", "seq x rows", "precision", "compile s", "step ms", "tokens/s", "MFU model",
            "MFU executed", "peak GiB", "XLA GiB", "planner GiB", "PyTorch tokens/s", "ours / PyTorch"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["config"], str(r["stage"]), f"{r.get('seq_len', '?')} x {r.get('rows', '?')}", r["precision"]]
        if "skipped" in r or "failed" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['failed']}"
            lines.append("| " + " | ".join(cells + [why] + [""] * (len(cols) - 5)) + " |")
            continue
        torch_tps = r["torch"]["tokens_per_sec"] if r.get("torch") else None
        cells += [f"{r['compile_s']:.1f}", f"{1e3 * r['step_s']:.1f}", f"{r['tokens_per_sec']:,.0f}",
                  _pct(r["mfu_model"]), _pct(r["mfu_executed"]), _gb(r["peak_bytes"]), _gb(r["xla_peak_bytes"]),
                  _gb(r["planner_bytes"]), "-" if torch_tps is None else f"{torch_tps:,.0f}",
                  "-" if "ratio_vs_torch" not in r else f"{r['ratio_vs_torch']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/yxanul_197m.yaml")
    p.add_argument("--stages", type=int, nargs="+", default=[0, 4, 9])
    p.add_argument("--baseline", default="configs/yxanul_197m_baseline.yaml",
                   help="a one-stage config benchmarked too (its stage 0); '' for none")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--torch", dest="torch", action="store_true", default=None,
                   help="time the PyTorch reference beside every bf16 cell (default: on a GPU)")
    p.add_argument("--no-torch", dest="torch", action="store_false")
    p.add_argument("--out", default="bench", help="folder for bench.json and bench.md")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: one cell, one JSON line
    args = p.parse_args(argv)
    if args.cell:
        config, stage, precision = json.loads(args.cell)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        print(json.dumps(bench_cell(config, stage, precision, args.steps, args.warmup, bool(args.torch))))
        return 0
    if args.torch is None:
        import importlib.util

        args.torch = importlib.util.find_spec("torch") is not None and _has_cuda()
    cells = [(args.config, s, prec) for s in args.stages for prec in args.precisions]
    if args.baseline:
        cells += [(args.baseline, 0, prec) for prec in args.precisions]
    rows = []
    for config, stage, precision in cells:
        row = run_cell(args, config, stage, precision)
        rows.append(row)
        status = row.get("skipped") or row.get("failed") or f"{row['tokens_per_sec']:,.0f} tokens/s"
        print(f"{row['config']} stage {stage} {precision}: {status}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    md = (f"Benchmark {time.strftime('%Y-%m-%d')} on {platform.node()} ({_device_name()}); "
          f"{args.steps} timed steps after {args.warmup} warm-up, median.\n\n" + table(rows))
    record = {"rows": rows, "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
              "device": _device_name(), "steps": args.steps, "warmup": args.warmup}
    from yxanul_jax.core.rundir import atomic_write

    atomic_write(os.path.join(args.out, "bench.json"), json.dumps(record, indent=2) + "\n")
    atomic_write(os.path.join(args.out, "bench.md"), md)
    print(md)
    print(json.dumps(record))
    return 0


def _has_cuda() -> bool:
    try:
        import jax

        return jax.default_backend() == "gpu"
    except Exception:
        return False


def _device_name() -> str:
    import jax

    d = jax.devices()[0]
    return f"{jax.device_count()} x {d.device_kind} ({d.platform}), jax {jax.__version__}"


if __name__ == "__main__":
    sys.exit(main())
