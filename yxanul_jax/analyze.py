"""`python -m yxanul_jax.analyze` (`yxanul analyze`): what one stage's train step compiles to, here or for an H100/H200.

    python -m yxanul_jax.analyze --config configs/tiny.yaml [--stage N] [key=value ...] [--json]
                                 [--hlo-out FILE] [--target h100|h100-pcie|h200|SPEC_FILE] [--require R ...]
                                 [--xla-option K=V ...] [--disable-fp8]
                                 [--compare key=value ... | --compare-config FILE]

The stage's train step is compiled ahead of time exactly as training compiles it (abstract shapes,
donated state, the config's `train.xla_options`, nothing allocated), then reported: the FLOPs of the
optimized HLO with loop trip counts applied (`analysis.perf.hlo_flops`; XLA's own cost analysis counts
a loop body once: the layer scan, the loss chunks, the micro-batches) beside the model FLOPs
(`accounting.flops_per_token`), XLA's memory analysis (arguments, outputs, aliased, temporaries, and
the peak they add up to) next to the planner's estimate, and every GEMM of the optimized HLO by
precision and engine (`yxanul_jax.analysis.hlo`).

`--target h100` (or `h100-pcie`, `h200`, or a GpuTargetConfigProto file) compiles for that GPU on this
machine, which needs no GPU (`yxanul_jax.analysis.gpu_target`; install the `gpu-check` extra; with
`fp8.backend=te` also Transformer Engine, `scripts/te_check_env.sh`), and adds the performance model
(`analysis.perf`): every kernel of the step with its trip count, FLOPs and bytes, a roofline time on
that GPU, the predicted ms/step, tokens/s and MFU, a table by category and the top kernels. It is a
prediction from the HLO and the GPU's spec sheet, not a measurement. `--compare key=value ...` (or
`--compare-config FILE`) compiles a second variant and prints both predictions side by side. It also
adds: GEMMs by kind (FP8 cuBLASLt, FP8
Triton fusion, FP8 TE, BF16 cuBLAS(Lt), BF16 Triton), the FP8 GEMMs the config
should give per step (forward, remat recompute, input gradient, weight gradient) against those
found, the projections that were meant to be FP8 and are not ("lost"), cuDNN flash-attention
calls, and XLA's GPU memory analysis beside the planner's `gpu` estimate. `--require` exits 1 when
a check fails: `fp8-expected` (FP8 GEMMs found == expected, none lost, all TE's own with
`fp8.backend=te`; with FP8 off: none at all),
`cudnn-attention` (forward and backward cuDNN attention present; at a stage whose rows are short enough for
`short_attention`, which runs none by design, it passes as n/a).
"""
from __future__ import annotations

import dataclasses
import json
import sys

from yxanul_jax.analysis.hlo import count_dots, custom_calls, gemm_kinds, gemms, has_fp8_values  # noqa: F401
from yxanul_jax.core.args import ArgumentParser, Ranged, add_config_args, cli_entry, user_path
from yxanul_jax.core.coerce import apply_overrides
from yxanul_jax.core.config import Config, load_config, validate
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import atomic_write, check_new_output

REQUIREMENTS = ("fp8-expected", "cudnn-attention")


# --------------------------------------------------------------------------------------------
# The command


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per device program
        cost = cost[0] if cost else {}
    cost = cost or {}
    return {"flops": float(cost.get("flops", 0.0)), "transcendentals": float(cost.get("transcendentals", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def _check_hlo_out(hlo_out: str | None) -> None:
    if hlo_out:  # fail before a compile that may take minutes; its missing folders are made when it is written
        check_new_output(hlo_out, "outputs are never written over", "--hlo-out", file=True)


def _gpu_report(cfg: Config, stage_index: int, text: str, items: list, attention: str) -> dict:
    """The GPU-target part of the report: GEMM kinds, FP8 expected vs found, lost, cuDNN attention (short rows run
    `short_attention` by design, and pass with none; XLA's attention anywhere else fails the check). `attention`:
    the stage's attention implementation."""
    from yxanul_jax.analysis.accounting import expected_fp8_gemms, fp8_gemms
    from yxanul_jax.core import scopes

    fp8_targets = {t for t, _, _ in fp8_gemms(cfg.model, cfg.fp8)}
    lost = sorted({f"{g.target} ({g.phase}, {g.precision} {g.engine})" for g in items
                   if g.target in fp8_targets and g.precision != "fp8" and scopes.BF16_WGRAD not in g.op_name})
    calls = custom_calls(text)
    fwd = sum(n for k, n in calls.items() if k.startswith("__cudnn$fmha") and "Backward" not in k)
    bwd = sum(n for k, n in calls.items() if k.startswith("__cudnn$fmha") and "Backward" in k)
    expected = expected_fp8_gemms(cfg, stage_index)
    found = sum(g.runs for g in items if g.precision == "fp8")
    # With fp8.backend=te every FP8 GEMM must be TE's own (te_gemm_v2_ffi), none XLA's.
    engines_ok = cfg.fp8.backend != "te" or all(g.engine == "te" for g in items if g.precision == "fp8")
    return {"gemm_kinds": gemm_kinds(items), "fp8_expected": expected, "fp8_found": found, "fp8_lost": lost,
            "fp8_values_in_hlo": has_fp8_values(text), "cudnn_attention": {"forward": fwd, "backward": bwd},
            "te_calls": {k: n for k, n in calls.items() if k.startswith("te_")},
            "checks": {"fp8-expected": found == expected["total"] and not lost and engines_ok,
                       "cudnn-attention": fwd > 0 and bwd > 0 or attention == "short"}}


def inspect_stage(cfg: Config, stage_index: int, hlo_out: str | None = None, target: str | None = None) -> dict:
    """Compile stage `stage_index` of `cfg` (AOT, abstract shapes) and report FLOPs, memory and GEMMs;
    with `target` (h100, h200, a spec file) compile for that GPU without one, and predict its step time."""
    import jax

    from yxanul_jax.analysis import perf
    from yxanul_jax.analysis.accounting import flops_per_token, newton_schulz_flops
    from yxanul_jax.analysis.memory import estimate_stage, with_stage_remat
    from yxanul_jax.model.transformer import attention_implementation, check_attention_platform
    from yxanul_jax.training.stages import compile_stage, compiled_memory
    from yxanul_jax.training.steps import fp8_summary, step_xla_options

    n = len(cfg.curriculum)
    if not -n <= stage_index < n:
        raise UserError(f"--stage {stage_index} is out of range: the config has {n} stage(s) (0..{n - 1})")
    stage_index %= n
    stage = cfg.curriculum[stage_index]
    _check_hlo_out(hlo_out)
    device = None
    if target:
        from yxanul_jax.analysis.gpu_target import INSTALL_HINT, compile_device, cudnn_available, gpu_config, target_gpu

        device = compile_device(target)
        if cfg.fp8.active and cfg.fp8.backend == "te":
            from yxanul_jax.analysis.te_compile import prepare

            prepare()  # TE without a driver: stub library, sm_90 answered (compile checks only)
        platform = "gpu"
        cfg = gpu_config(cfg, stage.seq_len)
        if cfg.model.attention == "cudnn" and not cudnn_available():
            raise UserError(f"--target {target} with cuDNN attention needs cuDNN's library to lower it; install "
                            f"{INSTALL_HINT}, or pass model.attention=xla")
    else:
        platform = jax.devices()[0].platform
        check_attention_platform(cfg.model, platform, "inspect with model.attention=auto or xla here, or compile for "
                                 "one with --target h100")
    cfg = with_stage_remat(cfg, stage, device)  # `remat: auto` as this device's step runs it, for every report below
    compiled = compile_stage(cfg, stage, device=device)
    text = compiled.as_text()
    if hlo_out:
        atomic_write(hlo_out, text)
    estimate = estimate_stage(cfg, stage, platform="cpu" if platform == "cpu" else "gpu")
    items = gemms(text)
    tokens = stage.grad_accum_steps * stage.batch_size * stage.seq_len
    kernels = perf.kernels(text)
    hlo_flops = perf.hlo_flops(kernels)
    model_flops = flops_per_token(cfg.model, stage.seq_len) * tokens
    report = {"model": cfg.model.name, "stage": stage_index, "seq_len": stage.seq_len,
              "batch_size": stage.batch_size, "grad_accum_steps": stage.grad_accum_steps, "tokens_per_step": tokens,
              "platform": platform, "target": target, "device_kind": getattr(device, "device_kind", None),
              "attention": attention_implementation(cfg.model, platform, stage.seq_len), "remat": cfg.model.remat,
              "micro_split": cfg.train.micro_split, "xla_options": step_xla_options(cfg),
              "fp8": {"enabled": cfg.fp8.active, "backend": cfg.fp8.backend, "targets": list(cfg.fp8.targets),
                      "te_layers": cfg.fp8.fused,
                      "scaling": cfg.fp8.scaling, **(fp8_summary(cfg) or {"gemm_form": None, "wgrad": None})},
              "hlo_flops": hlo_flops, "model_flops": model_flops,
              "flops": {"hlo_per_step": hlo_flops, "hlo_per_token": hlo_flops / tokens, "model_per_step": model_flops,
                        "model_per_token": model_flops / tokens, "xla_cost_analysis": _cost(compiled)["flops"],
                        "newton_schulz_per_step": newton_schulz_flops(cfg)},
              "memory": compiled_memory(compiled), "planner_bytes": estimate["bytes_total"],
              "dots": count_dots(items), "hlo_out": hlo_out}
    if target:
        report["gpu"] = _gpu_report(cfg, stage_index, text, items, report["attention"])
        gpu = target_gpu(target)
        if gpu is not None:
            prediction = perf.predict(kernels, gpu, model_flops, tokens, calibration=perf.load_calibration(gpu.key))
            report["prediction"] = prediction
            report.update({k: prediction.get(k) for k in ("predicted_step_ms", "predicted_tokens_per_s",
                                                            "predicted_mfu", "categories")})
    return report


def format_report(r: dict) -> str:
    GB = 1e9
    f, m, d = r["flops"], r["memory"], r["dots"]
    ns = f.get("newton_schulz_per_step")  # Muon's optimizer GEMMs (0 or absent: AdamW)
    lines = [f"model {r['model']} stage {r['stage']}: seq_len {r['seq_len']} x batch {r['batch_size']} x accum "
             f"{r['grad_accum_steps']} = {r['tokens_per_step']:,} tokens/step, compiled for {r['platform']}",
             f"FP8: {'on' if r['fp8']['enabled'] else 'off'} (backend {r['fp8']['backend']}, "
             f"targets {','.join(r['fp8']['targets'])}{', TE fused norm layers' if r['fp8'].get('te_layers') else ''})",
             "",
             f"{'FLOPs':<34}{'per step':>16}{'per token':>14}",
             f"{'HLO (GEMMs, attention; trip counts)':<34}{f['hlo_per_step']:>16.4g}{f['hlo_per_token']:>14.4g}",
             f"{'model (6 N + attention)':<34}{f['model_per_step']:>16.4g}{f['model_per_token']:>14.4g}",
             *([f"{'optimizer (Muon, Newton-Schulz)':<34}{ns:>16.4g}{ns / r['tokens_per_step']:>14.4g}"] if ns else []),
             f"(HLO / model = {f['hlo_per_step'] / max(f['model_per_step'], 1):.2f}: remat recompute, causal attention "
             f"counted as run{', the optimizer' if ns else ''}; XLA's own cost analysis counts a loop body once)", "",
             f"{'memory analysis':<34}{'GB':>16}"]
    for key, label in [("argument_bytes", "arguments (state + batch)"), ("output_bytes", "outputs"),
                       ("alias_bytes", "aliased (donated state)"), ("temp_bytes", "temporaries"),
                       ("peak_bytes", "peak = args + out - alias + temp")]:
        lines.append(f"{label:<34}{m[key] / GB:>16.3f}")
    err = (r["planner_bytes"] - m["peak_bytes"]) / max(m["peak_bytes"], 1)
    # plan prints the GPU estimate; on a CPU compile the planner's CPU form is the one to compare
    label = "planner estimate (yxanul_jax.plan)" if r["platform"] != "cpu" else "planner estimate (its CPU form)"
    lines.append(f"{label:<34}{r['planner_bytes'] / GB:>16.3f}  ({100 * err:+.1f} %)")
    lines += ["", f"{'dots by precision':<20}{'in HLO':>10}{'executed':>10}"]
    for key in [k for k in d if k not in ("executed", "fp8_custom_calls", "total")] + ["total"]:
        lines.append(f"{key:<20}{d[key]:>10}{d['executed'].get(key, 0):>10}")
    if d["fp8_custom_calls"]:
        lines.append(f"(of the FP8 dots, {d['fp8_custom_calls']} are cuBLASLt FP8 GEMM custom calls)")
    if "gpu" in r:
        from yxanul_jax.analysis.memory import remat_label

        g = r["gpu"]
        lines += ["", f"compiled for {r['device_kind']} (--target {r['target']}, deviceless; XLA options "
                      f"{r['xla_options'] or 'default'}; attention {r['attention']}; remat "
                      f"{remat_label(r['remat'], r['micro_split'])}"
                      + (f"; FP8 GEMM form {r['fp8']['gemm_form']})" if r["fp8"]["gemm_form"] else ")"),
                  f"{'GEMMs by kind':<20}{'in HLO':>10}{'executed':>10}"]
        for kind, row in g["gemm_kinds"].items():
            lines.append(f"{kind:<20}{row['in_hlo']:>10}{row['executed']:>10}")
        e = g["fp8_expected"]
        lines.append(f"FP8 GEMMs per step: expected {e['total']} (forward {e['forward']}, recompute {e['recompute']}, "
                     f"input grad {e['input_grad']}, weight grad {e['weight_grad']}), found {g['fp8_found']}")
        if g["fp8_lost"]:
            lines.append("FP8 targets that compiled to something else: " + "; ".join(g["fp8_lost"]))
        a = g["cudnn_attention"]
        lines.append(f"cuDNN attention calls: forward {a['forward']}, backward {a['backward']}; "
                     f"FP8 values left in the HLO: {'yes' if g['fp8_values_in_hlo'] else 'no'}")
        n_a = {"cudnn-attention"} if r["attention"] == "short" else set()  # short rows: no cuDNN by design
        lines.append("checks: " + ", ".join(f"{k} {'FAILED' if not v else 'n/a' if k in n_a else 'ok'}"
                                            for k, v in g["checks"].items()))
    if "prediction" in r:
        from yxanul_jax.analysis.perf import format_prediction

        lines += ["", format_prediction(r["prediction"])]
    if r["hlo_out"]:
        lines.append(f"optimized HLO written to {r['hlo_out']}")
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m yxanul_jax.analyze", description=__doc__.splitlines()[0])
    add_config_args(parser)
    parser.add_argument("--stage", type=Ranged(int, 0), default=0, help="curriculum stage to compile (default 0)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding the whole report")
    parser.add_argument("--hlo-out", default=None, type=user_path, metavar="FILE", help="write the optimized HLO text here")
    parser.add_argument("--target", default=None, metavar="GPU", type=user_path,
                        help="compile for h100, h100-pcie, h200 or a GpuTargetConfigProto file, on this machine (no GPU "
                             "needed; the gpu-check extra), and predict the step time there")
    parser.add_argument("--require", action="append", default=[], choices=REQUIREMENTS,
                        help="with --target: exit 1 unless this check holds (repeatable)")
    parser.add_argument("--xla-option", action="append", default=[], metavar="K=V",
                        help="an XLA compiler option for this compile (same as train.xla_options.K=V)")
    parser.add_argument("--disable-fp8", action="store_true", help="compile the same model in BF16")
    parser.add_argument("--compare", nargs="+", default=None, metavar="K=V",
                        help="with --target: also compile the config with these overrides and print both predictions "
                             "side by side (put the base config's own overrides before --compare)")
    parser.add_argument("--compare-config", default=None, type=user_path, metavar="FILE",
                        help="with --target: compare with this config (the same overrides and flags applied)")
    args = parser.parse_intermixed_args(argv)  # overrides may come before, between or after flags
    if args.require and not args.target:
        raise UserError("--require checks a GPU compile; add --target h100 (or h200)")
    if (args.compare or args.compare_config) and not args.target:
        raise UserError("--compare predicts GPU step times; add --target h100 (or h200)")
    if args.compare and args.compare_config:
        raise UserError("pass --compare K=V ... or --compare-config FILE, not both")
    cfg = _variant(args, args.config)
    other = None
    if args.compare:
        other = validate(apply_overrides(cfg, args.compare))  # checked (keys, values, rules) before any compile
        check_xla_options(other)
    elif args.compare_config:
        other = _variant(args, args.compare_config)
    report = inspect_stage(cfg, args.stage, args.hlo_out, args.target)
    print(format_report(report))
    failed = [req for req in args.require if not report["gpu"]["checks"][req]]
    for req in failed:
        print(f"REQUIREMENT NOT MET: {req}")
    if other is not None:
        from yxanul_jax.analysis.perf import format_prediction

        report_b = inspect_stage(other, args.stage, None, args.target)
        label_b = " ".join(args.compare) if args.compare else args.compare_config
        print()
        if "prediction" in report and "prediction" in report_b:
            print(format_prediction(report["prediction"], report_b["prediction"],
                                    (args.config or "the default config", label_b)))
        report["compare"] = {"variant": label_b, **{k: report_b.get(k) for k in (
            "predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu", "categories", "hlo_flops", "memory")}}
    if args.json:
        print(json.dumps(report))
    return 1 if failed else 0


def check_xla_options(cfg: Config) -> None:
    """`training.steps.check_xla_options`, imported when asked (it brings jax)."""
    from yxanul_jax.training.steps import check_xla_options as check

    check(cfg)


def _variant(args, config: str | None) -> Config:
    """The config to compile: `config` with the command line's overrides, --xla-option and --disable-fp8, checked
    as `train` checks it (an --xla-option is the same as train.xla_options.K=V)."""
    items = []
    for item in args.xla_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--xla-option '{item}' is not of the form NAME=VALUE, e.g. xla_gpu_enable_triton_gemm=false")
        items.append(f"train.xla_options.{key}={value}")
    cfg = load_config(config, list(args.overrides) + items)
    check_xla_options(cfg)  # a name or value XLA refuses: one line before any compile
    if args.disable_fp8:
        cfg = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    return cfg



if __name__ == "__main__":
    sys.exit(main())
