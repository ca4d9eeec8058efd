"""FP8 backends checked against BF16 at identical parameters: forward, gradient, FP8 state, training.

    python scripts/te_gpu_check.py [--config configs/tiny.yaml] [--stage 0] [--steps 8]
        [--arms bf16 xla te te-fused] [KEY=VALUE ...] [--json-out FILE]

Written for Transformer Engine on a GPU (docs/BENCHMARKS.md, "Transformer Engine on the GPU"): every
arm starts from the same parameters and trains `--steps` steps on one synthetic batch (memorizing it,
so the loss has somewhere to fall; warmup 1 step unless overridden) with the train step a run
compiles (a fresh run's first step as a run takes it, `fp8_bootstrap_config`).
Then each FP8 arm takes one more step from BF16's parameters after step 1 with its own calibrated
FP8 state, beside BF16's step 2: same parameters, same batch, so the comparison isolates FP8.

Checks per FP8 arm (stated bounds; E4M3 forward, E5M2 gradients, 2 % and 10 % as in tests/test_fp8.py):
  forward   |loss - BF16 loss| / BF16 loss <= 2 %      (calibrated step)
  gradient  |grad norm - BF16's| / BF16's <= 10 %      (calibrated step)
  state     every FP8 scale finite and positive, and no non-finite amax counted
  training  the loss falls from the first step to the last
The first step's loss and gradient norm are printed too (TE's delayed scaling starts from unit scales;
ours bootstraps with current scaling). Arms whose backend does not run here (TE without a GPU) are
reported as skipped. Prints a table and one JSON line; exit 1 when a check fails, 2 on a usage error.
On a CPU the `bf16` and `xla` arms run (tests/test_te_gpu_check.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.core.args import cli_entry
from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.training.batch import BatchSpec
from yxanul_jax.training.stages import compile_stage
from yxanul_jax.training.steps import fp8_bootstrap_config, init_train_state

ARMS = {"bf16": None, "xla": ("xla", False), "te": ("te", False), "te-fused": ("te", True)}
FORWARD_REL, GRADIENT_REL = 0.02, 0.10


def arm_config(cfg, arm: str):
    """The config of one arm: FP8 off, or on with a backend (and TE's fused layers)."""
    if ARMS[arm] is None:
        return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    backend, fused = ARMS[arm]
    return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=True, backend=backend, te_layers=fused))


def _scales(fp8_state) -> np.ndarray:
    leaves = [np.asarray(v, np.float64).ravel() for p, v in jax.tree_util.tree_leaves_with_path(fp8_state)
              if "scale" in jax.tree_util.keystr(p)]
    return np.concatenate(leaves) if leaves else np.zeros(0)


def run_arm(cfg, stage_index: int, steps: int, batch: dict) -> dict:
    """Train `steps` steps from the config's seed; the compiled step comes back for `calibrated_step`."""
    stage = cfg.curriculum[stage_index]
    state = init_train_state(cfg, jax.random.key(cfg.train.seed))
    step = compile_stage(cfg, stage)
    boot = fp8_bootstrap_config(cfg)
    first = compile_stage(boot, stage) if boot is not None else step
    losses, norms, after_one = [], [], None
    for i in range(steps):
        state, m = (first if i == 0 else step)(state, batch)
        losses.append(float(m["loss"]))
        norms.append(float(m["grad_norm"]))
        if i == 0:
            after_one = jax.tree.map(np.array, (state.params, state.fp8))  # copies: the next step donates
    return {"losses": losses, "grad_norms": norms, "after_one": after_one, "step": step, "state": state,
            "nonfinite": float(m.get("fp8_nonfinite", 0.0))}


def calibrated_step(trained: dict, params, batch: dict) -> dict:
    """One step of an arm's compiled step from `params` with the arm's FP8 state after its first step
    (it donates the arm's last state: read that state before)."""
    state = trained["state"].replace(params=jax.tree.map(jnp.asarray, params), step=jnp.ones((), jnp.int32),
                                        fp8=jax.tree.map(jnp.asarray, trained["after_one"][1]))
    _, m = trained["step"](state, batch)
    return {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"])}


def check(cfg, stage_index: int, steps: int, arms: list[str]) -> dict:
    stage = cfg.curriculum[stage_index]
    batch = BatchSpec.of(stage).synthetic(cfg.model.vocab_size)
    bf16 = run_arm(arm_config(cfg, "bf16"), stage_index, steps, batch)
    base_params = bf16["after_one"][0]
    rows = {"bf16": {"first_loss": bf16["losses"][0], "first_grad_norm": bf16["grad_norms"][0],
                     "loss": bf16["losses"][1], "grad_norm": bf16["grad_norms"][1],
                     "last_loss": bf16["losses"][-1], "ok": bf16["losses"][-1] < bf16["losses"][0]}}
    for arm in arms:
        if arm == "bf16":
            continue
        acfg = arm_config(cfg, arm)
        try:
            fp8_lib.check_backend(acfg.fp8)
        except UserError as e:
            rows[arm] = {"skipped": str(e)}
            continue
        trained = run_arm(acfg, stage_index, steps, batch)
        scales = _scales(trained["state"].fp8)
        calibrated = calibrated_step(trained, base_params, batch)
        row = {"first_loss": trained["losses"][0], "first_grad_norm": trained["grad_norms"][0],
               "loss": calibrated["loss"], "grad_norm": calibrated["grad_norm"], "last_loss": trained["losses"][-1],
               "forward_rel": abs(calibrated["loss"] - rows["bf16"]["loss"]) / rows["bf16"]["loss"],
               "gradient_rel": abs(calibrated["grad_norm"] - rows["bf16"]["grad_norm"]) / rows["bf16"]["grad_norm"],
               "scales": int(scales.size), "nonfinite": trained["nonfinite"]}
        row["checks"] = {"forward": row["forward_rel"] <= FORWARD_REL, "gradient": row["gradient_rel"] <= GRADIENT_REL,
                         "state": bool(scales.size) and bool(np.all(np.isfinite(scales) & (scales > 0)))
                         and row["nonfinite"] == 0,
                         "training": row["last_loss"] < row["first_loss"]}
        row["ok"] = all(row["checks"].values())
        rows[arm] = row
    device = jax.devices()[0]
    return {"config": cfg.model.name, "stage": stage_index, "seq_len": stage.seq_len, "steps": steps,
            "device": device.device_kind, "platform": device.platform, "arms": rows,
            "ok": all(r.get("ok", True) for r in rows.values())}


def table(result: dict) -> str:
    head = (f"{'arm':<9} {'1st loss':>9} {'1st |g|':>9} {'loss':>9} {'|g|':>9} {'fwd rel':>8} {'grad rel':>8} "
            f"{'last loss':>9}  checks")
    lines = [f"{result['config']} stage {result['stage']} (seq {result['seq_len']}), {result['steps']} steps on "
             f"{result['device']} ({result['platform']}); loss and |g| at BF16's step-1 parameters", head]
    for arm, r in result["arms"].items():
        if "skipped" in r:
            lines.append(f"{arm:<9} skipped: {r['skipped']}")
            continue
        rel = lambda k: f"{100 * r[k]:7.2f}%" if k in r else f"{'-':>8}"
        checks = ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in r.get("checks", {}).items()) or "reference"
        lines.append(f"{arm:<9} {r['first_loss']:9.4f} {r['first_grad_norm']:9.4f} {r['loss']:9.4f} "
                     f"{r['grad_norm']:9.4f} {rel('forward_rel')} {rel('gradient_rel')} {r['last_loss']:9.4f}  {checks}")
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--json-out", default=None, help="also write the JSON record to this file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    cfg = load_config(args.config, ["optim.warmup_steps=1", *args.overrides])
    if not 0 <= args.stage < len(cfg.curriculum):
        raise UserError(f"--stage {args.stage} is not a stage of {args.config} (0..{len(cfg.curriculum) - 1})")
    if args.steps < 2:
        raise UserError(f"--steps must be >= 2 (the calibrated comparison is step 2), got {args.steps}")
    result = check(cfg, args.stage, args.steps, args.arms)
    print(table(result))
    line = json.dumps(result)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            fh.write(line + "\n")
    print(line)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
