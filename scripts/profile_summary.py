"""Where a train step's time goes: a short `jax.profiler` trace of one stage, summarized by op.

    python scripts/profile_summary.py [--config F] [--stage N] [--steps 3] [--top 15] [--out DIR]
    python scripts/profile_summary.py --trace DIR/.../perfetto_trace.json.gz   # summarize an existing trace

Compiles the stage's train step, runs two warm-up steps, then traces `--steps` steps (synthetic
tokens) with `jax.profiler.trace(..., create_perfetto_trace=True)`. The summary reads the Perfetto
JSON: on a GPU the device streams' kernels, on a CPU the XLA ops of the host threads; sums the
time of each op name and prints the top `--top` with their share of all device time, plus the share
of each category (GEMM, attention, FP8 cast/amax, optimizer, loss, copies/collectives, other).
Categories are read from op names (XLA fusion names, cuBLAS / cuDNN / Triton kernel names), so they
are a guide, not an exact accounting. Prints a table and one JSON line; the trace stays in --out for
TensorBoard / Perfetto.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CATEGORIES = (  # first match wins; patterns are matched against the lower-cased op / kernel name
    ("attention", r"fmha|flash|cudnn|attention|softmax"),
    ("gemm", r"gemm|cublas|matmul|dot|sm90_xmma|cutlass|triton_gemm|nvjet|ynn_fusion"),  # ynn: XLA CPU dots
    ("fp8 cast/amax", r"f8e4m3|f8e5m2|fp8|convert|amax|clamp"),
    ("optimizer", r"adam|optimizer|sqrt|rsqrt.*update"),
    ("loss", r"log_softmax|logsumexp|exponential|reduce_max|cross"),
    ("copy/collective", r"copy|memcpy|memset|all-reduce|all_reduce|all-gather|reduce-scatter|nccl|dynamic-update-slice"),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def device_ops(events: list[dict]) -> list[tuple[str, float]]:
    """(op name, microseconds) of the ops that ran the step: GPU stream kernels when the trace has a
    GPU, else the XLA ops recorded on CPU threads (not Python or runtime bookkeeping)."""
    names = {}  # (pid, tid) -> thread name, pid -> process name
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            key = e["pid"] if e["name"] == "process_name" else (e["pid"], e.get("tid"))
            names[key] = str(e.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu_pids = {pid for pid, n in names.items() if isinstance(pid, int) and re.search(r"/device:gpu", n, re.I)}
    if gpu_pids:
        chosen = [e for e in complete if e["pid"] in gpu_pids
                  and re.search(r"stream", names.get((e["pid"], e.get("tid")), ""), re.I)]
    else:
        chosen = [e for e in complete if _xla_op(e)]
    return [(str(e["name"]), float(e["dur"])) for e in chosen]


def _xla_op(e: dict) -> bool:
    args = e.get("args", {}) or {}
    return any(k in args for k in ("hlo_op", "hlo_module", "long_name")) or str(e.get("name", "")).startswith(
        ("fusion", "convolution", "dot", "custom-call", "copy", "reduce", "loop_", "input_", "wrapped_"))


def summarize(ops: list[tuple[str, float]], top: int) -> dict:
    by_name = collections.Counter()
    count = collections.Counter()
    for name, us in ops:
        by_name[name] += us
        count[name] += 1
    total = sum(by_name.values()) or 1.0
    by_cat = collections.Counter()
    for name, us in by_name.items():
        by_cat[category(name)] += us
    return {"total_ms": total / 1e3, "ops": len(ops),
            "top": [{"name": n, "ms": us / 1e3, "share": us / total, "calls": count[n], "category": category(n)}
                    for n, us in by_name.most_common(top)],
            "categories": {c: us / total for c, us in by_cat.most_common()}}


def trace_stage(config: str | None, stage_index: int, steps: int, out: str) -> str:
    import jax

    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.stages import compile_stage, synthetic_inputs

    cfg = load_config(config)
    stage = cfg.curriculum[stage_index]
    step = compile_stage(cfg, stage)
    state, batch = synthetic_inputs(cfg, stage)
    for _ in range(2):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    with jax.profiler.trace(out, create_perfetto_trace=True):
        for _ in range(steps):
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    found = sorted(glob.glob(os.path.join(out, "**", "perfetto_trace.json.gz"), recursive=True), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"error: the profiler wrote no perfetto_trace.json.gz under {out}")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", default="profile")
    p.add_argument("--trace", default=None, help="summarize this perfetto_trace.json.gz instead of tracing")
    args = p.parse_args(argv)
    path = args.trace or trace_stage(args.config, args.stage, args.steps, args.out)
    s = summarize(device_ops(load_events(path)), args.top)
    if not s["ops"]:
        print(f"error: no device ops found in {path}", file=sys.stderr)
        return 2
    print(f"trace: {path}\n{s['ops']} ops, {s['total_ms']:.2f} ms of op time over {args.steps} steps")
    print(f"{'share':>7} {'ms':>9} {'calls':>6}  {'category':<16} op")
    for r in s["top"]:
        print(f"{100 * r['share']:>6.1f}% {r['ms']:>9.3f} {r['calls']:>6}  {r['category']:<16} {r['name'][:90]}")
    print("by category: " + ", ".join(f"{c} {100 * v:.1f}%" for c, v in s["categories"].items()))
    print(json.dumps({**s, "trace": path, "config": args.config or "default", "stage": args.stage,
                      "steps": args.steps, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
