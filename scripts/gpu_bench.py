"""The benchmark kit: yxanul-jax train-step speed per stage and precision, beside a PyTorch reference
and the performance model's prediction.

    python scripts/gpu_bench.py [--config configs/yxanul_197m.yaml] [--stages 0 4 9]
        [--baseline configs/yxanul_197m_baseline.yaml] [--precisions bf16 fp8-xla fp8-te]
        [--steps 20] [--warmup 5] [--torch | --no-torch] [--predict-for GPU]
        [--profile [--profile-steps 3]] [--out bench]

For every (config, stage, precision) cell, in its own process (a clean device-memory peak and
compile): the stage's train step compiled ahead of time (compile seconds), `--warmup` steps, then
`--steps` timed steps, each synchronized (median step time), on synthetic tokens. Reported:
tokens/s; MFU by model FLOPs (6 N + attention, `accounting.flops_per_token`) and by HLO FLOPs (every
GEMM and attention kernel of the optimized step, loop trip counts applied, remat recompute included:
`analysis.perf.hlo_flops`; XLA's own cost analysis counts a loop body once); device-memory peak
(`memory_stats()["peak_bytes_in_use"]`, GPU only) beside the planner's estimate; and, with `--torch`
(default on a GPU), scripts/torch_reference.py's step at the same shape, so the ratio
yxanul-jax / PyTorch is measured in the same run. `fp8-te` rows run only where Transformer Engine
imports (the reason is recorded otherwise).

Prediction: the performance model (`analysis.perf.predict`, with the GPU's entry of
`perf.CALIBRATION_FILE` when there is one) of the same compiled step, for the GPU the device is
(`analysis.gpus.of_device_kind`) or the one `--predict-for` names (a CPU run predicts for it too:
a test of the plumbing, not a comparison of like with like); neither, and the row says there is no
prediction. Rows get the predicted step ms, tokens/s and MFU, measured / predicted and the predicted
ms per category.

`--profile`: after the timed steps each cell traces `--profile-steps` more with `jax.profiler`
(OUT/profile/<cell>/), reads each HLO instruction's device time (scripts/profile_summary.py
`kernel_times`) and compares it per category with the uncalibrated prediction
(`perf.category_ratios`: row `category_ratios`). The run then writes OUT/calibration.json in
CALIBRATION_FILE's format, keyed by the GPU: per category measured / predicted over all its cells
(both summed over the kernels the trace matched, so each cell weighs by its predicted ms), and
prints it; to apply it, copy that entry into yxanul_jax/analysis/perf_calibration.json.

Writes `OUT/bench.json` and `OUT/bench.md`, prints the table and one JSON line. On a CPU it runs
too (use `--config configs/tiny.yaml --stages 0`: tests/test_gpu_bench.py does, with
`--predict-for h100 --profile`).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRECISIONS = ("bf16", "fp8-xla", "fp8-te")
# A --profile cell runs without XLA's command buffers (CUDA graphs): inside one, every kernel's trace event
# names the command buffer, not its HLO instruction, and nothing could be matched to the prediction.
PROFILE_XLA_FLAG = "--xla_gpu_enable_command_buffer="


def precision_config(cfg, precision: str):
    """The config of one precision: BF16 (FP8 off), FP8 with the `xla` or the `te` backend."""
    if precision == "bf16":
        return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    backend = {"fp8-xla": "xla", "fp8-te": "te"}[precision]
    return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=True, backend=backend))


def bench_cell(config: str | None, stage_index: int, precision: str, steps: int, warmup: int, torch_ref: bool,
               predict_for: str | None = None, profile_steps: int = 0, out: str = "bench",
               overrides: list[str] | None = None) -> dict:
    """One cell, in this process: compile, warm up, time; the prediction; with `profile_steps`, a
    profile of that many more steps against the prediction; the PyTorch reference at the same shape."""
    import jax

    from yxanul_jax.analysis import gpus, perf
    from yxanul_jax.analysis.accounting import flops_per_token
    from yxanul_jax.analysis.memory import estimate_stage, with_stage_remat
    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.errors import UserError
    from yxanul_jax.model import fp8 as fp8_lib
    from yxanul_jax.training.monitor import peak_flops_per_device
    from yxanul_jax.training.stages import compile_stage, compiled_memory, synthetic_inputs
    from yxanul_jax.training.steps import fp8_summary, step_xla_options

    cfg = precision_config(load_config(config, list(overrides or [])), precision)
    stage = cfg.curriculum[stage_index]
    row = {"config": cfg.model.name, "stage": stage_index, "precision": precision, "seq_len": stage.seq_len,
           "rows": stage.batch_size * stage.grad_accum_steps, "tokens_per_step": stage.tokens_per_step,
           "overrides": list(overrides or []), "command_buffers": "off" if re.search(
               re.escape(PROFILE_XLA_FLAG) + r"(\s|$)", os.environ.get("XLA_FLAGS", "")) else "default",
           "xla_options": step_xla_options(cfg),
           **{f"fp8_{k}": v for k, v in (fp8_summary(cfg) or {"gemm_form": None, "wgrad": None}).items()}}
    try:
        fp8_lib.check_backend(cfg.fp8)
    except UserError as e:
        return {**row, "skipped": str(e)}
    device = jax.devices()[0]
    cfg = with_stage_remat(cfg, stage, device)  # `remat: auto` as the step compiles it, for the planner's figure too
    row["remat"], row["micro_split"] = cfg.model.remat, cfg.train.micro_split
    t0 = time.perf_counter()
    step = compile_stage(cfg, stage)
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    hlo_text = step.as_text()
    kernels = perf.kernels(hlo_text)
    hlo_flops = perf.hlo_flops(kernels)  # trip-counted: XLA's cost_analysis counts a loop body once
    gpu = gpus.lookup(predict_for) if predict_for else gpus.of_device_kind(device.device_kind)
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
        "model_tflops_per_step": model_flops / 1e12, "hlo_tflops_per_step": hlo_flops / 1e12,
        "mfu_model": None if peak is None else model_flops / step_s / peak,
        "mfu_hlo": None if peak is None else hlo_flops / step_s / peak,
        "peak_bytes": (stats or {}).get("peak_bytes_in_use"),
        "xla_peak_bytes": compiled_memory(step)["peak_bytes"],
        "planner_bytes": estimate_stage(cfg, stage, "gpu")["bytes_total"]})
    row.update(prediction(kernels, gpu, model_flops, stage.tokens_per_step, step_s, device.device_kind))
    if profile_steps:
        cell_dir = os.path.join(out, "profile", f"{row['config']}-stage{stage_index}-{precision}")
        row["profile"] = profile_cell(step, state, batch, kernels, hlo_text, gpu, profile_steps, cell_dir)
        row["category_ratios"] = row["profile"].pop("category_ratios")
    if torch_ref and precision == "bf16":
        # The JAX row first: a reference that runs past the cell's time limit must not take it along
        # (`run_cell` keeps the last JSON line of a cell it had to stop).
        print(json.dumps({**row, "torch_failed": "did not finish"}), flush=True)
        from torch_reference import time_train_step

        del state, step  # the reference gets the device to itself
        try:
            ref = time_train_step(cfg.model, stage.seq_len, row["rows"], lr=cfg.optim.peak_lr, steps=steps,
                                  warmup=warmup, loss_chunk=cfg.train.loss_chunk, compile=device.platform == "gpu")
        except Exception as e:  # e.g. out of memory beside JAX's pool: keep the JAX cell's numbers
            row["torch_failed"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        else:
            row["torch"] = ref
            row["ratio_vs_torch"] = tps / ref["tokens_per_sec"]
    return row


def prediction(kernels, gpu, model_flops: float, tokens: int, step_s: float, device_kind: str) -> dict:
    """The performance model's prediction of the compiled step on `gpu` (with its calibration, if
    perf.CALIBRATION_FILE has one), beside the measured step; None fields (and why) without a GPU."""
    from yxanul_jax.analysis import perf

    if gpu is None:
        return {"predicted_gpu": None, "predicted_step_ms": None, "predicted_tokens_per_s": None,
                "predicted_mfu": None, "measured_over_predicted": None, "predicted_categories": None,
                "prediction": f"none: device {device_kind!r} is not in analysis/gpus.py (--predict-for NAME "
                              "predicts for a named GPU)"}
    p = perf.predict(kernels, gpu, model_flops, tokens, calibration=perf.load_calibration(gpu.key))
    ms = p["predicted_step_ms"]
    return {"predicted_gpu": gpu.key, "predicted_step_ms": ms,
            "predicted_tokens_per_s": p.get("predicted_tokens_per_s"),
            "predicted_mfu": p.get("predicted_mfu"), "measured_over_predicted": step_s * 1e3 / ms if ms else None,
            "predicted_categories": {c: v["ms"] for c, v in p["categories"].items()},
            "prediction": f"analysis/perf.py for {gpu.label}; calibration: {p['calibration']}"}


def traced_ms(trace: str, kernels, hlo_text: str, steps: int) -> tuple[dict, dict[str, float]]:
    """A trace's kernel times (`profile_summary.kernel_times`) and each matched kernel's ms per step."""
    import profile_summary

    times = profile_summary.kernel_times(profile_summary.load_events(trace), [k.name for k in kernels], hlo_text)
    return times, {name: us / 1e3 / steps for name, us in times["us"].items()}


def profile_cell(step, state, batch, kernels, hlo_text: str, gpu, steps: int, out: str) -> dict:
    """Trace `steps` steps, read each HLO instruction's device time per step and compare it per
    category with the uncalibrated prediction (`perf.category_ratios`)."""
    import profile_summary

    from yxanul_jax.analysis import perf

    path, state = profile_summary.trace_steps(step, state, batch, steps, out)
    del state
    times, measured_ms = traced_ms(path, kernels, hlo_text, steps)
    unmatched = sorted(times["unmatched"].items(), key=lambda kv: -kv[1])[:8]
    prof = {"trace": path, "steps": steps, "device_ms_per_step": times["total_us"] / 1e3 / steps,
            "matched_ms_per_step": times["matched_us"] / 1e3 / steps,
            "kernels_matched": len(measured_ms), "kernels": len(kernels),
            "unmatched_top": [{"name": n, "ms_per_step": us / 1e3 / steps} for n, us in unmatched]}
    # Predicted kernels the trace never showed: where the model charges work that does not run.
    with gzip.open(os.path.join(out, "step.hlo.gz"), "wt", encoding="utf-8") as fh:
        fh.write(hlo_text)  # the compiled step, so that a prediction can be re-read without the GPU
    if gpu is not None:
        unseen = sorted(((1e3 * perf.kernel_time(k, gpu)[0] * k.runs, k) for k in kernels if k.name not in measured_ms),
                        key=lambda mk: -mk[0])[:8]
        prof["not_seen_top"] = [{"name": k.name, "category": k.category, "predicted_ms_per_step": ms,
                                 "op_name": k.op_name[-120:]} for ms, k in unseen]
    if gpu is None:
        prof["category_ratios"] = None
        prof["no_ratios"] = "no GPU to predict for (--predict-for NAME)"
        return prof
    prof["category_ratios"] = perf.category_ratios(kernels, gpu, measured_ms)
    return prof


def calibration(rows: list[dict], date: str, device: str) -> dict:
    """OUT/calibration.json: per GPU the measured / predicted ratio of each category over every profiled
    cell, sum of measured ms over sum of the matched kernels' predicted ms (a category the trace
    matched nothing of gets no ratio), in perf.CALIBRATION_FILE's format."""
    groups: dict[str, dict] = {}
    for r in rows:
        if not r.get("category_ratios"):
            continue
        g = groups.setdefault(r["predicted_gpu"], {"cells": [], "categories": {}})
        g["cells"].append(f"{r['config']} stage {r['stage']} {r['precision']}")
        for cat, v in r["category_ratios"].items():
            c = g["categories"].setdefault(cat, {"predicted_ms": 0.0, "matched_predicted_ms": 0.0, "measured_ms": 0.0})
            for key in c:
                c[key] += v[key]
    out = {}
    for key, g in groups.items():
        for c in g["categories"].values():
            ok = c["measured_ms"] > 0 and c["matched_predicted_ms"] > 0
            c["ratio"] = c["measured_ms"] / c["matched_predicted_ms"] if ok else None
        out[key] = {"ratios": {cat: c["ratio"] for cat, c in g["categories"].items() if c["ratio"] is not None},
                    "source": f"scripts/gpu_bench.py --profile, {date}, {device}, cells {'; '.join(g['cells'])}",
                    "categories": g["categories"]}
    return out


def calibration_table(calib: dict, rows: list[dict]) -> str:
    from yxanul_jax.analysis import gpus

    lines = []
    for key, entry in calib.items():
        lines.append(f"calibration for {gpus.GPUS[key].label}: measured / predicted per category ({entry['source']})")
        measured_on = {r["device"] for r in rows if r.get("predicted_gpu") == key and r.get("category_ratios")}
        if any(getattr(gpus.of_device_kind(d), "key", None) != key for d in measured_on):
            lines.append(f"note: measured on {', '.join(sorted(measured_on))}, not on that GPU: these ratios test the "
                         "plumbing, they calibrate nothing")
        width = max([22, *map(len, entry["categories"])])
        lines.append(f"{'category':<{width}}{'predicted ms':>14}{'of it matched':>15}{'measured ms':>13}{'ratio':>8}")
        for cat, c in sorted(entry["categories"].items(), key=lambda kv: -kv[1]["predicted_ms"]):
            ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
            lines.append(f"{cat:<{width}}{c['predicted_ms']:>14.3f}{c['matched_predicted_ms']:>15.3f}"
                         f"{c['measured_ms']:>13.3f}{ratio:>8}")
    return "\n".join(lines)


def write_calibration(calib: dict, rows: list[dict], out: str) -> str:
    """Write OUT/calibration.json; its table and where to copy it, as text."""
    from yxanul_jax.core.rundir import atomic_write

    path = os.path.join(out, "calibration.json")
    atomic_write(path, json.dumps(calib, indent=2) + "\n")
    return (calibration_table(calib, rows) + f"\nwrote {path}; to apply it, copy its "
            f"{' / '.join(repr(k) for k in calib)} entry into yxanul_jax/analysis/perf_calibration.json")


def reread_profile(row: dict, bench_dir: str, date: str = "") -> bool:
    """Recompute a profiled row's `category_ratios` from its kept trace and `step.hlo.gz` (under
    BENCH_DIR/profile/CELL/, as `profile_cell` left them) with today's model; False (the row unchanged)
    where either is missing. A row run before `perf.FUSED_CE_MEASURED_DATE` (its run's `date`) gets no head + loss
    ratio: today's model charges the fused kernels at the rates of the kernels timed that day, not of those it ran."""
    from yxanul_jax.analysis import gpus, perf

    parts = str((row.get("profile") or {}).get("trace", "")).split("/")  # .../CELL/plugins/profile/TS/trace
    if not row.get("category_ratios") or len(parts) < 5 or parts[-4] != "plugins":
        return False
    cell_dir = os.path.join(bench_dir, "profile", parts[-5])
    local = os.path.join(cell_dir, *parts[-4:])
    hlo_path = os.path.join(cell_dir, "step.hlo.gz")
    if not (os.path.exists(local) and os.path.exists(hlo_path)):
        return False
    with gzip.open(hlo_path, "rt", encoding="utf-8") as fh:
        hlo_text = fh.read()
    kernels = perf.kernels(hlo_text)
    _, measured_ms = traced_ms(local, kernels, hlo_text, row["profile"]["steps"])
    ratios = perf.category_ratios(kernels, gpus.GPUS[row["predicted_gpu"]], measured_ms)
    if date < perf.FUSED_CE_MEASURED_DATE:
        for key in ("output head + loss", perf.FUSED_CE_TIMED):
            ratios.pop(key, None)
    row["category_ratios"] = ratios
    return True


def merge_calibration(paths: list[str], out: str) -> int:
    """`--calibrate-from`: OUT/calibration.json from the profiled cells of earlier runs' bench.json files (the
    cells' ratios summed as in one run), with their dates and devices in its `source`. A cell whose trace and
    compiled HLO were kept beside its bench.json is re-read with today's performance model (`reread_profile`),
    so that a corrected model is calibrated against the same measurement. Exit 2 on a missing or
    unreadable file, or when no file has a profiled cell."""
    from yxanul_jax.core.errors import one_line

    rows, dates, devices, reread = [], set(), set(), 0
    for path in paths:
        try:
            record = json.loads(Path(path).read_text())
            rows += record["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: --calibrate-from {path}: not a readable bench.json ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        for row in record["rows"]:
            try:
                reread += reread_profile(row, os.path.dirname(os.path.abspath(path)), record.get("date", ""))
            except Exception as e:  # a truncated trace or HLO kept beside it: name it, change nothing
                print(f"error: --calibrate-from {path}: the kept trace or step.hlo.gz of a profiled cell is not "
                      f"readable ({type(e).__name__}: {one_line(e)}); remove its profile/ folder to use the ratios "
                      "recorded with it", file=sys.stderr)
                return 2
        dates.add(record.get("date", "?"))
        devices.add(record.get("device", "?"))
    try:
        calib = calibration(rows, ", ".join(sorted(dates)), " / ".join(sorted(devices)))
    except (KeyError, TypeError, AttributeError) as e:
        print(f"error: --calibrate-from: a row of {', '.join(paths)} is not a gpu_bench row ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    if not calib:
        print(f"error: --calibrate-from: no profiled cell with a prediction in {', '.join(paths)} (run gpu_bench.py "
              "--profile on a GPU first)", file=sys.stderr)
        return 2
    for entry in calib.values():
        entry["source"] += f"; merged from {len(paths)} runs by --calibrate-from"
        if reread:
            entry["source"] += f", {reread} cells re-read with the model of {datetime.date.today().isoformat()}"
        if reread and (stale := sum(1 for r in rows if r.get("category_ratios")) - reread):
            entry["source"] += f", {stale} with the ratios recorded when they ran"
    os.makedirs(out, exist_ok=True)
    print(write_calibration(calib, rows, out))
    print(json.dumps({"calibration": {k: v["ratios"] for k, v in calib.items()}}))
    return 0


def run_cell(args, config: str, stage: int, precision: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--cell", json.dumps([config, stage, precision]),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--out", os.path.abspath(args.out)]
    cmd += ["--profile", "--profile-steps", str(args.profile_steps)] if args.profile else []
    cmd += ["--torch"] if args.torch else ["--no-torch"]
    cmd += ["--predict-for", args.predict_for] if args.predict_for else []
    cmd += list(args.overrides)
    env = dict(os.environ)
    if args.profile:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {PROFILE_XLA_FLAG}".strip()
    tag = "-" + hashlib.sha1(" ".join(args.overrides).encode()).hexdigest()[:8] if args.overrides else ""
    log = os.path.join(args.out, "logs", f"{Path(config).stem}-stage{stage}-{precision}{tag}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    # The cell's stderr goes to its log as it runs: a cell killed by a time limit on a lent GPU still
    # leaves what it printed.
    with open(log, "w") as err_file:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=str(ROOT), env=env,
                                  timeout=args.cell_timeout)
        except subprocess.TimeoutExpired as e:  # keep what the cell printed (its JAX row before PyTorch)
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            proc = subprocess.CompletedProcess(cmd, -9, out, "")
            timed_out = f"stopped after --cell-timeout {args.cell_timeout} s"
        else:
            timed_out = None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    failed = {"config": config, "stage": stage, "precision": precision, "log": log}
    if timed_out:
        row = json.loads(lines[-1]) if lines else failed
        return {**row, "torch_failed" if "torch_failed" in row else "failed": timed_out}
    if proc.returncode != 0 or not lines:
        err = Path(log).read_text().strip().splitlines() or ["no output"]
        return {**failed, "failed": err[-1], "stderr_tail": err[-25:]}
    return json.loads(lines[-1])


def _gb(b) -> str:
    return "-" if b is None else f"{b / 2**30:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(rows: list[dict]) -> str:
    cols = ["config", "stage", "seq x rows", "precision", "compile s", "step ms", "predicted ms",
            "measured / predicted", "tokens/s", "MFU model", "MFU HLO", "peak GiB", "XLA GiB", "planner GiB",
            "PyTorch tokens/s", "ours / PyTorch"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["config"], str(r["stage"]), f"{r.get('seq_len', '?')} x {r.get('rows', '?')}", r["precision"]]
        if "skipped" in r or "failed" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['failed']}"
            lines.append("| " + " | ".join(cells + [why] + [""] * (len(cols) - 5)) + " |")
            continue
        torch_tps = r["torch"]["tokens_per_sec"] if r.get("torch") else None
        pred, ratio = r.get("predicted_step_ms"), r.get("measured_over_predicted")
        cells += [f"{r['compile_s']:.1f}", f"{1e3 * r['step_s']:.1f}", "-" if pred is None else f"{pred:.1f}",
                  "-" if ratio is None else f"{ratio:.2f}", f"{r['tokens_per_sec']:,.0f}",
                  _pct(r["mfu_model"]), _pct(r["mfu_hlo"]), _gb(r["peak_bytes"]), _gb(r["xla_peak_bytes"]),
                  _gb(r["planner_bytes"]), "-" if torch_tps is None else f"{torch_tps:,.0f}",
                  "-" if "ratio_vs_torch" not in r else f"{r['ratio_vs_torch']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stages_out_of_range(config: str, overrides: list[str], stages: list[int]) -> str | None:
    """The one-line error for a config that does not load or --stages beyond its curriculum, before any cell
    runs; None when every stage is there."""
    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.errors import UserError, one_line

    try:
        n = len(load_config(config, list(overrides or [])).curriculum)
    except UserError as e:
        return f"error: {one_line(e)}"
    bad = [s for s in stages if not 0 <= s < n]
    if bad:
        return (f"error: --stages {' '.join(map(str, bad))}: {config} has {n} curriculum stages, 0-{n - 1}; "
                f"pick --stages among them")
    return None


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
    p.add_argument("--predict-for", default=None, metavar="GPU",
                   help="predict for this GPU of analysis/gpus.py (default: the device's own, if it is in the table)")
    p.add_argument("--profile", action="store_true",
                   help="profile each cell after its timed steps; write OUT/calibration.json (measured / predicted)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps each --profile trace covers")
    p.add_argument("--out", default="bench", help="folder for bench.json, bench.md (and calibration.json, profile/)")
    p.add_argument("--cell-timeout", type=float, default=None, metavar="S",
                   help="stop a cell after S seconds, keeping its JAX row if it printed one (its PyTorch reference "
                        "runs last)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides for every cell (before the options, or after one that takes one value)")
    p.add_argument("--calibrate-from", nargs="+", default=None, metavar="BENCH_JSON",
                   help="run nothing: merge the profiled cells of these bench.json files (one GPU's, from several "
                        "calls) into OUT/calibration.json")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: one cell, one JSON line
    args = p.parse_args(argv)
    if args.calibrate_from:
        return merge_calibration(args.calibrate_from, args.out)
    from yxanul_jax.analysis import gpus

    if args.predict_for and gpus.lookup(args.predict_for) is None:
        close = gpus.closest(args.predict_for)
        p.error(f"--predict-for: no GPU named {args.predict_for!r} in analysis/gpus.py"
                + (f" (did you mean {close}?)" if close else f"; known: {', '.join(gpus.names())}"))
    if args.profile_steps < 1:
        p.error("--profile-steps must be at least 1")
    if args.cell:
        config, stage, precision = json.loads(args.cell)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        print(json.dumps(bench_cell(config, stage, precision, args.steps, args.warmup, bool(args.torch),
                                    args.predict_for, args.profile_steps if args.profile else 0, args.out,
                                    args.overrides)))
        return 0
    if args.torch is None:
        import importlib.util

        args.torch = importlib.util.find_spec("torch") is not None and _has_cuda()
    if (bad := stages_out_of_range(args.config, args.overrides, args.stages)) is not None:
        print(bad, file=sys.stderr)
        return 2
    cells = [(args.config, s, prec) for s in args.stages for prec in args.precisions]
    if args.baseline:
        cells += [(args.baseline, 0, prec) for prec in args.precisions]
    rows = []
    for config, stage, precision in cells:
        row = run_cell(args, config, stage, precision)
        rows.append(row)
        status = row.get("skipped") or row.get("failed") or f"{row['tokens_per_sec']:,.0f} tokens/s"
        if row.get("predicted_step_ms"):
            status += f", {1e3 * row['step_s']:.1f} ms measured / {row['predicted_step_ms']:.1f} ms predicted"
        print(f"{row['config']} stage {stage} {precision}: {status}", flush=True)
        if row.get("stderr_tail"):
            print("  " + "\n  ".join(row["stderr_tail"][-12:]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    date, device = time.strftime("%Y-%m-%d"), _device_name()
    predicted = sorted({r["prediction"] for r in rows if r.get("predicted_step_ms")})
    md = (f"Benchmark {date} on {platform.node()} ({device}); {args.steps} timed steps after {args.warmup} "
          f"warm-up, median. Predicted: {' / '.join(predicted) or 'none (no GPU to predict for)'}. MFU HLO: HLO "
          "FLOPs with loop trip counts (remat recompute included).\n\n" + table(rows))
    record = {"rows": rows, "date": date, "machine": platform.platform(), "device": device, "steps": args.steps,
              "warmup": args.warmup}
    from yxanul_jax.core.rundir import write_report

    calib_text = ""
    if args.profile:
        calib = calibration(rows, date, device)
        record["calibration"] = calib
        if calib:
            calib_text = write_calibration(calib, rows, args.out) + "\n"
        else:
            calib_text = "no calibration: no profiled cell had a GPU to predict for (--predict-for NAME)\n"
        md += "\n```\n" + calib_text + "```\n"
    write_report(args.out, "bench", record, md)
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
