"""The end-of-run sample: a training-loop hook that prints a short continuation of `train.sample_prompt`.

`python -m yxanul_jax.train` adds it to `fit(..., hooks=[EndOfRunSample()])`, so a finished run ends in
text written by the model it trained (drawn as the `generate` command draws by default, `sampling.TEMPERATURE`
and the rest; seeded by train.seed; process 0 only; `train.sample_tokens=0` turns it off). A SIGTERM/SIGINT during
it ends it at the next token (the loop's `interrupted`): the run is finished and saved by then, and nothing is
printed.
"""
from __future__ import annotations

import time
from typing import Callable

import jax

from yxanul_jax.core import console
from yxanul_jax.inference import sampling
from yxanul_jax.inference.sampling import generate  # this module's own name for it (test_train's stop test patches it)
from yxanul_jax.inference.trained import run_tokenizer
from yxanul_jax.training.hooks import Hook


def print_sample(cfg, state, should_stop: Callable[[], bool] | None = None) -> None:
    """Print a continuation of `train.sample_prompt` by the model in `state` (skipped, with a note, when the prompt
    is empty or cannot fit, when `should_stop()` ends it early (`sampling.generate`), or when the parameters span
    processes (FSDP): this process alone, the lead, cannot read them; replicated ones it can)."""
    tok = run_tokenizer(cfg)
    prompt = tok.encode(cfg.train.sample_prompt)
    if not prompt:
        console.note("end-of-run sample skipped: train.sample_prompt is empty (train.sample_tokens=0 turns it off)")
        return
    if len(prompt) + cfg.train.sample_tokens > cfg.model.max_position:
        console.note(f"end-of-run sample skipped: its prompt ({len(prompt)} tokens) and train.sample_tokens="
                     f"{cfg.train.sample_tokens} exceed model.max_position {cfg.model.max_position}; lower "
                     "train.sample_tokens")
        return
    if not all(x.is_fully_replicated or x.is_fully_addressable for x in jax.tree_util.tree_leaves(state.params)):
        console.note("end-of-run sample skipped: the parameters are sharded across processes; sample from the "
                     "checkpoint with `python -m yxanul_jax.generate --run-dir RUN_DIR`")
        return
    variables = {"params": jax.device_get(state.params), **jax.device_get(state.fp8)}
    result = generate(cfg.model, cfg.fp8, variables, [prompt], cfg.train.sample_tokens,
                      temperature=sampling.TEMPERATURE, top_k=sampling.TOP_K, top_p=sampling.TOP_P,
                      seed=cfg.train.seed, eos_id=tok.eos_id, should_stop=should_stop)
    if result["stopped"]:
        console.note("end-of-run sample skipped: the run was asked to stop")
        return
    out = result["tokens"][0]
    text = tok.tokenizer.decode([t for t in out if t != tok.eos_id])
    console.info(f"sample (train.sample_prompt, {len(out)} tokens, {sampling.describe()}):\n"
                 f"{cfg.train.sample_prompt}{text}")


class EndOfRunSample(Hook):
    """`print_sample` when the run finishes (its seconds go to the loop's `times["sample"]`)."""

    def on_end(self, loop, state, step: int) -> None:
        if jax.process_index() != 0 or not loop.cfg.train.sample_tokens:
            return
        t0 = time.perf_counter()
        print_sample(loop.cfg, state, should_stop=lambda: loop.interrupted() is not None)
        loop.times["sample"] = time.perf_counter() - t0
