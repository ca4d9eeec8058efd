"""Predicted step time of every curriculum stage on a GPU, FP8 and BF16, by category: no GPU needed.

    .venv-gpu-check/bin/python scripts/predict_stages.py [--configs configs/yxanul_197m.yaml ...]
        [--target h100] [--stages 0 9] [--precisions fp8 bf16] [--out predicted] [key=value ...]

Each (config, stage, precision) is compiled for the target without one (`analyze --target`, the
gpu-check environment) and run through the performance model (`yxanul_jax.analysis.perf`). Prints
a table (step ms, tokens/s, MFU, and each category's share), writes OUT/predicted.md and
OUT/predicted.json, and ends with one JSON line. These are predictions from the optimized HLO and the
GPU's spec sheet, not measurements: docs/BENCHMARKS.md quotes them as such, with the date.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHORT = {"attention": "attn", "GEMM fp8": "fp8 GEMM", "GEMM bf16": "bf16 GEMM", "GEMM f32": "f32 GEMM",
         "output head + loss": "head+loss", "norms + elementwise": "elementwise", "FP8 scaling": "fp8 scale",
         "optimizer": "optim", "copies": "copies", "collectives": "collect."}


def predict_cell(config: str, stage: int, precision: str, target: str, overrides: list[str]) -> dict:
    from yxanul_jax.analyze import inspect_stage
    from yxanul_jax.core.config import load_config

    cfg = load_config(config, overrides)
    if precision == "bf16":
        cfg = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    r = inspect_stage(cfg, stage, None, target)
    p = r["prediction"]
    return {"config": cfg.model.name, "stage": stage, "precision": precision, "seq_len": r["seq_len"],
            "rows": r["batch_size"] * r["grad_accum_steps"], "step_ms": p["predicted_step_ms"],
            "tokens_per_s": p["predicted_tokens_per_s"], "mfu": p["predicted_mfu"], "hlo_flops": p["hlo_flops"],
            "model_flops": p["model_flops"], "categories": {k: v["ms"] for k, v in p["categories"].items()},
            "xla_peak_bytes": r["memory"]["peak_bytes"], "attention": r["attention"], "remat": r["remat"],
            "micro_split": r["micro_split"],
            "calibration": p["calibration"]}


def table(rows: list[dict]) -> str:
    cats = [c for c in SHORT if any(c in r["categories"] for r in rows)]
    cols = ["config", "stage", "seq x rows", "precision", "step ms", "tokens/s", "MFU"] + [SHORT[c] for c in cats]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        share = lambda c: f"{100 * r['categories'].get(c, 0.0) / r['step_ms']:.0f}%"  # noqa: E731
        lines.append("| " + " | ".join([r["config"], str(r["stage"]), f"{r['seq_len']} x {r['rows']}", r["precision"],
                                        f"{r['step_ms']:.0f}", f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}%"]
                                       + [share(c) for c in cats]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=["configs/yxanul_197m.yaml", "configs/yxanul_270m.yaml"])
    p.add_argument("--target", default="h100")
    p.add_argument("--stages", type=int, nargs="*", default=None, help="default: every stage of each config")
    p.add_argument("--precisions", nargs="+", default=["fp8", "bf16"], choices=["fp8", "bf16"])
    p.add_argument("--out", default="predicted")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.rundir import write_report

    rows = []
    for config in args.configs:
        n = len(load_config(config, args.overrides).curriculum)
        for stage in (args.stages if args.stages is not None else range(n)):
            for precision in args.precisions:
                t0 = time.perf_counter()
                row = predict_cell(config, stage, precision, args.target, args.overrides)
                rows.append(row)
                print(f"{row['config']} stage {stage} {precision}: {row['step_ms']:.0f} ms, MFU {100 * row['mfu']:.1f} % "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    header = (f"Predicted on {args.target} by `scripts/predict_stages.py` ({time.strftime('%Y-%m-%d')}, "
              f"deviceless sm_90 compile on {platform.node()}; calibration: {rows[0]['calibration'] if rows else '-'}). "
              "Category columns: share of the predicted step.\n\n")
    md = header + table(rows)
    record = {"rows": rows, "target": args.target, "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
              "overrides": args.overrides}
    write_report(args.out, "predicted", record, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
