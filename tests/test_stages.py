"""Curriculum stages: which stage a step is in, the batch shapes a stage's step is compiled for, and the
stage compiler (each stage once, the FP8 bootstrap step apart, the configured XLA options applied)."""
import dataclasses

import jax
import jax.numpy as jnp

from yxanul_jax.core.config import FP8Config, load_config
from yxanul_jax.training.stages import StageCompiler, compile_stage, stage_index
from yxanul_jax.training.steps import init_train_state

from conftest import micro_model

CURRICULUM = "curriculum=[{start_step: 0, seq_len: 8, batch_size: 4}, {start_step: 5, seq_len: 16, batch_size: 2}]"


def _cfg(*extra):
    cfg = load_config(None, [CURRICULUM, "train.steps=10", "train.loss_chunk=16", *extra])
    return dataclasses.replace(cfg, model=micro_model())


def test_stage_index_at_the_boundaries():
    cfg = _cfg()
    assert [stage_index(cfg, s) for s in (0, 4, 5, 9, 10_000)] == [0, 0, 1, 1, 1]


def test_compiler_compiles_each_stage_once_and_the_bootstrap_apart():
    cfg = _cfg()
    compiler = StageCompiler(cfg)
    compiler.prefetch(1)
    compiler.prefetch(1)
    first, again = compiler.get(0), compiler.get(0)
    assert first is again and compiler.get(1) is compiler.get(1)
    assert compiler.compile_counts == [1, 1]
    boot = compiler.first_step(0)  # delayed FP8 scaling: step 0 runs with current scaling, compiled on its own
    assert boot is not None and boot is not first and compiler.compile_counts == [1, 1]
    state = init_train_state(cfg, jax.random.key(0))
    tokens = jnp.zeros((1, 4, 9), jnp.int32)
    batch = {"inputs": tokens[..., :-1], "targets": tokens[..., 1:], "mask": jnp.ones((1, 4, 8), jnp.float32)}
    state, metrics = boot(state, batch)
    state, metrics = first(state, batch)
    assert int(state.step) == 2 and bool(jnp.isfinite(metrics["loss"]))
    off = StageCompiler(dataclasses.replace(cfg, fp8=FP8Config(enabled=False)))
    assert off.first_step(0) is None  # nothing to bootstrap without delayed FP8 scaling


def test_xla_options_reach_the_compiler():
    # an option XLA does not know fails the compile: proof that train.xla_options is passed on
    cfg = _cfg("train.xla_options.xla_no_such_option=true")
    try:
        compile_stage(cfg, cfg.curriculum[0])
    except Exception as e:  # noqa: BLE001 - XLA's error type varies by version
        assert "xla_no_such_option" in str(e)
    else:
        raise AssertionError("an unknown XLA option was accepted: train.xla_options is not reaching .compile()")
