"""A learning study: arms that differ in one thing, N seeds each, on one dataset and one held-out eval set.

    python scripts/study.py --out DIR [--config F] [--set KEY=VALUE ...] [--seeds 0 1 2]
        --arm NAME [KEY=VALUE ...] --arm NAME [KEY=VALUE ...] ... [--target-loss X]

Every run is `fit(cfg)` (in this process, one after another) of the config with the common `--set`
overrides, then the arm's overrides, then `train.seed` and `data.shuffle_seed` = the seed. Validation
uses one fixed `eval.seq_len` (default 128) on the dataset's val split, so every arm is measured on
the same tokens. Example, FP8 against BF16 and a curriculum against one stage at equal tokens:

    python scripts/study.py --out study --set data.train=DATA train.steps=300 \
        --arm fp8 --arm bf16 fp8.enabled=false \
        --arm one-stage 'curriculum=[{start_step: 0, seq_len: 128, batch_size: 16}]'

Writes into --out: `runs/ARM/seedS/` (ordinary run directories), `study.json`, `study.md` (final
validation loss per arm and seed, mean and spread, tokens to reach the target loss, and each arm's
ratio to the first arm), `study.png` (validation loss against tokens, one color per arm), and prints
the table and one JSON line. A finished run is reused when the study is run again (the run
directory's own resume logic), so an interrupted study picks up where it stopped.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from yxanul_jax.core.config import load_config  # noqa: E402
from yxanul_jax.core.args import cli_entry  # noqa: E402
from yxanul_jax.core.errors import UserError  # noqa: E402
from yxanul_jax.core.rundir import write_report  # noqa: E402
from yxanul_jax.plot import plot_runs, read_metrics, series  # noqa: E402
from yxanul_jax.training.loop import fit  # noqa: E402

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def tokens_to(xs: list[float], ys: list[float], target: float) -> float | None:
    """Tokens at which validation loss first reaches `target` (linear between points); None if never."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y)
    return None


def summarize(results: dict[str, dict[int, list[dict]]], target: float | None) -> dict:
    """Per arm: final loss per seed, mean, spread (sample std), tokens to target per seed and mean; and, paired
    by seed, the fraction of the first arm's tokens at which the arm reached the first arm's final loss of that
    seed (`paired_tokens_ratio`: "reaches AdamW's loss in 0.5x the tokens"; None where it never did)."""
    curves = {arm: {s: series(rows, "val/mean/loss") for s, rows in seeds.items()} for arm, seeds in results.items()}
    finals = {arm: {s: ys[-1] for s, (_, ys) in seeds.items()} for arm, seeds in curves.items()}
    first_arm = next(iter(results))
    if target is None:  # the highest final loss of any run: every run reaches it, so all compare
        target = max(v for f in finals.values() for v in f.values())
    out = {"target_loss": round(target, 4), "arms": {}}
    for arm, seeds in curves.items():
        reach = {s: tokens_to(*curve, target) for s, curve in seeds.items()}
        known = [v for v in reach.values() if v is not None]
        values = list(finals[arm].values())
        out["arms"][arm] = {
            "final": {str(s): round(v, 4) for s, v in finals[arm].items()},
            "mean": round(statistics.mean(values), 4),
            "spread": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "tokens_to_target": {str(s): None if v is None else round(v) for s, v in reach.items()},
            "mean_tokens_to_target": round(statistics.mean(known)) if len(known) == len(reach) else None,
            "paired_tokens_ratio": {str(s): _ratio(tokens_to(*curve, finals[first_arm][s]), curves[first_arm][s][0][-1])
                                    for s, curve in seeds.items()}}
    first = next(iter(out["arms"].values()))
    for arm in out["arms"].values():
        a, b = arm["mean_tokens_to_target"], first["mean_tokens_to_target"]
        arm["tokens_ratio"] = round(a / b, 3) if a and b else None
        arm["mean_delta"] = round(arm["mean"] - first["mean"], 4)
        arm["mean_delta_pct"] = round(100 * (arm["mean"] / first["mean"] - 1), 2)
    return out


def _ratio(tokens: float | None, of: float) -> float | None:
    return None if tokens is None else round(tokens / of, 3)


def markdown(summary: dict, seeds: list[int], header: str) -> str:
    arms = summary["arms"]
    lines = [header, "",
             "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | spread | vs first | "
             f"tokens to {summary['target_loss']} | ratio | tokens to the first arm's loss, per seed |",
             "|---" * (len(seeds) + 7) + "|"]
    for name, a in arms.items():
        reach = a["mean_tokens_to_target"]
        paired = " / ".join("-" if (r := a["paired_tokens_ratio"][str(s)]) is None else f"{r:.2f}x" for s in seeds)
        lines.append(f"| {name} | " + " | ".join(f"{a['final'][str(s)]:.4f}" for s in seeds)
                     + f" | {a['mean']:.4f} | {a['spread']:.4f} | {a['mean_delta']:+.4f} ({a['mean_delta_pct']:+.2f} %) | "
                     + (f"{reach:,}" if reach else "not reached by every seed")
                     + f" | {a['tokens_ratio'] if a['tokens_ratio'] else '-'} | {paired} |")
    return "\n".join(lines) + "\n"


def parse_arms(raw: list[list[str]]) -> dict[str, list[str]]:
    arms: dict[str, list[str]] = {}
    for name, *overrides in raw:
        if "=" in name:
            raise UserError(f"--arm '{name}': an arm starts with its name, then KEY=VALUE overrides")
        if name in arms:
            raise UserError(f"--arm '{name}' is given twice; arm names must differ")
        arms[name] = overrides
    if len(arms) < 1:
        raise UserError("give at least one --arm NAME [KEY=VALUE ...]")
    return arms


@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="study folder (runs, table, plot)")
    p.add_argument("--config", default=None, help="YAML config the arms share (default: the built-in one)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides every arm shares")
    p.add_argument("--arm", nargs="+", action="append", required=True, metavar="NAME [KEY=VALUE]",
                   help="an arm: its name, then its own overrides")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eval-seq-len", type=int, default=128, help="one validation length for every arm")
    p.add_argument("--target-loss", type=float, default=None,
                   help="validation loss for 'tokens to target' (default: the highest final loss of any run)")
    args = p.parse_args(argv)
    arms = parse_arms(args.arm)
    fixed = [f"eval.seq_len={args.eval_seq_len}", "train.sample_tokens=0"]
    configs = {(arm, s): load_config(args.config, [*fixed, *args.set, *ov, f"train.seed={s}", f"data.shuffle_seed={s}"])
               for arm, ov in arms.items() for s in args.seeds}  # every config checked before any run
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, dict[int, list[dict]]] = {arm: {} for arm in arms}
    t0 = time.time()
    for (arm, s), cfg in configs.items():
        run_dir = os.path.join(args.out, "runs", arm, f"seed{s}")
        print(f"== arm {arm}, seed {s}: {run_dir}", flush=True)
        fit(cfg, run_dir)
        results[arm][s] = read_metrics(run_dir)
    summary = summarize(results, args.target_loss)
    header = (f"Study of {len(arms)} arms x {len(args.seeds)} seeds ({time.strftime('%Y-%m-%d')}, "
              f"{platform.node() or platform.platform()}, {os.cpu_count()} CPUs, {time.time() - t0:.0f} s); "
              f"validation loss (nats) at eval.seq_len {args.eval_seq_len}; common overrides: "
              f"{' '.join(args.set) or 'none'}; arms: "
              + "; ".join(f"{a}: {' '.join(ov) or '(as is)'}" for a, ov in arms.items()))
    table = markdown(summary, args.seeds, header)
    colors = {f"{arm} s{s}": COLORS[i % len(COLORS)] for i, arm in enumerate(arms) for s in args.seeds}
    runs = {f"{arm} s{s}": rows for arm, seeds in results.items() for s, rows in seeds.items()}
    plot_runs(runs, os.path.join(args.out, "study.png"), panels=(("val/mean/loss", "validation loss"),
                                                                   ("loss", "training loss")),
              colors=colors, title=f"{len(arms)} arms x {len(args.seeds)} seeds")
    record = {**summary, "seeds": args.seeds, "arms_overrides": arms, "common": args.set, "config": args.config,
              "eval_seq_len": args.eval_seq_len, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    write_report(args.out, "study", record, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
