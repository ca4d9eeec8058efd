"""Curriculum stages: which stage a step is in, and one ahead-of-time compiled train step per stage.

Each stage has its own shapes, so its train step is lowered and compiled once (`jit.lower(...)
.compile()` on abstract shapes) and kept. The next stage compiles in a background thread while
the current one trains, so a stage change does not stall; the persistent compilation cache makes
a rerun (or a resume) skip compilation altogether.
"""
from __future__ import annotations

import bisect
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import jax

from yxanul_jax.core.config import Config, StageConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import HLO_DIR, cache_root
from yxanul_jax.training.batch import BatchSpec
from yxanul_jax.training.sharding import StateLayout
from yxanul_jax.training.steps import (LossFn, abstract_train_state, fp8_bootstrap_config, init_train_state, loss_sums,
                                       make_train_step, step_xla_options)


def stage_index(cfg: Config, step: int) -> int:
    """Index of the stage active at optimizer step `step`."""
    starts = [s.start_step for s in cfg.curriculum]
    return max(0, bisect.bisect_right(starts, step) - 1)


def synthetic_inputs(cfg: Config, stage: StageConfig) -> tuple:
    """(a fresh train state on the default device, the stage's `BatchSpec.synthetic` batch): what benchmarks and
    profiles feed a compiled stage."""
    return jax.jit(lambda k: init_train_state(cfg, k))(jax.random.key(0)), BatchSpec.of(stage).synthetic(cfg.model.vocab_size)


SHARED_MEMORY_EXCEEDED = "Shared memory size limit exceeded"  # how XLA's GPU compile reports a Pallas kernel's excess


def compile_stage(cfg: Config, stage: StageConfig, layout: StateLayout | None = None, device: jax.Device | None = None,
                  loss: LossFn = loss_sums) -> jax.stages.Compiled:
    """The compiled train step of one stage (donates the incoming state's buffers), compiled with
    `steps.step_xla_options` (the config's `train.xla_options` and what its FP8 GEMMs need).

    With a `layout` (`sharding.state_layout`: a mesh), the state is laid out by it and the batch
    split over data x fsdp; with a `device` (e.g. a compile-only GPU from
    `gpu_target.compile_device`), everything is placed on it; with neither, everything sits on the
    default device. `loss`: what the step differentiates (`steps.LossFn`).
    """
    lowered = lower_stage(cfg, stage, layout, device, loss)
    try:
        return lowered.compile(compiler_options=step_xla_options(cfg))
    except jax.errors.JaxRuntimeError as e:
        if SHARED_MEMORY_EXCEEDED in str(e):  # a GPU compile of the fused loss's kernels with tiles too large for it
            m = re.search(r"requested (\d+), available:? (\d+)", str(e))
            sizes = f" ({int(m[1]):,} bytes asked, {int(m[2]):,} there)" if m else ""
            raise UserError(f"train.fused_ce_tiles={cfg.train.fused_ce_tiles}: a kernel asks more shared memory than "
                            f"this GPU has{sizes}; use smaller blocks or fewer stages, or train.fused_ce_tiles=default"
                            ) from None
        raise


def lower_stage(cfg: Config, stage: StageConfig, layout: StateLayout | None = None, device: jax.Device | None = None,
                loss: LossFn = loss_sums) -> jax.stages.Lowered:
    """The lowered (not yet compiled) train step of one stage; see `compile_stage`."""
    step = make_train_step(cfg, stage, device, loss)
    if layout is not None:
        step_fn = jax.jit(step, in_shardings=(layout.shardings, layout.batch),
                          out_shardings=(layout.shardings, layout.replicated), donate_argnums=0)
        return step_fn.lower(layout.abstract, BatchSpec.of(stage).abstract(layout.batch))
    state_shapes = abstract_train_state(cfg)
    if device is not None:
        s = jax.sharding.SingleDeviceSharding(device)
        placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state_shapes)
        return jax.jit(step, donate_argnums=0).lower(placed, BatchSpec.of(stage).abstract(s))
    return jax.jit(step, donate_argnums=0).lower(state_shapes, BatchSpec.of(stage).abstract())


def compiled_memory(compiled: jax.stages.Compiled) -> dict:
    """XLA's memory analysis of a compiled step, and the peak it adds up to:
    arguments + outputs - aliased (donated) + temporaries."""
    mem = compiled.memory_analysis()
    out = {"argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": int(mem.output_size_in_bytes),
           "alias_bytes": int(mem.alias_size_in_bytes), "temp_bytes": int(mem.temp_size_in_bytes)}
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    return out


class StageCompiler:
    """Compiles stages on demand or ahead of time (one background thread); each stage once."""

    def __init__(self, cfg: Config, hlo_dir: str | None = None, layout=None, loss: LossFn = loss_sums):
        self.cfg, self.loss = cfg, loss
        self.hlo_dir = hlo_dir
        self.layout = layout
        self.compile_counts = [0] * len(cfg.curriculum)
        self._futures: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-compile")

    def _compile(self, i: int, bootstrap: bool = False) -> jax.stages.Compiled:
        cfg = fp8_bootstrap_config(self.cfg) if bootstrap else self.cfg
        compiled = compile_stage(cfg, cfg.curriculum[i], self.layout, loss=self.loss)
        if not bootstrap:
            self.compile_counts[i] += 1
        if self.hlo_dir:
            os.makedirs(os.path.join(self.hlo_dir, HLO_DIR), exist_ok=True)
            name = f"stage_{i}_fp8_bootstrap.txt" if bootstrap else f"stage_{i}.txt"
            with open(os.path.join(self.hlo_dir, HLO_DIR, name), "w") as fh:
                fh.write(compiled.as_text())
        return compiled

    def first_step(self, i: int) -> jax.stages.Compiled | None:
        """The compiled step for a fresh run's step 0 when it needs its own (delayed FP8 scaling fills
        its amax histories with one `current`-scaled step, `steps.fp8_bootstrap_config`), else None.
        Compiled in the foreground: it runs once, before anything else."""
        if fp8_bootstrap_config(self.cfg) is None:
            return None
        return self._compile(i, bootstrap=True)

    def prefetch(self, i: int) -> None:
        """Start compiling stage i in the background (no-op if started already)."""
        if i not in self._futures:
            self._futures[i] = self._pool.submit(self._compile, i)

    def get(self, i: int, should_stop: Callable[[], bool] | None = None) -> jax.stages.Compiled | None:
        """Stage i's compiled step, waiting for its compilation if needed; None when `should_stop()` (asked
        every 0.2 s of the wait) said to give up (the compile goes on in the background)."""
        self.prefetch(i)
        future = self._futures[i]
        while should_stop is not None:
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                if should_stop():
                    return None
        return future.result()


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache: `path`, else the folder already configured for JAX
    (`JAX_COMPILATION_CACHE_DIR`), else `rundir.cache_root() / "xla"`."""
    path = path or jax.config.jax_compilation_cache_dir or str(cache_root() / "xla")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path
