"""What the training loop calls around its steps: the `Hook` protocol and the built-in hooks (metrics log,
profiler, signal stop).

The loop (`training/loop.py`) owns the steps, the data and the validate-then-save points; everything
else is a hook it calls at fixed moments, in the order given:

    on_start(loop, state, step)       before the first step of this call (after a resume: its step)
    before_step(loop, step)           before step `step` is dispatched
    after_step(loop, state, done)     after it is dispatched (`done` = steps taken; the device may still run)
    on_metrics(loop, info)            a step's metrics as host numbers, one step behind (`StepInfo`)
    stop_reason(loop, done) -> str    a reason to save and stop after `done` steps, or None
    interrupt(loop) -> str            a reason to abandon what runs now (a validation, a compile wait, the sample)
                                      and save and stop as soon as possible, or None; asked often, outside steps
    on_loop_end(loop)                 the steps are over (finished, stopped or failed), before the final phase
    on_validation(loop, step, row)    a validation row (at eval.interval and at the end)
    on_save(loop, step)               a validate-then-save point of `step` saved (or refused non-finite parameters)
    on_end(loop, state, step)         the run finished (validated and saved); not after a stop, an error, or a
                                      signal that came during the final phase
    close()                           always, last

A researcher's own hook subclasses `Hook`, overrides what it needs and is passed to `fit(..., hooks=[...])`.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import TYPE_CHECKING

import jax

from yxanul_jax.core import console
from yxanul_jax.core.config import Config
from yxanul_jax.core.rundir import PROFILE_DIR, TERM_PREFIX
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.training.monitor import MetricsWriter, Progress, profile_viewers
from yxanul_jax.training.preemption import SignalGuard, stop_requested
from yxanul_jax.training.steps import TrainState

if TYPE_CHECKING:  # for the hints only: training.loop imports this module (get_type_hints: localns={"Loop": Loop})
    from yxanul_jax.training.loop import Loop


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One step's outcome as host numbers: `metrics` is the train step's dict (loss, lr, grad_norm,
    step_tokens, fp8_*), the rest what the loop measured around it."""

    step: int  # steps taken after this one
    stage: int
    seq_len: int
    metrics: dict
    tokens: int  # training tokens so far
    tokens_per_sec: float
    mfu: float | None


class Hook:
    """Base of the loop's hooks: every method does nothing until overridden (the protocol: module docstring)."""

    def on_start(self, loop: Loop, state: TrainState, step: int) -> None:
        pass

    def before_step(self, loop: Loop, step: int) -> None:
        pass

    def after_step(self, loop: Loop, state: TrainState, done: int) -> None:
        pass

    def on_metrics(self, loop: Loop, info: StepInfo) -> None:
        pass

    def stop_reason(self, loop: Loop, done: int) -> str | None:
        return None

    def interrupt(self, loop: Loop) -> str | None:
        return None

    def on_loop_end(self, loop: Loop) -> None:
        pass

    def on_validation(self, loop: Loop, step: int, row: dict) -> None:
        pass

    def on_save(self, loop: Loop, step: int) -> None:
        pass

    def on_end(self, loop: Loop, state: TrainState, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class NullWriter:
    """Metrics sink of the processes other than 0 (only process 0 writes the run directory)."""

    def write(self, row: dict) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class SaturationWatch:
    """Whether FP8 clipping persists. A step counts as clipping when its `fp8_saturation` reaches
    `fp8.SATURATION_WARN` (some operand's largest values lost two binades); an episode is a run of such steps,
    each within `history` steps (the amax history, fp8.amax_history_len) of the one before. Delayed scaling
    clips at a jump of an amax and its history absorbs it, so a short episode is expected; one that lasts more than `history` steps (first to latest clipping step: for
    clipping at every step, more than `history` consecutive steps) is not, and `update` says so once."""

    def __init__(self, history: int) -> None:
        self.history = history
        self.first = self.last = -1  # the episode's first and latest clipping steps (-1: none yet)
        self.worst = (0.0, -1)  # (ratio, step)
        self.counts: collections.Counter[str] = collections.Counter()  # operand -> its clipping steps
        self.warned = False

    def update(self, step: int, ratio: float, name: str) -> bool:
        """Record step `step`'s largest ratio and the operand it names; True when the warning is due."""
        if ratio < fp8_lib.SATURATION_WARN:
            return False
        if self.last < 0 or step - self.last > self.history:  # a new episode
            self.first, self.worst, self.counts, self.warned = step, (0.0, -1), collections.Counter(), False
        self.last = step
        self.counts[name] += 1
        self.worst = max(self.worst, (ratio, step))
        if self.warned or self.last - self.first + 1 <= self.history:
            return False
        self.warned = True
        return True

    def warning(self, cfg: Config) -> str:
        """The warning's text for the current episode (`fp8.saturation_warning`)."""
        return fp8_lib.saturation_warning(self.first, self.last, self.history, self.worst,
                                          dict(self.counts.most_common()), cfg)


class MetricsLog(Hook):
    """metrics.jsonl + TensorBoard (+ W&B) rows (every train.log_every steps and the last), the progress bar and the
    FP8 saturation warning (once per episode of clipping that outlasts the amax history: `SaturationWatch`).
    `writer` is a `MetricsWriter`, or `NullWriter` on processes other than 0."""

    def __init__(self, cfg: Config, writer: MetricsWriter | NullWriter, progress: Progress) -> None:
        self.cfg, self.writer, self.progress = cfg, writer, progress
        self._names: list[str] = []
        self.saturation = SaturationWatch(cfg.fp8.amax_history_len)

    def on_start(self, loop: Loop, state: TrainState, step: int) -> None:
        self._names = fp8_lib.saturation_names(state.fp8)

    def on_metrics(self, loop: Loop, info: StepInfo) -> None:
        cfg, m = self.cfg, info.metrics
        self.progress.update(info.step, info.stage, info.seq_len, m["loss"], info.tokens_per_sec, info.mfu)
        if "fp8_saturation" in m and self.saturation.update(info.step, float(m["fp8_saturation"]),
                                                             self._names[int(m["fp8_saturation_at"])]):
            console.warn(self.saturation.warning(cfg))
        if info.step % cfg.train.log_every == 0 or info.step == cfg.train.steps:
            self.writer.write({"step": info.step, "stage": info.stage, "seq_len": info.seq_len, "loss": m["loss"],
                               "lr": m["lr"], "grad_norm": m["grad_norm"], "tokens": info.tokens,
                               "tokens_per_sec": info.tokens_per_sec, "mfu": info.mfu,
                               **({"z_loss": m["z_loss"]} if cfg.train.z_loss else {}),
                               **({"fp8_nonfinite": int(m["fp8_nonfinite"])} if "fp8_nonfinite" in m else {}),
                               **{k: float(m[k]) for k in ("fp8_grad_underflow", "fp8_saturation") if k in m},
                               **{k: v for k, v in m.items() if k.startswith(TERM_PREFIX)}})  # a LossFn's own terms

    def on_validation(self, loop: Loop, step: int, row: dict) -> None:
        self.writer.write({"step": step, "tokens": loop.tokens, **row})

    def on_loop_end(self, loop: Loop) -> None:
        self.progress.close()  # the progress line ends before the final validation's table

    def on_save(self, loop: Loop, step: int) -> None:
        self.writer.flush()  # TensorBoard loses nothing a checkpoint covers

    def close(self) -> None:
        self.progress.close()
        self.writer.close()


class Profiler(Hook):
    """A jax.profiler trace of profile.num_steps steps from profile.start_step, into `<run_dir>/profile/`
    (`plugins/profile/<time>/<host>.xplane.pb`, what XProf and TensorBoard's profile plugin read); when it is
    written, one line says where and the commands that open it (`monitor.profile_viewers`). Steps that end
    before the trace's last step (a stop, a shorter run) still write what was traced."""

    def __init__(self, cfg: Config, run_dir: str) -> None:
        self.start, self.num, self.run_dir = cfg.profile.start_step, cfg.profile.num_steps, run_dir
        self.trace_dir = os.path.join(run_dir, PROFILE_DIR)
        self._first: int | None = None  # the first traced step while a trace runs

    def before_step(self, loop: Loop, step: int) -> None:
        if step == self.start:
            jax.profiler.start_trace(self.trace_dir)
            self._first = step

    def after_step(self, loop: Loop, state: TrainState, done: int) -> None:
        if self._first is not None and done == self.start + self.num:
            jax.block_until_ready(state)
            self._stop(done)

    def on_loop_end(self, loop: Loop) -> None:
        if self._first is not None:  # the steps ended inside the trace: keep what it holds
            self._stop(None)

    def _stop(self, done: int | None) -> None:
        jax.profiler.stop_trace()
        steps = f"the {done - self._first} steps after step {self._first}" if done is not None else \
            f"the steps after step {self._first}"
        self._first = None
        console.info("\n".join([f"profile of {steps} written to {self.trace_dir}; open it with",
                                 *(f"  {line}" for line in profile_viewers(self.trace_dir))]))

    def close(self) -> None:
        if self._first is not None:  # a failure between steps: never leave the profiler running
            self._first = None
            jax.profiler.stop_trace()


class SignalStop(Hook):
    """SIGTERM / SIGINT (on any process of a multi-host run) save a checkpoint and stop the loop at one step
    for all processes (`preemption.stop_requested`). The guard stays from the first step (or the validation a
    resumed run does before it) to the end of the run, the final validation, save and `on_end` hooks included:
    on one process a signal also cuts short a validation, a wait for a stage's compile and the end-of-run sample
    (`interrupt`); with several, those run to their end (their collectives need every process), and the stop is
    agreed at a step."""

    def __init__(self) -> None:
        self.guard = SignalGuard()
        self._on = False

    def on_start(self, loop: Loop, state: TrainState, step: int) -> None:
        if not self._on:  # once: a validation before the steps (`loop._run`) may have taken the guard already
            self.guard.__enter__()
            self._on = True

    def stop_reason(self, loop: Loop, done: int) -> str | None:
        if not stop_requested(self.guard, done):
            return None
        return self.guard.signal_name or "a signal to another process"

    @property
    def signal_name(self) -> str | None:
        return self.guard.signal_name

    def interrupt(self, loop: Loop) -> str | None:
        if jax.process_count() > 1 or not self.guard.requested:
            return None
        return self.guard.signal_name

    def close(self) -> None:
        self.guard.__exit__(None, None, None)  # the previous handlers again (restoring twice is harmless)
        self._on = False
