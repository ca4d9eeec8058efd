"""`python -m yxanul_jax.plan`: what a config costs, starting with its parameters by component.

The counts come from the real model (`jax.eval_shape` of `Yxanul.init`: no memory is
allocated, so the 270M config plans instantly on a laptop). The report is a dict built by
`build_plan`; later sections (memory per stage, largest batch per GPU) are added to the same dict
so the table and the `--json` line never disagree.
"""
from __future__ import annotations

import argparse
import json
import sys

from yxanul_jax.config import Config, add_config_args, config_from_args
from yxanul_jax.errors import cli_entry
from yxanul_jax.model import COMPONENTS, abstract_variables, param_breakdown


def fp8_state_count(variables: dict) -> int:
    """Number of float32 values of FP8 state (amax histories and scales)."""
    import jax

    return sum(int(x.size) for k, v in variables.items() if k != "params" for x in jax.tree_util.tree_leaves(v))


def build_plan(cfg: Config) -> dict:
    """Everything the plan reports, as plain JSON-ready values."""
    variables = abstract_variables(cfg.model, cfg.fp8)
    by_component = param_breakdown(variables["params"])
    total = sum(by_component.values())
    return {
        "model": cfg.model.name,
        "params_total": total,
        "params_by_component": by_component,
        "fp8_state_values": fp8_state_count(variables),
        "stages": [{"stage": i, "start_step": s.start_step, "seq_len": s.seq_len, "batch_size": s.batch_size,
                    "grad_accum_steps": s.grad_accum_steps, "tokens_per_step": s.tokens_per_step}
                   for i, s in enumerate(cfg.curriculum)],
    }


def format_plan(plan: dict) -> str:
    total = plan["params_total"]
    lines = [f"model {plan['model']}: {total:,} parameters ({total / 1e6:.2f} M)", "",
             f"{'component':<12}{'params':>16}{'M':>10}{'share':>9}"]
    for name in COMPONENTS:
        n = plan["params_by_component"][name]
        lines.append(f"{name:<12}{n:>16,}{n / 1e6:>10.2f}{100 * n / total:>8.1f}%")
    lines.append(f"{'total':<12}{total:>16,}{total / 1e6:>10.2f}{100.0:>8.1f}%")
    if plan["fp8_state_values"]:
        lines.append(f"FP8 state: {plan['fp8_state_values']:,} float32 values (amax histories and scales)")
    lines += ["", f"{'stage':<7}{'start':>8}{'seq_len':>9}{'batch':>8}{'accum':>7}{'tokens/step':>13}"]
    for s in plan["stages"]:
        lines.append(f"{s['stage']:<7}{s['start_step']:>8}{s['seq_len']:>9}{s['batch_size']:>8}"
                     f"{s['grad_accum_steps']:>7}{s['tokens_per_step']:>13,}")
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yxanul_jax.plan", description=__doc__.splitlines()[0])
    add_config_args(parser)
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding the whole plan")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    plan = build_plan(cfg)
    print(format_plan(plan))
    if args.json:
        print(json.dumps(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
