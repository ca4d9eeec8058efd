"""Curriculum stages: which stage a step is in, and one ahead-of-time compiled train step per stage.

Each stage has its own shapes, so its train step is lowered and compiled once (`jit.lower(...)
.compile()` on abstract shapes) and kept. The next stage compiles in a background thread while
the current one trains, so a stage change does not stall; the persistent compilation cache makes
a rerun (or a resume) skip compilation altogether.
"""
from __future__ import annotations

import bisect
import os
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp

from yxanul_jax.config import Config, StageConfig
from yxanul_jax.steps import abstract_train_state, make_train_step


def stage_index(cfg: Config, step: int) -> int:
    """Index of the stage active at optimizer step `step`."""
    starts = [s.start_step for s in cfg.curriculum]
    return max(0, bisect.bisect_right(starts, step) - 1)


def abstract_batch(stage: StageConfig, sharding=None) -> dict:
    """Shapes of one stage's global [A, B, L] batch as the step sees it."""
    shape = (stage.grad_accum_steps, stage.batch_size, stage.seq_len)
    return {k: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
            for k, dt in (("inputs", jnp.int32), ("targets", jnp.int32), ("mask", jnp.float32))}


def compile_stage(cfg: Config, stage: StageConfig, state_shapes=None, mesh=None):
    """The compiled train step of one stage (donates the incoming state's buffers).

    With a mesh, the state is laid out by `sharding.state_shardings` and the batch split over
    data x fsdp; without one, everything sits on the default device.
    """
    state_shapes = state_shapes if state_shapes is not None else abstract_train_state(cfg)
    step = make_train_step(cfg, stage)
    if mesh is None:
        return jax.jit(step, donate_argnums=0).lower(state_shapes, abstract_batch(stage)).compile()
    from yxanul_jax import sharding as sh

    sharded_state, state_sh = sh.sharded_abstract_state(cfg, mesh, state_shapes)
    batch_sh = sh.batch_sharding(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step_fn = jax.jit(step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, replicated),
                      donate_argnums=0)
    return step_fn.lower(sharded_state, abstract_batch(stage, batch_sh)).compile()


class StageCompiler:
    """Compiles stages on demand or ahead of time (one background thread); each stage once."""

    def __init__(self, cfg: Config, hlo_dir: str | None = None, mesh=None):
        self.cfg = cfg
        self.hlo_dir = hlo_dir
        self.mesh = mesh
        self.state_shapes = abstract_train_state(cfg)
        self.compile_counts = [0] * len(cfg.curriculum)
        self._futures: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-compile")

    def _compile(self, i: int):
        compiled = compile_stage(self.cfg, self.cfg.curriculum[i], self.state_shapes, self.mesh)
        self.compile_counts[i] += 1
        if self.hlo_dir:
            os.makedirs(os.path.join(self.hlo_dir, "hlo"), exist_ok=True)
            with open(os.path.join(self.hlo_dir, "hlo", f"stage_{i}.txt"), "w") as fh:
                fh.write(compiled.as_text())
        return compiled

    def prefetch(self, i: int) -> None:
        """Start compiling stage i in the background (no-op if started already)."""
        if i not in self._futures:
            self._futures[i] = self._pool.submit(self._compile, i)

    def get(self, i: int):
        """Stage i's compiled step, waiting for its compilation if needed."""
        self.prefetch(i)
        return self._futures[i].result()


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (default ~/.cache/yxanul_jax/xla, or $YXANUL_CACHE/xla)."""
    root = os.environ.get("YXANUL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "yxanul_jax")
    path = path or os.path.join(root, "xla")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path
