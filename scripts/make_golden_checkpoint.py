"""Write the golden checkpoint: a tiny checkpoint of today's format that every later version must resume.

    python scripts/make_golden_checkpoint.py            # measure a fresh one and print its numbers (nothing kept)
    python scripts/make_golden_checkpoint.py --write    # ... and write tests/golden/checkpoint-v<FORMAT_VERSION>/

tests/test_golden_checkpoint.py copies `checkpoints/` of that folder into a new run directory, restores it
with the code of the day (checksums verified) and trains one more step with `resume_one_step()` below, then
compares what it got with the `expected.json` this script wrote: the restored arrays' checksums (exact: a
restore is bit-exact) and data position, then step 3's loss, grad norm and lr and every array of the state
after it (a relative tolerance: rounding only). Regenerate deliberately, never to make that test pass: only
when `integrity.FORMAT_VERSION` is raised (write the new version's folder beside the old one, which stays a
test of reading older checkpoints), or when training is meant to compute other numbers (then say so in the
commit, as for tests/golden/steps.json).

The folder (~400 KB): `data/`, a prepared dataset (a 320-entry byte-level BPE trained on stdlib sources, with
its shards), `checkpoints/2/` (a float32 model of d_model 16 and 2 layers with FP8 delayed scaling, trained 2
steps by `training.loop.fit`: parameters, AdamW moments, FP8 state, the data cursor) and `expected.json`. The
schedule is still warming up at step 2 (optim.warmup_steps 20), so train.steps 3 continues it with no jump.
Like scripts/golden_steps.py it imports `tests/conftest.py` before JAX (the CPU platform and the suite's -O0
flag), so its numbers are the suite's. Needs the dev install (pytest).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
import conftest  # noqa: E402,F401 - the suite's CPU platform and XLA flags, before JAX

from yxanul_jax.training.integrity import FORMAT_VERSION  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / f"checkpoint-v{FORMAT_VERSION}"
SAVED_STEP = 2
"""The step the golden checkpoint holds; `resume_one_step` trains step SAVED_STEP + 1."""
VOCAB = 320
OVERRIDES = ["model.name=golden", "model.vocab_size=320", "model.vocab_pad_to=16", "model.d_model=16",
             "model.n_layers=2", "model.n_heads=1", "model.n_kv_heads=1", "model.ffn_dim=32", "model.embed_rank=0",
             "model.dtype=float32", "model.max_position=64", "fp8.amax_history_len=16",
             "curriculum=[{start_step: 0, seq_len: 32, batch_size: 4}]", "eval.interval=0", "eval.max_batches=1",
             "eval.batch_size=4", "eval.seq_len=32", "checkpoint.interval=0", "checkpoint.async_save=false",
             "checkpoint.max_to_keep=1", "train.sample_tokens=0", "train.log_every=1", "optim.name=adamw"]
"""The golden run's config (with data.train and train.steps); FP8 on, delayed scaling (a short amax history); AdamW,
the default when checkpoint-v1 was written (its meta says so; Muon's state has another layout)."""


def golden_config(data: Path, steps: int):
    from yxanul_jax.core.config import load_config

    return load_config(None, [*OVERRIDES, f"data.train={data}", f"train.steps={steps}"])


def _fit_quietly(cfg, run_dir: Path) -> None:
    from yxanul_jax.training.loop import fit

    with contextlib.redirect_stdout(io.StringIO()):
        fit(cfg, str(run_dir))


def build(out: Path) -> None:
    """The dataset and the step-SAVED_STEP checkpoint in `out` (`data/`, `checkpoints/`)."""
    from yxanul_jax.data.corpus import stdlib_files
    from yxanul_jax.data.prepare import prepare_documents
    from yxanul_jax.data.tokenizer import train_bpe

    docs = [p.read_text(encoding="utf-8", errors="replace")[:1500] for p in stdlib_files(400_000)[:24]]
    tok = train_bpe([docs], VOCAB)
    prepare_documents([docs], tok, out / "data", request={"golden": "stdlib[:24], 1500 chars each"},
                      val_fraction=0.1, progress=False)
    run = out / "run"
    _fit_quietly(golden_config(out / "data", SAVED_STEP), run)
    shutil.move(str(run / "checkpoints"), str(out / "checkpoints"))
    shutil.rmtree(run)


def _sums(tree) -> dict[str, float]:
    """Dotted path -> sum of |x| (float64) of every floating-point array: what one step moved, in one number each."""
    import jax
    import numpy as np

    from yxanul_jax.training.integrity import _key_name

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        x = np.asarray(jax.device_get(leaf))
        if np.issubdtype(x.dtype, np.floating):
            out[".".join(_key_name(k) for k in path)] = float(np.abs(x.astype(np.float64)).sum())
    return out


def resume_one_step(golden: Path, work: Path) -> dict:
    """Restore `golden`'s checkpoint with today's code and train one step in `work`: {"restored": {"step",
    "checksums" (integrity.tree_checksums), "data" (the cursor)}, "step": {"loss", "grad_norm", "lr"} of step
    SAVED_STEP + 1, "state": `_sums` of the state after it}."""
    from yxanul_jax.training.checkpoint import Checkpointer
    from yxanul_jax.training.integrity import tree_checksums
    from yxanul_jax.training.steps import abstract_train_state

    run = work / "run"
    shutil.copytree(golden / "checkpoints", run / "checkpoints")
    cfg = golden_config(golden / "data", SAVED_STEP + 1)
    with Checkpointer(str(run / "checkpoints"), read_only=True) as ckpt:  # verifies meta and array checksums
        step, state, meta = ckpt.restore(abstract_train_state(cfg))
    restored = {"step": step, "checksums": tree_checksums(state), "data": meta["data"]}
    _fit_quietly(cfg, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r.get("step") == SAVED_STEP + 1 and "loss" in r)
    with Checkpointer(str(run / "checkpoints"), read_only=True) as ckpt:
        _, after, _ = ckpt.restore(abstract_train_state(cfg), SAVED_STEP + 1)
    return {"restored": restored, "step": {k: row[k] for k in ("loss", "grad_norm", "lr")}, "state": _sums(after)}


def main(argv: list[str] | None = None) -> int:
    from importlib import metadata

    from yxanul_jax.core.rundir import atomic_write, staged_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)} (refused if it exists)")
    args = p.parse_args(argv)
    if args.write and GOLDEN.exists():
        print(f"error: {GOLDEN} exists; a golden checkpoint is never overwritten: raise integrity.FORMAT_VERSION "
              "for a new format, or delete the folder deliberately", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        out = stack.enter_context(staged_dir(GOLDEN)) if args.write else Path(tmp) / "golden"
        build(out)
        numbers = resume_one_step(out, Path(tmp) / "measure")
        record = {"format_version": FORMAT_VERSION, "saved_step": SAVED_STEP,
                  "written_with": {d: metadata.version(d) for d in ("jax", "orbax-checkpoint", "flax", "optax")},
                  **numbers}
        if args.write:
            atomic_write(str(out / "expected.json"), json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"step {SAVED_STEP + 1}: " + ", ".join(f"{k} {v:.6g}" for k, v in record["step"].items()))
    print(json.dumps(record["step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
