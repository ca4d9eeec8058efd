"""Golden numerics of training: a fixed tiny run's loss, grad norm and a few weights after steps 1 and 10.

    python scripts/golden_steps.py            # measure and print (a table, then one JSON line)
    python scripts/golden_steps.py --write    # ... and (re)write tests/golden/steps.json

tests/test_golden.py runs `measure()` below and compares it with tests/golden/steps.json, so any
change to the numbers training computes (model, loss, optimizer, schedule, FP8 scaling, accumulation)
shows up as a failing test instead of a guess. When a change is meant to move the numbers, rerun
this with `--write` and commit the new file with the change that moved them: never type the numbers.

The run: `tests/conftest.py`'s `micro_config()` (float32 micro model, vocabulary 97 padded to 112),
one curriculum stage of [2 x 4 x 16] (grad_accum 2), `train.loss_chunk` 24 (the 64 tokens of a
micro-batch in 3 chunks), warmup 4 then cosine to step 10; batch k is `BatchSpec.synthetic(97, seed=k)`,
the state `init_train_state(cfg, key(0))`, each step `make_train_step(cfg, stage)` under `jax.jit`.
Three arms (`ARMS`): FP8 on (`FP8Config()`: xla backend, delayed scaling; step 0 compiled from
`fp8_bootstrap_config(cfg)`, as a fresh run of the train loop does) and FP8 off, with the default optimizer
(Muon), and FP8 on with AdamW (the default before 2026-11-28: its numbers are those the file held for `fp8` then).

XLA:CPU at -O0: the test suite compiles with `--xla_backend_optimization_level=0` (tests/conftest.py),
which can round differently from XLA's default; this script imports the suite's `tests/conftest.py`
before JAX (it sets that flag and the CPU platform), so the file it writes is what the suite measures.
Needs the dev install (pytest).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "steps.json"
for _path in (str(ROOT), str(ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
# The suite's own setup, imported before JAX: the CPU platform and XLA's flags exactly as the tests have them.
import conftest  # noqa: E402

CPU_TEST_XLA_FLAG = conftest.CPU_TEST_XLA_FLAG

RECORD_STEPS = (1, 10)
"""After which optimizer steps the values are recorded (the run is as long as the last)."""
ARMS = ("fp8", "no_fp8", "fp8_adamw")
"""FP8 on and off with the default optimizer (Muon since 2026-11-28), and FP8 on with AdamW."""


def golden_config(arm: str):
    """The fixed tiny config of one arm (`ARMS`)."""
    import dataclasses

    from yxanul_jax.core.config import FP8Config, StageConfig

    cfg = conftest.micro_config()
    optim = dataclasses.replace(cfg.optim, warmup_steps=4)
    return dataclasses.replace(
        cfg, fp8=FP8Config() if arm.startswith("fp8") else FP8Config(enabled=False),
        curriculum=(StageConfig(start_step=0, seq_len=16, batch_size=4, grad_accum_steps=2),),
        optim=dataclasses.replace(optim, name="adamw") if arm.endswith("_adamw") else optim,
        train=dataclasses.replace(cfg.train, steps=RECORD_STEPS[-1], loss_chunk=24))


def _values(state, metrics) -> dict:
    """What is recorded after a step: its metrics and a few weights (and one FP8 scale), as floats."""
    import numpy as np

    p = state.params
    out = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
           "embedding[3,:4]": np.asarray(p["embedding"][3, :4]).tolist(),
           "layer_0.attn.q.kernel[0,:4]": np.asarray(p["layer_0"]["attn"]["q"]["kernel"][0, :4]).tolist(),
           "final_norm.scale[:4]": np.asarray(p["final_norm"]["scale"][:4]).tolist()}
    if state.fp8:
        out["fp8.layer_0.mlp.down.grad.scale"] = float(
            state.fp8["fp8_meta"]["layer_0"]["mlp"]["down"]["gemm"]["grad"]["scale"])
    return out


def measure(arm: str, cfg=None) -> dict:
    """{str(step): values} after each of `RECORD_STEPS` of the fixed run of `arm` (`cfg`: its config,
    `golden_config(arm)` unless given)."""
    import jax

    from yxanul_jax.training.batch import BatchSpec
    from yxanul_jax.training.steps import fp8_bootstrap_config, init_train_state, make_train_step, step_xla_options

    cfg = cfg or golden_config(arm)
    stage = cfg.curriculum[0]
    spec = BatchSpec.of(stage)
    step = jax.jit(make_train_step(cfg, stage), compiler_options=step_xla_options(cfg) or None)
    boot_cfg = fp8_bootstrap_config(cfg)
    first = (jax.jit(make_train_step(boot_cfg, stage), compiler_options=step_xla_options(boot_cfg) or None)
             if boot_cfg is not None else step)
    state = init_train_state(cfg, jax.random.key(0))
    out = {}
    for k in range(RECORD_STEPS[-1]):
        state, metrics = (first if k == 0 else step)(state, spec.synthetic(cfg.model.vocab_size, seed=k))
        if k + 1 in RECORD_STEPS:
            out[str(k + 1)] = _values(state, metrics)
    return out


def measure_all() -> dict:
    """Every arm, with the JAX version they were measured with."""
    import jax

    return {"jax": jax.__version__, "xla_flags": CPU_TEST_XLA_FLAG, **{arm: measure(arm) for arm in ARMS}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"(re)write {GOLDEN.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    record = measure_all()
    print(f"{'arm':<9} {'step':>4}  name                               values")
    for arm in ARMS:
        for step, values in record[arm].items():
            for name, v in values.items():
                shown = " ".join(f"{x:.8g}" for x in (v if isinstance(v, list) else [v]))
                print(f"{arm:<9} {step:>4}  {name:<34} {shown}")
    if args.write:
        from yxanul_jax.core.rundir import atomic_write

        atomic_write(str(GOLDEN), json.dumps(record, indent=1) + "\n")  # makes the folder; never half-written
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
