"""Fit the memory planner's coefficients (`memory.Calibration`) to XLA's own memory analysis.

    # 1. compile a set of variants and record XLA's peak (CPU, or an H100 with no GPU: gpu-check venv)
    .venv-gpu-check/bin/python scripts/fit_plan.py collect --target h100 --out fit_gpu.jsonl
    python scripts/fit_plan.py collect --out fit_cpu.jsonl
    .venv-gpu-check/bin/python scripts/fit_plan.py collect --target h100 --only model.n_layers=8 --out more.jsonl
    # 2. fit the coefficients of one platform and print them with the per-row errors (needs scipy)
    python scripts/fit_plan.py fit fit_gpu.jsonl --platform gpu

The last sm_90 collection (61 rows, 2026-11-29, jax 0.10.2, 2-core CPU box, ~30 minutes; the rows are
docs/bench/fit_plan_sm90_2026-11-29.jsonl) set `memory.GPU_CALIBRATION`: `fit` of those rows with `--start
docs/bench/fit_plan_sm90_start_2026-11-29.json` gives it (a fit is local: from other coefficients it can end
elsewhere with similar errors). Each variant is compiled exactly as training compiles it
(`stages.compile_stage`: abstract shapes, donated state); the peak is arguments + outputs - aliased +
temporaries. The fit minimizes a robust (soft-L1) loss of the relative error of `memory.estimate_stage`
over all rows, starting from the platform's current coefficients (or `--start`). Prints a table and, last,
one JSON line with the coefficients.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

NARROW_576 = ["model.d_model=576", "model.ffn_dim=1536", "model.n_heads=9", "model.n_kv_heads=1",
              "model.embed_rank=96", "train.loss_chunk=256"]  # the GTX 1650 suggestion's model (2026-11-29)
NARROW_576_S7 = ["curriculum.7.batch_size=8", "curriculum.7.grad_accum_steps=32"]  # ... and its stage 7
VARIANTS = [  # (config, stages, overrides): shapes, remat, FP8, dtype, heads, accumulation, loss chunks
    ("configs/tiny.yaml", [0, 1], []),
    ("configs/tiny.yaml", [0, 1], ["model.remat=full"]),
    ("configs/tiny.yaml", [0, 1], ["model.remat=dots"]),
    ("configs/tiny.yaml", [1], ["fp8.enabled=false"]),
    ("configs/tiny.yaml", [1], ["model.dtype=float32"]),
    ("configs/tiny.yaml", [1], ["model.scan_layers=true", "model.remat=full", "curriculum.1.grad_accum_steps=4"]),
    ("configs/tiny.yaml", [1], ["model.d_model=256", "model.ffn_dim=768", "model.n_heads=8", "curriculum.1.batch_size=64"]),
    ("configs/tiny.yaml", [1], ["model.head=untied", "train.loss_chunk=512"]),
    ("configs/pythia_70m_capped.yaml", [0], []),
    ("configs/pythia_70m_capped.yaml", [0], ["model.remat=full"]),
    ("configs/pythia_70m_capped.yaml", [0], ["fp8.enabled=false"]),
    # the 197m config with its loop over the layers, as fitted (scan_unroll: 28 runs none on CPU whatever remat)
    ("configs/yxanul_197m.yaml", [0, 1, 2, 4, 6, 7, 9], ["model.scan_unroll=1"]),
    ("configs/yxanul_197m.yaml", [4, 9], ["model.scan_unroll=1", "fp8.enabled=false"]),
    ("configs/yxanul_197m.yaml", [5], ["model.scan_unroll=1", "fp8.targets=[q,k,v,o,gate,up,down,head]"]),
    ("configs/yxanul_197m.yaml", [3], ["model.scan_unroll=1", "model.remat=dots"]),
    ("configs/yxanul_197m.yaml", [0, 9], ["model.scan_unroll=1", "model.remat=none"]),
    ("configs/yxanul_197m_baseline.yaml", [0], []),
    ("configs/yxanul_270m.yaml", [0, 2, 5], []),
    # the configs' own path: the layers without a loop (scan_unroll = n_layers), the policies `auto` offers there
    # (none whole and split, attention, full; not each at every depth), at 8, 14 and 28 layers so that per-layer and
    # fixed terms separate
    ("configs/yxanul_197m.yaml", [0, 4, 9], []),
    ("configs/yxanul_197m.yaml", [0, 9], ["model.remat=full"]),
    ("configs/yxanul_197m.yaml", [9], ["model.remat=attention"]),
    ("configs/yxanul_197m.yaml", [9], ["model.remat=none", "train.micro_split=4"]),
    ("configs/yxanul_197m.yaml", [0, 9], ["fp8.enabled=false"]),
    ("configs/yxanul_197m.yaml", [0, 9], ["model.n_layers=8", "model.scan_unroll=8", "model.remat=full"]),
    ("configs/yxanul_197m.yaml", [0], ["model.n_layers=8", "model.scan_unroll=8"]),
    ("configs/yxanul_197m.yaml", [0], ["model.n_layers=8", "model.scan_unroll=8", "fp8.enabled=false"]),
    ("configs/yxanul_197m.yaml", [9], ["model.n_layers=8", "model.scan_unroll=8", "model.remat=none",
                                       "train.micro_split=2"]),
    ("configs/yxanul_197m.yaml", [9], ["model.n_layers=8", "model.scan_unroll=8", "model.remat=attention"]),
    ("configs/yxanul_197m.yaml", [0, 9], ["model.n_layers=14", "model.scan_unroll=14", "model.remat=full"]),
    ("configs/yxanul_197m.yaml", [0], ["model.n_layers=14", "model.scan_unroll=14", "model.remat=none"]),
    # large micro-batches under `full` (the planner's max_batch_size searches there)
    ("configs/yxanul_197m.yaml", [9], ["model.scan_unroll=1", "model.remat=full", "curriculum.9.batch_size=256"]),
    ("configs/yxanul_197m.yaml", [9], ["model.remat=full", "curriculum.9.batch_size=192"]),
    ("configs/yxanul_270m.yaml", [0, 5], ["model.remat=full"]),
    # XLA's attention (its H x L x L scores: Calibration.t_S) at 128 and 2,048 tokens, in a loop and without one
    ("configs/yxanul_197m.yaml", [4, 9], ["model.scan_unroll=1", "model.remat=full", "model.attention=xla"]),
    ("configs/yxanul_197m.yaml", [4, 9], ["model.n_layers=8", "model.scan_unroll=8", "model.remat=full",
                                          "model.attention=xla"]),
    # small micro-batches of narrow models, where the state outweighs the activations: `plan --gpu gtx1650`'s
    # suggestions for the 197m (28 x 576 and 28 x 640, small loss chunks, accumulation)
    ("configs/yxanul_197m.yaml", [0, 7], [*NARROW_576, "model.remat=full", "curriculum.0.batch_size=1024",
                                          "curriculum.0.grad_accum_steps=8", *NARROW_576_S7]),
    ("configs/yxanul_197m.yaml", [7], [*NARROW_576, "model.remat=attention", *NARROW_576_S7]),
    ("configs/yxanul_197m.yaml", [1], ["model.d_model=640", "model.ffn_dim=1728", "model.n_heads=10",
                                       "model.embed_rank=112", "train.loss_chunk=256", "model.remat=full",
                                       "curriculum.1.batch_size=128", "curriculum.1.grad_accum_steps=64"]),
]


def selected(only: list[str]) -> list[tuple[str, list[int], list[str]]]:
    """The variants holding every token of `only` (a config path, or one of its overrides, exactly)."""
    return [v for v in VARIANTS if all(t == v[0] or t in v[2] for t in only)]


def collect(args) -> None:
    import jax

    from yxanul_jax.analysis import memory
    from yxanul_jax.analysis.gpu_target import gpu_config
    from yxanul_jax.core.coerce import to_dict
    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.stages import compile_stage, compiled_memory

    variants = selected(args.only)
    if not variants:
        raise SystemExit(f"no variant holds all of {args.only}: give a config path or an override exactly as "
                         "VARIANTS lists it")
    device = None
    if args.target:
        from yxanul_jax.analysis.gpu_target import compile_device
        device = compile_device(args.target)
    platform = "gpu" if device is not None else jax.devices()[0].platform
    with open(args.out, "w", encoding="utf-8") as fh:
        for path, stages, overrides in variants:
            cfg = load_config(path, overrides)
            for i in stages:
                start = time.perf_counter()
                # resolve attention=auto as the GPU would for this stage's sequence length, remat=auto for the device
                stage_cfg = gpu_config(cfg, cfg.curriculum[i].seq_len) if device is not None else cfg
                stage_cfg = memory.with_stage_remat(stage_cfg, stage_cfg.curriculum[i], device)
                mem = compiled_memory(compile_stage(stage_cfg, stage_cfg.curriculum[i], device=device))
                peak = mem["peak_bytes"]
                row = {"config": path, "stage": i, "overrides": overrides, "platform": platform,
                       "target": args.target, "peak_bytes": peak, "temp_bytes": mem["temp_bytes"],
                       "cfg": to_dict(stage_cfg), "compile_s": round(time.perf_counter() - start, 1)}
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                print(f"{path:<36}{i:>3} {' '.join(overrides):<70}{peak / 1e9:>9.3f} GB {row['compile_s']:>6} s",
                      flush=True)


def _load(path: str):
    from yxanul_jax.core.config import from_saved

    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return [(r, from_saved(r["cfg"])) for r in rows]  # rows of before Muon were AdamW's (config.SAVED_WITHOUT)


def fit(args) -> None:
    import numpy as np
    try:
        from scipy.optimize import least_squares
    except ImportError:
        raise SystemExit("the fit needs scipy: pip install scipy")

    from yxanul_jax.analysis import memory

    rows = _load(args.rows)
    base = memory.GPU_CALIBRATION if args.platform == "gpu" else memory.CALIBRATION
    if args.start:  # a fit is local: the same rows from other coefficients can end elsewhere
        with open(args.start, encoding="utf-8") as fh:
            start = json.load(fh)
        base = dataclasses.replace(base, **start.get("calibration", start))
    names = [f.name for f in dataclasses.fields(base) if f.name not in args.fixed]

    def errors(x):
        cal = dataclasses.replace(base, **dict(zip(names, x)))
        return np.array([memory.estimate_stage(cfg, cfg.curriculum[r["stage"]], args.platform, cal=cal)["bytes_total"]
                         / r["peak_bytes"] - 1.0 for r, cfg in rows])

    x0 = np.array([getattr(base, n) for n in names])
    res = least_squares(errors, x0, loss="soft_l1", f_scale=0.05, bounds=(0.0, np.inf))
    fitted = dataclasses.replace(base, **{n: round(float(v), 3) for n, v in zip(names, res.x)})
    before, after = errors(x0), errors(np.array([getattr(fitted, n) for n in names]))  # after: as rounded
    print(f"{'config':<34}{'stage':>6} {'overrides':<60}{'XLA GB':>9}{'before':>9}{'after':>9}")
    for (r, _), b, a in zip(rows, before, after):
        print(f"{r['config'].split('/')[-1]:<34}{r['stage']:>6} {' '.join(r['overrides'])[:60]:<60}"
              f"{r['peak_bytes'] / 1e9:>9.3f}{100 * b:>+8.1f}%{100 * a:>+8.1f}%")
    rms = lambda e: 100 * np.sqrt(np.mean(e ** 2))  # noqa: E731
    print(f"largest |error| before {100 * np.abs(before).max():.1f} % (RMS {rms(before):.1f} %), after "
          f"{100 * np.abs(after).max():.1f} % (RMS {rms(after):.1f} %) over {len(rows)} rows")
    print(json.dumps({"platform": args.platform, "calibration": dataclasses.asdict(fitted),
                      "max_abs_error": round(float(np.abs(after).max()), 4)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="compile the variants and record XLA's peak")
    c.add_argument("--target", default=None, help="h100 / h200: compile for that GPU (gpu-check venv)")
    c.add_argument("--out", required=True)
    c.add_argument("--only", action="append", default=[], metavar="TOKEN",
                   help="only the variants with this config path or this override, exactly (repeatable: all of them)")
    f = sub.add_parser("fit", help="fit the coefficients to recorded rows")
    f.add_argument("rows")
    f.add_argument("--platform", choices=["gpu", "cpu"], required=True)
    f.add_argument("--fixed", action="append", default=["cpu_scan_none"], help="coefficients kept as they are")
    f.add_argument("--start", default=None, metavar="JSON",
                   help="coefficients to start from (a fit's last line, or a {name: value} object; default: the "
                        "platform's current ones)")
    args = p.parse_args()
    collect(args) if args.cmd == "collect" else fit(args)


if __name__ == "__main__":
    main()
