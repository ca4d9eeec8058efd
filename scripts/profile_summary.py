"""Where a train step's time goes: a short `jax.profiler` trace of one stage, summarized by op.

    python scripts/profile_summary.py [--config F] [--stage N] [--steps 3] [--top 15] [--out DIR]
    python scripts/profile_summary.py --trace DIR/.../perfetto_trace.json.gz   # summarize an existing trace

Compiles the stage's train step, runs two warm-up steps, then traces `--steps` steps (synthetic
tokens) with `jax.profiler.trace(..., create_perfetto_trace=True)`. The summary reads the Perfetto
JSON: on a GPU the device streams' kernels, on a CPU the XLA ops of the host threads; sums the
time of each op name and prints the top `--top` with their share of all device time, plus the share
of each category.

Categories: when it traced the stage itself it has the compiled step, so each op is matched to a
kernel of the performance model (`analysis.perf.kernels` of the optimized HLO: by the event's
`hlo_op`, else its name, '.' and '-' read as '_') and takes that kernel's category (attention,
GEMM fp8 / bf16 / f32, output head + loss, norms + elementwise, FP8 scaling, optimizer, copies,
collectives); ops it cannot match, and every op of a `--trace` given without its step, fall back to
name patterns (GEMM, attention, FP8 cast/amax, optimizer, loss, copies/collectives, other: XLA
fusion names, cuBLAS / cuDNN / Triton kernel names), a guide rather than an exact accounting. Prints a
table and one JSON line; the trace stays in --out for TensorBoard / Perfetto.

`kernel_times(events, kernel_names)` is the per-HLO-instruction device time that
`scripts/gpu_bench.py --profile` compares with the model's prediction.
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
    ("loss", r"log_softmax|logsumexp|exponential|reduce_max|cross|fused_ce"),
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


def device_events(events: list[dict]) -> list[dict]:
    """The complete events of the ops that ran the step: GPU stream kernels when the trace has a GPU,
    else the XLA ops recorded on CPU threads (not Python or runtime bookkeeping)."""
    names = {}  # (pid, tid) -> thread name, pid -> process name
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            key = e["pid"] if e["name"] == "process_name" else (e["pid"], e.get("tid"))
            names[key] = str(e.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu_pids = {pid for pid, n in names.items() if isinstance(pid, int) and re.search(r"/device:gpu", n, re.I)}
    if gpu_pids:
        return [e for e in complete if e["pid"] in gpu_pids
                and re.search(r"stream", names.get((e["pid"], e.get("tid")), ""), re.I)]
    return [e for e in complete if _xla_op(e)]


def device_ops(events: list[dict]) -> list[tuple[str, float]]:
    """(op name, microseconds) of the ops that ran the step (`device_events`)."""
    return [(str(e["name"]), float(e["dur"])) for e in device_events(events)]


def _xla_op(e: dict) -> bool:
    args = e.get("args", {}) or {}
    return any(k in args for k in ("hlo_op", "hlo_module", "long_name")) or str(e.get("name", "")).startswith(
        ("fusion", "convolution", "dot", "custom-call", "copy", "reduce", "loop_", "input_", "wrapped_"))


# --------------------------------------------------------------------------------------------
# Trace events -> HLO instructions (the performance model's kernels)


def _norm(name: str) -> str:
    return re.sub(r"[.\-]", "_", name).lower()


# Endings a kernel's name may carry beyond its instruction's (sanitized) name.
_SUFFIX = re.compile(r"(_impl|_kernel|_\d+)$")


class KernelMatcher:
    """Finds the HLO instruction an event ran. Tried in order, for the event's `hlo_op` (what GPU kernel
    events and CPU thunks carry), then its name (a GPU kernel is named after its fusion with '.' and '-'
    as '_'; a CPU thunk by its instruction): the exact name, the name with '.' and '-' read as '_', then
    that with one ending `_impl`, `_kernel` or `_N` dropped. The last is a guess (XLA reuses one
    compiled kernel for identical fusions, naming it after the first): it can name a sibling
    instruction, normally of the same category."""

    def __init__(self, kernel_names):
        self.names = set(kernel_names)
        self.normal: dict[str, str] = {}
        for n in sorted(self.names):
            self.normal.setdefault(_norm(n), n)

    def match(self, *candidates: str) -> str | None:
        candidates = [c for c in candidates if c]
        for c in candidates:
            if c in self.names:
                return c
        for c in candidates:
            if _norm(c) in self.normal:
                return self.normal[_norm(c)]
        for c in candidates:
            stripped = _SUFFIX.sub("", _norm(c))
            if stripped != _norm(c) and stripped in self.normal:
                return self.normal[stripped]
        return None

    def event(self, e: dict) -> str | None:
        args = e.get("args", {}) or {}
        return self.match(str(args.get("hlo_op", "")), str(e.get("name", "")))


def _module_name(hlo_text: str) -> str | None:
    m = re.match(r"\s*HloModule\s+([^\s,]+)", hlo_text)
    return m.group(1) if m else None


def _of_module(e: dict, module: str | None) -> bool:
    """Whether an event belongs to `module` (events without an `hlo_module` are kept)."""
    mod = str((e.get("args", {}) or {}).get("hlo_module", ""))
    return not module or not mod or re.match(re.escape(module) + r"(\(|$|\.)", mod) is not None


def kernel_times(events: list[dict], kernel_names, hlo_text: str | None = None) -> dict:
    """Device time per HLO instruction of the traced step, from `device_events`: {"us": {instruction
    name: microseconds, summed over launches}, "matched_us", "total_us", "unmatched": {event name:
    microseconds}}. With `hlo_text`, events of other modules (their `hlo_module`) are left out."""
    matcher = KernelMatcher(kernel_names)
    module = _module_name(hlo_text) if hlo_text else None
    us: collections.Counter = collections.Counter()
    unmatched: collections.Counter = collections.Counter()
    total = 0.0
    for e in device_events(events):
        if not _of_module(e, module):
            continue
        total += float(e["dur"])
        name = matcher.event(e)
        if name is None:
            unmatched[str(e.get("name", ""))] += float(e["dur"])
        else:
            us[name] += float(e["dur"])
    return {"us": dict(us), "matched_us": sum(us.values()), "total_us": total, "unmatched": dict(unmatched)}


def model_categories(events: list[dict], hlo_text: str) -> dict[str, str]:
    """Op (event) name -> the performance model's category of the kernel it ran (`analysis.perf`), for
    the events it can match; an event name seen for kernels of several categories gets the one with
    the most time."""
    from yxanul_jax.analysis import perf

    kernels = {k.name: k for k in perf.kernels(hlo_text)}
    matcher = KernelMatcher(kernels)
    votes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in device_events(events):
        name = matcher.event(e)
        if name is not None:
            votes[str(e["name"])][kernels[name].category] += float(e["dur"])
    return {n: c.most_common(1)[0][0] for n, c in votes.items()}


def summarize(ops: list[tuple[str, float]], top: int, categories: dict[str, str] | None = None) -> dict:
    """Time by op name and by category: `categories` (op name -> category, `model_categories`) first,
    name patterns (`category`) for the rest."""
    categories = categories or {}
    by_name = collections.Counter()
    count = collections.Counter()
    for name, us in ops:
        by_name[name] += us
        count[name] += 1
    total = sum(by_name.values()) or 1.0

    def cat(n: str) -> str:
        return categories.get(n) or category(n)

    by_cat = collections.Counter()
    for name, us in by_name.items():
        by_cat[cat(name)] += us
    modeled = sum(us for n, us in by_name.items() if n in categories)
    return {"total_ms": total / 1e3, "ops": len(ops),
            "top": [{"name": n, "ms": us / 1e3, "share": us / total, "calls": count[n], "category": cat(n)}
                    for n, us in by_name.most_common(top)],
            "categories": {c: us / total for c, us in by_cat.most_common()},
            "category_source": f"performance model (analysis/perf.py) for {100 * modeled / total:.1f} % of op "
                               "time, name patterns for the rest" if categories else "name patterns"}


def trace_steps(step, state, batch, steps: int, out: str):
    """Trace `steps` calls of a compiled (and warmed-up) step into `out`: (the Perfetto trace's path,
    the state after them)."""
    import jax

    with jax.profiler.trace(out, create_perfetto_trace=True):
        for _ in range(steps):
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    found = sorted(glob.glob(os.path.join(out, "**", "perfetto_trace.json.gz"), recursive=True), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"error: the profiler wrote no perfetto_trace.json.gz under {out}")
    return found[-1], state


def trace_stage(config: str | None, stage_index: int, steps: int, out: str) -> tuple[str, str]:
    """Compile one stage's step, warm it up and trace `steps` steps: (trace path, optimized HLO text)."""
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
    path, _ = trace_steps(step, state, batch, steps, out)
    return path, step.as_text()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", default="profile")
    p.add_argument("--trace", default=None, help="summarize this perfetto_trace.json.gz instead of tracing")
    args = p.parse_args(argv)
    path, hlo_text = (args.trace, None) if args.trace else trace_stage(args.config, args.stage, args.steps, args.out)
    events = load_events(path)
    s = summarize(device_ops(events), args.top, model_categories(events, hlo_text) if hlo_text else None)
    if not s["ops"]:
        print(f"error: no device ops found in {path}", file=sys.stderr)
        return 2
    print(f"trace: {path}\n{s['ops']} ops, {s['total_ms']:.2f} ms of op time over {args.steps} steps")
    print(f"{'share':>7} {'ms':>9} {'calls':>6}  {'category':<20} op")
    for r in s["top"]:
        print(f"{100 * r['share']:>6.1f}% {r['ms']:>9.3f} {r['calls']:>6}  {r['category']:<20} {r['name'][:90]}")
    print("by category: " + ", ".join(f"{c} {100 * v:.1f}%" for c, v in s["categories"].items()))
    print(f"categories from: {s['category_source']}")
    print(json.dumps({**s, "trace": path, "config": args.config or "default", "stage": args.stage,
                      "steps": args.steps, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
