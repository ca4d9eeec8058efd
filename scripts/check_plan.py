"""The memory planner next to XLA's own memory analysis of the same compiled train steps.

Each (config, stage) is compiled ahead of time exactly as training compiles it (abstract shapes,
donated state, nothing allocated), and XLA's peak (arguments + outputs - aliased + temporaries)
is printed beside `memory.estimate_stage` for the platform the compile ran on (the planner's `cpu`
calibration on a CPU machine, its `gpu` model on a GPU). Prints a table and a final JSON line.

    python scripts/check_plan.py                                   # the default set (a few minutes)
    python scripts/check_plan.py --config configs/tiny.yaml:0,1 --config configs/yxanul_197m.yaml:0 [key=value ...]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform as host
import time

import jax

from yxanul_jax.config import load_config
from yxanul_jax.memory import estimate_stage
from yxanul_jax.stages import compile_stage

DEFAULT = ["configs/tiny.yaml", "configs/pythia_70m_capped.yaml", "configs/yxanul_197m.yaml:0,1,4,7,9",
           "configs/yxanul_270m.yaml:0,3"]
GB = 1e9


def compiled_peak(cfg, stage) -> dict:
    start = time.perf_counter()
    mem = compile_stage(cfg, stage).memory_analysis()
    out = {"argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
           "alias_bytes": mem.alias_size_in_bytes, "temp_bytes": mem.temp_size_in_bytes,
           "compile_seconds": round(time.perf_counter() - start, 1)}
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", metavar="FILE[:STAGES]",
                   help="config and optional comma-separated stages (default: all stages); repeatable")
    p.add_argument("overrides", nargs="*", help="key=value overrides applied to every config")
    args = p.parse_args()
    plat = jax.devices()[0].platform
    flavor = "cpu" if plat == "cpu" else "gpu"
    rows = []
    print(f"{'config':<28}{'stage':>6}{'seq':>6}{'batch':>7}{'accum':>6}{'remat':>6}"
          f"{'XLA temp GB':>12}{'XLA peak GB':>12}{'plan GB':>9}{'error':>8}{'phase':>7}{'compile s':>10}")
    for spec in args.config or DEFAULT:
        path, _, which = spec.partition(":")
        cfg = load_config(path, args.overrides)
        indices = [int(i) for i in which.split(",")] if which else range(len(cfg.curriculum))
        for i in indices:
            stage = cfg.curriculum[i]
            xla = compiled_peak(cfg, stage)
            est = estimate_stage(cfg, stage, platform=flavor)
            err = (est["bytes_total"] - xla["peak_bytes"]) / xla["peak_bytes"]
            rows.append({"config": path, "stage": i, "seq_len": stage.seq_len, "batch_size": stage.batch_size,
                         "grad_accum_steps": stage.grad_accum_steps, "remat": cfg.model.remat,
                         "scan_layers": cfg.model.scan_layers, "fp8": cfg.fp8.active, **xla,
                         "plan_bytes": est["bytes_total"], "plan_phase": est["phase"], "error": round(err, 4)})
            print(f"{path.split('/')[-1]:<28}{i:>6}{stage.seq_len:>6}{stage.batch_size:>7}{stage.grad_accum_steps:>6}"
                  f"{cfg.model.remat:>6}{xla['temp_bytes'] / GB:>12.3f}{xla['peak_bytes'] / GB:>12.3f}"
                  f"{est['bytes_total'] / GB:>9.3f}{100 * err:>+7.1f}%{est['phase']:>7}{xla['compile_seconds']:>10}",
                  flush=True)
    worst = max(abs(r["error"]) for r in rows)
    print(f"largest |error| {100 * worst:.1f} % over {len(rows)} compiled stages; planner platform '{flavor}', "
          f"XLA backend {plat}, jax {jax.__version__}, {host.machine()}, {datetime.date.today()}")
    print(json.dumps({"platform": flavor, "backend": plat, "jax": jax.__version__, "rows": rows,
                      "max_abs_error": round(worst, 4)}))


if __name__ == "__main__":
    main()
