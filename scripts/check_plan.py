"""The memory planner next to XLA's own memory analysis of the same compiled train steps.

Each (config, stage) is compiled ahead of time exactly as training compiles it (abstract shapes,
donated state, nothing allocated), and XLA's peak (arguments + outputs - aliased + temporaries)
is printed beside `memory.estimate_stage`: the CPU-AOT compile beside the planner's `cpu`
calibration (the `gpu` one on a GPU machine), and with `--target h100` also the sm_90 compile
(deviceless, in the gpu-check venv) beside the planner's `gpu` estimate, the one `plan` uses.
Prints a table and a final JSON line.

    python scripts/check_plan.py                                   # the default set (a few minutes)
    .venv-gpu-check/bin/python scripts/check_plan.py --target h100 # and the sm_90 column
    python scripts/check_plan.py --config configs/tiny.yaml:0,1 --config configs/yxanul_197m.yaml:0 [key=value ...]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform as host
import time

import jax

from yxanul_jax.analysis.gpu_target import gpu_config
from yxanul_jax.analysis.memory import estimate_stage, remat_label, with_stage_remat
from yxanul_jax.core.config import load_config
from yxanul_jax.training.stages import compile_stage, compiled_memory

DEFAULT = ["configs/tiny.yaml", "configs/pythia_70m_capped.yaml", "configs/yxanul_197m.yaml:0,4,9",
           "configs/yxanul_270m.yaml:0,5"]
GB = 1e9


def compiled_peak(cfg, stage, device=None) -> dict:
    start = time.perf_counter()
    out = compiled_memory(compile_stage(cfg, stage, device=device))
    return {**out, "compile_seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", metavar="FILE[:STAGES]",
                   help="config and optional comma-separated stages (default: all stages); repeatable")
    p.add_argument("--target", default=None, help="also compile for this GPU (h100, h200) without one")
    p.add_argument("overrides", nargs="*", help="key=value overrides applied to every config")
    args = p.parse_args()
    device = None
    if args.target:  # before anything starts JAX's backends
        from yxanul_jax.analysis.gpu_target import compile_device
        device = compile_device(args.target)
    plat = jax.devices()[0].platform
    flavor = "cpu" if plat == "cpu" else "gpu"
    rows = []
    gpu_head = f"{'sm_90 peak':>11}{'gpu plan':>9}{'error':>8}" if device is not None else ""
    print(f"{'config':<24}{'stage':>6}{'seq':>6}{'batch':>7}{'accum':>6}{'remat':>10}"
          f"{plat + ' peak':>11}{flavor + ' plan':>9}{'error':>8}{gpu_head}{'compile s':>10}")
    for spec in args.config or DEFAULT:
        path, _, which = spec.partition(":")
        cfg = load_config(path, args.overrides)
        indices = [int(i) for i in which.split(",")] if which else range(len(cfg.curriculum))
        for i in indices:
            stage = cfg.curriculum[i]
            here = with_stage_remat(cfg, stage)  # `remat: auto` as this machine's step runs it
            xla = compiled_peak(here, stage)
            est = estimate_stage(here, stage, platform=flavor)
            err = (est["bytes_total"] - xla["peak_bytes"]) / xla["peak_bytes"]
            row = {"config": path, "stage": i, "seq_len": stage.seq_len, "batch_size": stage.batch_size,
                   "grad_accum_steps": stage.grad_accum_steps, "remat": here.model.remat,
                   "micro_split": here.train.micro_split,
                   "scan_layers": cfg.model.scan_layers, "fp8": cfg.fp8.active, **xla,
                   "plan_bytes": est["bytes_total"], "plan_phase": est["phase"], "error": round(err, 4)}
            gpu_cols = ""
            if device is not None:
                on_gpu = with_stage_remat(gpu_config(cfg, stage.seq_len), stage, device)
                g = compiled_peak(on_gpu, stage, device)
                g_est = estimate_stage(on_gpu, stage, platform="gpu")["bytes_total"]
                row["gpu_remat"], row["gpu_micro_split"] = on_gpu.model.remat, on_gpu.train.micro_split
                g_err = (g_est - g["peak_bytes"]) / g["peak_bytes"]
                row["gpu"] = {**g, "target": args.target, "plan_bytes": g_est, "error": round(g_err, 4)}
                gpu_cols = f"{g['peak_bytes'] / GB:>11.3f}{g_est / GB:>9.3f}{100 * g_err:>+7.1f}%"
            rows.append(row)
            print(f"{path.split('/')[-1]:<24}{i:>6}{stage.seq_len:>6}{stage.batch_size:>7}{stage.grad_accum_steps:>6}"
                  f"{remat_label(here.model.remat, here.train.micro_split):>10}{xla['peak_bytes'] / GB:>11.3f}{est['bytes_total'] / GB:>9.3f}"
                  f"{100 * err:>+7.1f}%{gpu_cols}{xla['compile_seconds']:>10}", flush=True)
    worst = max(abs(r["error"]) for r in rows)
    worst_gpu = max((abs(r["gpu"]["error"]) for r in rows if "gpu" in r), default=None)
    print(f"largest |error| {100 * worst:.1f} % ({plat} compile vs '{flavor}' plan)"
          + (f", {100 * worst_gpu:.1f} % (sm_90 compile for {args.target} vs 'gpu' plan)" if worst_gpu is not None
             else "") + f" over {len(rows)} stages; jax {jax.__version__}, {host.machine()}, {datetime.date.today()}")
    print(json.dumps({"platform": flavor, "backend": plat, "target": args.target, "jax": jax.__version__,
                      "rows": rows, "max_abs_error": round(worst, 4),
                      "max_abs_error_gpu": None if worst_gpu is None else round(worst_gpu, 4)}))


if __name__ == "__main__":
    main()
