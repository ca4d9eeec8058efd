"""`python -m yxanul_jax.plan`: what a config costs: parameters by component, memory per stage, what fits a GPU.

    python -m yxanul_jax.plan --config FILE [--gpu NAME|GB] [--headroom 0.2] [key=value ...] [--json]

The parameter counts come from the real model (`jax.eval_shape` of `Yxanul.init`: no memory is
allocated, so the 270M config plans instantly on a laptop). Memory per curriculum stage is
`memory.estimate_stage` (weights, gradients, optimizer moments, FP8 state, batch, activations with
and without remat, logits of the chunked loss), checked against XLA's compiled memory analysis by
scripts/check_plan.py. For the GPU (default rtx4090, the seeds' card) the plan gives each stage's
largest micro-batch that fits JAX's memory pool less a headroom, and, when a stage does not fit, a
scaled-down config that does, printed as YAML; when every stage fits with fewer, larger micro-batches
(the seeds' small-GPU layouts on a large GPU), that config, also as YAML. The report is one dict (`build_plan`), so the table
and the `--json` line never disagree.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys

import yaml

from yxanul_jax.analysis import accounting, gpus, memory
from yxanul_jax.core.args import ArgumentParser, Ranged, add_config_args, cli_entry, config_from_args
from yxanul_jax.core.coerce import to_dict
from yxanul_jax.core.config import Config, StageConfig
from yxanul_jax.model.transformer import abstract_variables

DEFAULT_GPU = "rtx4090"
REMAT_COLUMNS = ("none", "attention", "dots", "full")  # every policy's activations, in the JSON
GB = 1e9


def fp8_state_count(variables: dict) -> int:
    """Number of float32 values of FP8 state (amax histories, scales, non-finite counters)."""
    import jax

    return sum(int(x.size) for k, v in variables.items() if k != "params" for x in jax.tree_util.tree_leaves(v))


def sparse_config_dict(cfg: Config) -> dict:
    """The fields of `cfg` that differ from the dataclass defaults: a YAML config that rebuilds it."""
    full, base = to_dict(cfg), to_dict(Config())
    out = {}
    for section, values in full.items():
        if section == "curriculum":
            stage0 = to_dict(StageConfig())
            out[section] = [{k: v for k, v in s.items() if v != stage0[k]} or {"start_step": 0} for s in values]
            continue
        diff = {k: v for k, v in values.items() if v != base[section][k]}
        if diff:
            out[section] = diff
    return out


def _stage_report(cfg: Config, i: int, stage: StageConfig, gpu: memory.Gpu, state: dict) -> dict:
    est = memory.estimate_stage(cfg, stage, state=state, budget=gpu.budget_bytes)
    by_remat = {r: memory.estimate_stage(cfg, stage, remat=r, state=state) for r in REMAT_COLUMNS}
    return {"stage": i, "start_step": stage.start_step, "seq_len": stage.seq_len, "batch_size": stage.batch_size,
            "grad_accum_steps": stage.grad_accum_steps, "tokens_per_step": stage.tokens_per_step,
            "remat": est["remat"], "micro_split": est["micro_split"],
            "bytes": {k: v for k, v in est.items() if k not in ("bytes_total", "phase", "remat", "micro_split")},
            "peak_phase": est["phase"], "bytes_total": est["bytes_total"],
            "activations_by_remat": {r: e["activations"] for r, e in by_remat.items()},
            "bytes_total_by_remat": {r: e["bytes_total"] for r, e in by_remat.items()},
            "max_batch_size": memory.max_batch_size(cfg, stage, gpu.budget_bytes, state=state),
            "fits": est["bytes_total"] <= gpu.budget_bytes}


def build_plan(cfg: Config, gpu: memory.Gpu | None = None, suggest: bool = True) -> dict:
    """Everything the plan reports, as plain JSON-ready values (bytes are ints)."""
    gpu = gpu or memory.parse_gpu(DEFAULT_GPU)
    # Counts do not depend on the attention kernel (tracing cuDNN's would fail on a machine without it), nor on
    # whether the layers are scanned: traced scanned, in one layer's time, however many layers the config has.
    variables = abstract_variables(dataclasses.replace(cfg.model, attention="xla", scan_layers=True, scan_unroll=1),
                                   cfg.fp8)
    by_component = accounting.param_breakdown(variables["params"], cfg.model)
    total = sum(by_component.values())
    state = accounting.state_bytes(cfg)
    stages = [_stage_report(cfg, i, s, gpu, state) for i, s in enumerate(cfg.curriculum)]
    plan = {
        "model": cfg.model.name,
        "params_total": total,
        "params_by_component": by_component,
        "params_allocated": accounting.allocated_param_count(cfg),
        "vocab": {"size": cfg.model.vocab_size, "padded": cfg.model.padded_vocab},
        "fp8_state_values": fp8_state_count(variables),
        "platform": "gpu",
        "gpu": {"name": gpu.name, "total_bytes": gpu.total_bytes, "mem_fraction": gpu.mem_fraction,
                "headroom": gpu.headroom, "budget_bytes": gpu.budget_bytes},
        "optimizer": cfg.optim.name, "remat": cfg.model.remat, "scan_layers": cfg.model.scan_layers,
        "layer_loop": cfg.model.layer_loop, "loss_chunk": cfg.train.loss_chunk,
        "state_bytes": {"weights": state["weights"], "gradients": state["weights"], "optimizer": state["optimizer"],
                        "fp8_state": state["fp8_state"]},
        "stages": stages,
        "fits": all(s["fits"] for s in stages),
        "suggestion": None,
        "faster": None,
    }
    if suggest and plan["fits"]:
        grown = memory.largest_micro_batches(cfg, gpu.budget_bytes)
        notes = memory.batch_notes(cfg, grown)
        if notes:
            plan["faster"] = {"changes": notes, "yaml": yaml.safe_dump(sparse_config_dict(grown), sort_keys=False)}
    if suggest and not plan["fits"]:
        new, notes, ok = memory.suggest_config(cfg, gpu.budget_bytes, tag=re.sub(r"[^a-z0-9]+", "", gpu.name.lower()))
        plan["suggestion"] = {"fits": ok, "changes": notes, "yaml": yaml.safe_dump(sparse_config_dict(new),
                                                                                    sort_keys=False),
                              "params_total": accounting.param_count(new),
                              "stages": [_stage_report(new, i, s, gpu, accounting.state_bytes(new))["bytes_total"]
                                         for i, s in enumerate(new.curriculum)]}
    return plan


def format_plan(plan: dict) -> str:
    total = plan["params_total"]
    lines = [f"model {plan['model']}: {total:,} parameters ({total / 1e6:.2f} M)", "",
             f"{'component':<12}{'params':>16}{'M':>10}{'share':>9}"]
    for name in accounting.COMPONENTS:
        n = plan["params_by_component"][name]
        lines.append(f"{name:<12}{n:>16,}{n / 1e6:>10.2f}{100 * n / total:>8.1f}%")
    lines.append(f"{'total':<12}{total:>16,}{total / 1e6:>10.2f}{100.0:>8.1f}%")
    pad = plan["params_allocated"] - total
    if pad:
        lines.append(f"vocabulary padded {plan['vocab']['size']:,} -> {plan['vocab']['padded']:,} rows "
                     f"(model.vocab_pad_to): {pad:,} allocated values that are not parameters; "
                     f"{plan['params_allocated']:,} in the parameter tree")
    if plan["fp8_state_values"]:
        lines.append(f"FP8 state: {plan['fp8_state_values']:,} float32 values (amax histories, scales, "
                     "non-finite counters)")
    sb = plan["state_bytes"]
    lines += ["", "train state (GB): " + ", ".join(f"{k.replace('_', ' ')} {v / GB:.3f}" for k, v in sb.items())
              + ("  (float32 weights and gradients, AdamW mu and nu)" if plan["optimizer"] == "adamw" else
                 "  (float32 weights and gradients; Muon's momentum for the blocks' matrices, AdamW mu and nu for the "
                 "rest)")]
    g = plan["gpu"]
    lines.append(f"GPU {g['name']}: {g['total_bytes'] / 2**30:.1f} GiB x JAX pool {g['mem_fraction']:.2f} "
                 f"(XLA_PYTHON_CLIENT_MEM_FRACTION) x (1 - headroom {g['headroom']:.2f}) = budget "
                 f"{g['budget_bytes'] / GB:.2f} GB; remat {plan['remat']}, scan_layers {plan['scan_layers']}"
                 f"{'' if plan['layer_loop'] or not plan['scan_layers'] else ' (unrolled: no loop)'}, "
                 f"loss chunk {plan['loss_chunk']:,} tokens")
    lines += ["", f"{'stage':<6}{'seq':>6}{'batch':>7}{'accum':>6}{'tokens/step':>12}{'remat':>10}"
                  f"{'act none':>10}{'act':>8}{'logits':>8}{'layer bwd':>10}{'total GB':>10}"
                  f"{'max batch':>10}{'fits':>6}"]
    for s in plan["stages"]:
        b = s["bytes"]
        remat = memory.remat_label(s["remat"], s["micro_split"])
        lines.append(f"{s['stage']:<6}{s['seq_len']:>6}{s['batch_size']:>7}{s['grad_accum_steps']:>6}"
                     f"{s['tokens_per_step']:>12,}{remat:>10}{s['activations_by_remat']['none'] / GB:>10.2f}"
                     f"{b['activations'] / GB:>8.2f}{b['logits'] / GB:>8.2f}{b['working'] / GB:>10.2f}"
                     f"{s['bytes_total'] / GB:>10.2f}{s['max_batch_size']:>10,}{'yes' if s['fits'] else 'NO':>6}")
    lines.append("(GB = 1e9 bytes; remat = the stage's policy (model.remat, `auto` chosen for this GPU; `/k`: each "
                 "micro-batch run as k smaller ones, train.micro_split); act = "
                 "activations saved for the backward pass; the peak adds the larger of 'logits' and 'layer bwd' to "
                 "the state, batch and activations)")
    faster = plan.get("faster")
    if faster:
        lines += ["", f"fits {g['name']}; fewer, larger micro-batches fit too and run faster (same tokens per step; loss "
                      "and gradients are sums, equal up to rounding); save it as a file and train with --config FILE:"]
        lines += [f"  - {c}" for c in faster["changes"]]
        lines += ["---", faster["yaml"].rstrip()]
    sug = plan.get("suggestion")
    if sug and sug["fits"]:
        lines += ["", f"does not fit {g['name']}: suggested config (fits, {sug['params_total'] / 1e6:.1f} M "
                      f"parameters, peak {max(sug['stages']) / GB:.2f} GB); save it as a file and train with "
                      "--config FILE:"]
        lines += [f"  - {c}" for c in sug["changes"]]
        lines += ["---", sug["yaml"].rstrip()]
    elif sug:  # the changes tried are no config to train
        lines += ["", f"does not fit {g['name']}, and neither does the nearest change tried (peak "
                      f"{max(sug['stages']) / GB:.2f} GB): {'; '.join(sug['changes'])}"]
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m yxanul_jax.plan", description=__doc__.splitlines()[0])
    add_config_args(parser)
    parser.add_argument("--gpu", default=DEFAULT_GPU,
                        help=f"GPU to fit: {', '.join(gpus.names())} (also 4090, a100, ...), or its memory with a unit, 24GB (default {DEFAULT_GPU})")
    parser.add_argument("--headroom", type=Ranged(float, 0, 1, hi_open=True), default=memory.DEFAULT_HEADROOM,
                        help=f"share of JAX's memory pool kept free (default {memory.DEFAULT_HEADROOM})")
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding the whole plan")
    args = parser.parse_intermixed_args(argv)  # overrides may come before, between or after flags
    gpu = memory.parse_gpu(args.gpu, args.headroom)
    cfg = config_from_args(args)
    plan = build_plan(cfg, gpu)
    print(format_plan(plan))
    if args.json:
        print(json.dumps(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
