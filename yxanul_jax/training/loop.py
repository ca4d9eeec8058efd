"""The training loop as a library call: `fit(cfg, run_dir) -> TrainResult`, what `python -m yxanul_jax.train` runs.

`fit` checks everything (`session.RunContext.open`), locks and prepares the run directory, starts
from a fresh, restored or imported state, and runs `Loop`: per-stage compiled steps fed by the
train stream, metrics fetched one step behind (the host never stalls the device), a validate-then-
save point at eval.interval / checkpoint.interval / a stop, and the final validation and save. The
rest is hooks (`training/hooks.py`): the metrics log, the profiler, the signal stop, and any the
caller adds (the command adds the end-of-run sample).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from typing import Sequence

import jax
from jax.sharding import Mesh

from yxanul_jax.analysis import accounting, memory
from yxanul_jax.core import console
from yxanul_jax.core.coerce import to_dict
from yxanul_jax.core.config import Config
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import (CHECKPOINT_DIR, CONFIG_FILE, RUNS_DIR, RunLock, check_continuation, check_run_dir,
                                    checkpoint_steps, changes_note, prepare_run_dir)
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.transformer import attention_implementation
from yxanul_jax.training import sharding as sh
from yxanul_jax.training.batch import BatchSpec
from yxanul_jax.training.checkpoint import Checkpointer, none_usable, quarantined, read_checkpoint, resume_meta
from yxanul_jax.training.evaluate import format_eval
from yxanul_jax.training.hooks import Hook, MetricsLog, NullWriter, Profiler, SignalStop, StepInfo
from yxanul_jax.training.integrity import tree_is_finite
from yxanul_jax.training.monitor import (MetricsWriter, Progress, check_wandb, mfu, peak_flops_per_device, run_header,
                                         validation_logged)
from yxanul_jax.training.optim import continuation_lr, continued, warmup_warning
from yxanul_jax.training.session import (RunContext, open_train_stream, resolve_start_model, resume_start,
                                         same_train_state)
from yxanul_jax.training.shares import DomainShares
from yxanul_jax.training.stages import StageCompiler, enable_compilation_cache, stage_index
from yxanul_jax.training.steps import LossFn, TrainState, loss_sums


class TrainingDiverged(UserError):
    """The loss became NaN/inf at `step`. The checkpoints are left as they were; the message (from `fit`) names
    the newest one whose training loss was finite and not diverging (`last_good_step`; None: there is none)."""

    def __init__(self, message: str, step: int, loss: float, last_good_step: int | None = None):
        super().__init__(message)
        self.step, self.loss, self.last_good_step = step, loss, last_good_step


def diverging(loss: float | None, lowest: float | None) -> bool:
    """Whether a training loss says the run was diverging: not finite, or above the lowest loss the run had
    reached by more than half of it and by more than one nat (a spike, not a noisy step)."""
    if loss is None or not math.isfinite(loss):
        return True
    return lowest is not None and loss > lowest + max(1.0, 0.5 * abs(lowest))


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a `fit` call did: the step it reached, whether a signal stopped it (and which), the final
    validation row (None when stopped), and seconds spent outside training (`times`: compile_wait,
    validation, checkpoint, sample; `stage_waits`: per stage, what its first step waited for its compile)."""

    step: int
    interrupted: bool = False
    signal: str | None = None
    validation: dict | None = None
    times: dict = dataclasses.field(default_factory=dict)
    stage_waits: dict = dataclasses.field(default_factory=dict)


class Loop:
    """The steps of one run and what outlives a step: stream, compiled stages, checkpointer, counters."""

    def __init__(self, ctx: RunContext, run_dir: str, ckpt: Checkpointer, hooks: list[Hook] = (),
                 loss: LossFn = loss_sums):
        self.ctx, self.cfg, self.run_dir, self.ckpt = ctx, ctx.cfg, run_dir, ckpt
        self.hooks = list(hooks)
        self.compiler = StageCompiler(self.cfg, run_dir if self.cfg.profile.dump_hlo else None, ctx.layout, loss)
        self.stream = open_train_stream(self.cfg, ctx.train_sets)  # one dataset's, or a mixture's
        self.peak = peak_flops_per_device(jax.devices()[0])
        self.tokens = 0
        self.times = {"compile_wait": 0.0, "validation": 0.0, "checkpoint": 0.0}  # seconds outside training
        self.stage_waits: dict[int, float] = {}  # stage -> seconds its first step waited for its compile
        self._pending = None  # (steps done, stage, device metrics) of the last dispatched step
        self.last_loss: float | None = None  # the training loss of the last step fetched (recorded with a checkpoint)
        self.lowest_loss: float | None = None  # the lowest training loss this run reached (resumes carry it)
        self._last_time, self._paused = 0.0, 0.0  # seconds since _last_time spent outside training

    def call_hooks(self, name: str, *args) -> None:
        """Call `name` on every hook in order (`Hook`'s protocol)."""
        for hook in self.hooks:
            getattr(hook, name)(self, *args)

    def interrupted(self) -> str | None:
        """A reason to abandon what the loop is doing right now (a validation, a compile wait, the sample): the
        first hook's `interrupt`, e.g. a SIGTERM on a single-process run; None to go on."""
        return next((r for r in (h.interrupt(self) for h in self.hooks) if r), None)

    def meta(self, stage: int) -> dict:
        """The checkpoint's JSON beside the arrays: data position, stage, tokens, resolved config, the training
        loss of its last step and the lowest the run had reached (`diverging` reads them), the mesh it ran on."""
        return {"data": self.stream.get_state(), "stage": stage, "tokens": self.tokens, "config": to_dict(self.cfg),
                "train_loss": self.last_loss, "train_loss_lowest": self.lowest_loss,
                "mesh": sh.mesh_layout(self.ctx.mesh),
                **({MUON_WIDTH_KEY: True} if self.cfg.optim.name == "muon" else {})}

    def resume_from(self, meta: dict) -> None:
        self.stream.set_state(meta["data"])
        self.tokens = int(meta.get("tokens", 0))
        self.last_loss, self.lowest_loss = meta.get("train_loss"), meta.get("train_loss_lowest")  # None: older

    # ---- the validate-then-save point

    def validate(self, state: TrainState, step: int) -> dict | None:
        """The validation row of `step`, or None when a signal (`interrupted`) cut it short."""
        t0 = time.perf_counter()
        row = self.ctx.validate(state.params, state.fp8, step, should_stop=lambda: self.interrupted() is not None)
        self.times["validation"] += time.perf_counter() - t0
        if row is not None:
            self.call_hooks("on_validation", step, row)
        return row

    def save(self, state: TrainState, step: int, val_ppl: float | None = None) -> bool:
        t0 = time.perf_counter()
        try:
            if self.ckpt.latest_step() == step:  # saved just before a stop came (a compile wait)
                return False
            if not tree_is_finite(state.params):
                console.warn(f"parameters are not finite at step {step}; not saving")
                return False
            meta = {**self.meta(stage_index(self.cfg, max(step - 1, 0))), "validated": val_ppl is not None}
            return self.ckpt.save(step, state, meta, val_ppl=val_ppl, force=True)
        finally:
            self.times["checkpoint"] += time.perf_counter() - t0

    def point(self, state: TrainState, step: int, validate: bool, final: bool = False) -> dict | None:
        """Validate (if asked) and save `step`, the perplexity attached to the checkpoint; the final point
        reports the row (`report_validation`) and waits for the save to be written. Returns the row, or None
        (not asked, or cut short by a signal: the step is saved all the same, without a perplexity)."""
        t0 = time.perf_counter()
        row = self.validate(state, step) if validate else None
        if row is not None and final:
            report_validation(row, step)  # every process: the values are global, so they must agree
        elif row is not None:
            console.info(f"step {step} validation\n{format_eval(row)}")
        self.save(state, step, None if row is None else row["val/mean/ppl"])
        self.call_hooks("on_save", step)
        if final:
            t1 = time.perf_counter()
            self.ckpt.wait()
            self.times["checkpoint"] += time.perf_counter() - t1
        self._paused += time.perf_counter() - t0
        return row

    # ---- the steps

    def _flush(self) -> None:
        """Fetch the last dispatched step's metrics (the next one is already queued) and hand them to the hooks."""
        if self._pending is None:
            return
        done, si, metrics = self._pending
        self._pending = None
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        now = time.perf_counter()
        stage = self.cfg.curriculum[si]
        # Throughput and MFU count training only; compile waits, validation and saves are timed apart.
        tps = m["step_tokens"] / max(now - self._last_time - self._paused, 1e-9)
        self._last_time, self._paused = now, 0.0
        if not math.isfinite(m["loss"]):
            raise TrainingDiverged(f"loss became {m['loss']} at step {done}", done, m["loss"])
        self.last_loss = m["loss"]
        self.lowest_loss = m["loss"] if self.lowest_loss is None else min(self.lowest_loss, m["loss"])
        self.tokens += int(m["step_tokens"])
        util = mfu(tps, accounting.flops_per_token(self.cfg.model, stage.seq_len), jax.device_count(), self.peak)
        self.call_hooks("on_metrics", StepInfo(done, si, stage.seq_len, m, self.tokens, tps, util))

    def _enter_stage(self, si: int, step: int) -> None:
        cfg, stage = self.cfg, self.cfg.curriculum[si]
        k = memory.with_stage_remat(cfg, stage).train.micro_split
        pieces = f", each micro-batch run as {k} of {stage.batch_size // k} rows (train.micro_split)" if k > 1 else ""
        console.info(f"stage {si} from step {step}: seq_len {stage.seq_len} x batch {stage.batch_size} "
                     f"x accum {stage.grad_accum_steps}{pieces}" + (f" ({stage.description})" if stage.description else ""))
        if si + 1 < len(cfg.curriculum) and cfg.curriculum[si + 1].start_step < cfg.train.steps:
            self.compiler.prefetch(si + 1)  # compile the next stage while this one trains

    def _compiled(self, si: int, step: int, entering: bool, start_step: int):
        """Stage `si`'s compiled step; None when a signal (`interrupted`) came while waiting for its compile
        after this call's first step."""
        t0 = time.perf_counter()
        stop = None if step == start_step else (lambda: self.interrupted() is not None)
        compiled = (self.compiler.first_step(si) if step == 0 else None) or self.compiler.get(si, should_stop=stop)
        waited = time.perf_counter() - t0
        self._paused += waited
        self.times["compile_wait"] += waited
        if entering:
            self.stage_waits[si] = waited
        return compiled

    def run(self, state: TrainState, start_step: int) -> tuple[TrainState, int, str | None]:
        """Train from `start_step` to train.steps: (state, step reached, the stop reason or None)."""
        cfg, total = self.cfg, self.cfg.train.steps
        self._last_time, self._paused = time.perf_counter(), 0.0
        stage_i = stage_index(cfg, start_step)
        self.compiler.prefetch(stage_i)
        self.call_hooks("on_start", state, start_step)
        try:
            for step in range(start_step, total):
                si = stage_index(cfg, step)
                entering = si != stage_i or step == start_step
                if entering:
                    stage_i = si
                    self._flush()  # the last stage's final metrics line comes before this stage's line
                    self._enter_stage(si, step)
                compiled = self._compiled(si, step, entering, start_step)
                if compiled is None:  # stopped while waiting for a compile: `step` steps are done
                    self._flush()
                    self.point(state, step, validate=False)
                    return self._stop(state, step, self.interrupted())
                spec = BatchSpec.of(cfg.curriculum[si])
                rows = self.stream.next_batch(spec.seq_len, spec.rows_per_step)
                batch = sh.global_batch(spec.from_rows(rows), self.ctx.layout.batch)
                self.call_hooks("before_step", step)
                state, metrics = compiled(state, batch)
                self._flush()
                self.ckpt.check()  # a full disk stops the run here, not one interval later
                done = step + 1
                self._pending = (done, si, metrics)
                self.call_hooks("after_step", state, done)
                # every hook is asked, every step: a stop condition may be a collective (SignalStop on several processes)
                reasons = [h.stop_reason(self, done) for h in self.hooks]
                stop = next((r for r in reasons if r), None)
                do_eval = validation_due(cfg, done)
                # the last step is saved once, after the final validation, with its perplexity
                if do_eval or (self.ckpt.should_save(done) and done < total) or stop:
                    self._flush()
                    self.point(state, done, validate=do_eval)
                    stop = stop or self.interrupted()  # a signal during that validation or save
                if stop:
                    return self._stop(state, done, stop)
            self._flush()
            return state, total, None
        finally:
            self.call_hooks("on_loop_end")

    def _stop(self, state: TrainState, done: int, reason: str) -> tuple[TrainState, int, str]:
        """End the steps after `done` was saved: wait for the write, and say how to go on."""
        self.ckpt.wait()
        console.info(f"stopped by {reason} at step {done}; checkpoint saved. Run the same command again to resume.")
        return state, done, reason


def fit(cfg: Config, run_dir: str | None = None, *, checkpoint: str | None = None, overwrite: bool = False,
        mesh: Mesh | None = None, hooks: Sequence[Hook] = (), loss: LossFn = loss_sums) -> TrainResult:
    """Train `cfg` in `run_dir` (default `runs/<model.name>`), resuming from its checkpoints (or starting
    from `checkpoint`), and return a `TrainResult`. `hooks` run after the built-in ones (metrics log,
    profiler, signal stop); `python -m yxanul_jax.train` adds the end-of-run sample
    (`inference.run_sample.EndOfRunSample`). `loss` is what every train step differentiates (`steps.LossFn`; e.g.
    `functools.partial(steps.loss_sums, extra=...)` for terms of your own, logged as `loss/<name>`); validation
    reports the NLL whatever it is.

    Raises UserError for a user mistake (found before anything is written to the run directory) and
    TrainingDiverged (a UserError naming the step, and the newest checkpoint whose training loss was finite and
    not diverging) when the loss becomes NaN/inf; the checkpoints are left intact either way. The run
    directory is locked while it trains.

    It turns on JAX's persistent compilation cache (`stages.enable_compilation_cache`: a folder you configured for
    JAX, else `rundir.cache_root()`'s `xla`, programs compiling 0.5 s or more). That is JAX's own setting, so it
    stays on in this process after `fit` returns: your later compiles are cached there too.
    """
    fp8_lib.check_backend(cfg.fp8)
    check_wandb(cfg)  # monitor.wandb without wandb installed: refused before anything is written
    cfg = dataclasses.replace(cfg, optim=cfg.optim.with_rate())  # the run records its rate, not "the default"
    if checkpoint and cfg.init.from_checkpoint:
        raise UserError("--checkpoint continues a checkpoint's whole train state and init.from_checkpoint starts a "
                        "fresh one from a checkpoint's weights; pass one of them")
    # `~` for library callers (the command's flags expand it themselves)
    run_dir = os.path.expanduser(run_dir or os.path.join(RUNS_DIR, cfg.model.name))
    check_run_dir(run_dir)
    ckpt_dir = os.path.join(run_dir, CHECKPOINT_DIR)
    fresh = overwrite or not (checkpoint_steps(ckpt_dir) or quarantined(ckpt_dir))
    sh.maybe_initialize_distributed(cfg.mesh)  # before anything starts JAX's backend (reading a checkpoint does)
    if not fresh and not checkpoint:
        cfg = resume_start(cfg, run_dir, ckpt_dir)  # the run's own init source; another one is refused, not ignored
    cfg = resolve_start_model(cfg, ckpt_dir, fresh, checkpoint)  # init.*: the sizes of the weights it starts from
    sh.check_same_config(cfg)
    lead = jax.process_index() == 0
    ctx = RunContext.open(cfg, mesh)
    # a missing, damaged or mismatched --checkpoint (or init.from_checkpoint of a fresh start) is refused before the
    # run directory is touched
    explicit = (read_checkpoint(checkpoint, ctx.layout.abstract, expect=same_train_state(cfg, checkpoint))
                if checkpoint else None)
    if explicit is not None and explicit[0] >= cfg.train.steps:  # it would write a run directory, and train nothing
        raise UserError(f"--checkpoint is at step {explicit[0]} and train.steps is {cfg.train.steps}: there is nothing "
                        "to train; pass a larger train.steps (and train.extend=decay or wsd), or --eval-only to "
                        "validate it")
    if explicit is not None:  # settings a resume could not change, and a train.steps change without train.extend
        check_continuation(cfg, explicit[2].get("config"), checkpoint)
        continued(cfg, explicit[2].get("config"), explicit[0])  # refused here, before the run directory exists
    weights = ctx.start_weights() if cfg.init.from_checkpoint and fresh else None
    enable_compilation_cache()
    created = not os.path.exists(run_dir)
    lock = RunLock(run_dir).acquire() if lead else None
    began: list[bool] = []  # set once the steps begin
    try:
        return _fit_locked(ctx, run_dir, lead, explicit, overwrite, list(hooks), weights, loss, began)
    except UserError:
        if created and lead and not began:
            # refused before its first step (a check that needs the restored state, e.g. another dataset's stream
            # position): the folder this call made holds nothing of use, and its config.yaml would contradict the next
            # attempt. Removed under the lock (its release tolerates the missing file)
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()


def _by_stage(cfg: Config, choice) -> str:
    """`choice(stage)` over the curriculum, in words: one value, or each value from the sequence length it starts at."""
    changes: list[tuple[int, str]] = []  # (seq_len, value) where the stages' choice changes
    for s in cfg.curriculum:
        value = choice(s)
        if not changes or changes[-1][1] != value:
            changes.append((s.seq_len, value))
    return changes[0][1] if len(changes) == 1 else ", ".join(f"{v} from seq {n}" for n, v in changes)


def micro_batch_hint(cfg: Config, budget: int) -> str | None:
    """One line where the planner finds that a device of `budget` bytes holds some stage's tokens per step in
    fewer, larger micro-batches (`memory.largest_micro_batches`), else None. Small micro-batches are launch-bound:
    yxanul-270m at one row of 2,048 tokens ran FP8 slower than BF16 on an H200 (docs/BENCHMARKS.md)."""
    notes = memory.batch_notes(cfg, memory.largest_micro_batches(cfg, budget))
    if not notes:
        return None
    more = f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""
    return (f"this GPU holds larger micro-batches: {notes[0]}{more}; the same sums run faster in fewer, larger "
            "micro-batches: `python -m yxanul_jax.plan --config FILE --gpu GPU` prints that config")


MUON_WIDTH_KEY = "muon_width_scaled"
"""Checkpoint meta of a Muon run saved since the width scaling (`optim.width_scale`, commit c6bbace): one saved
before it resumes with a note that the wide kernels' steps change."""


def _mesh_words(layout: dict) -> str:
    n = layout.get("processes", 1)
    return f"data={layout.get('data')} x fsdp={layout.get('fsdp')} over {n} process{'es' if n != 1 else ''}"


def _describe(ctx: RunContext, run_dir: str) -> str:
    cfg = ctx.cfg
    attention = _by_stage(cfg, lambda s: attention_implementation(cfg.model, seq_len=s.seq_len))
    attention += " (auto)" if cfg.model.attention == "auto" else ""
    remat = _by_stage(cfg, lambda s: memory.remat_label((r := memory.with_stage_remat(cfg, s)).model.remat,
                                                        r.train.micro_split))
    remat += " (auto)" if cfg.model.remat == "auto" else ""
    fp8 = f"{cfg.fp8.backend} ({cfg.fp8.scaling})" if cfg.fp8.active else "off"
    return (f"model {cfg.model.name}: {accounting.param_count(cfg):,} parameters, attention {attention}, remat "
            f"{remat}; data "
            f"{cfg.data.train or 'demo corpus'}; FP8 {fp8}; {len(cfg.curriculum)} stage(s); {cfg.train.steps} "
            f"steps; mesh data={ctx.mesh.shape['data']} x fsdp={ctx.mesh.shape['fsdp']}; "
            f"run dir {run_dir} (resolved config in {CONFIG_FILE})")


def _fit_locked(ctx: RunContext, run_dir: str, lead: bool, explicit, overwrite: bool, extra: list[Hook],
                weights=None, loss: LossFn = loss_sums, began: list | None = None) -> TrainResult:
    cfg = ctx.cfg
    ckpt_dir = os.path.join(run_dir, CHECKPOINT_DIR)
    saved = checkpoint_steps(ckpt_dir)
    if not saved and explicit is None and not overwrite and quarantined(ckpt_dir):
        raise UserError(none_usable(ckpt_dir, []))  # every checkpoint was found damaged: refuse again, never step 0
    own = None  # the config saved with this folder's latest checkpoint: where it has no config.yaml, it stands for it
    if explicit is not None or (saved and not overwrite):  # train.steps changed: train.extend's way on, or refused
        saved_config, at = _resume_point(ckpt_dir, saved, explicit)
        if explicit is None:
            own = saved_config
        elif saved and not overwrite:  # --checkpoint from elsewhere into a folder that holds checkpoints of its own
            if saved[-1] > at:  # its first save would come before the folder's latest: refused before any write
                raise UserError(f"--checkpoint starts at step {at}, but run directory '{run_dir}' holds the later step "
                                f"{saved[-1]}, which the steps from {at} on would have to replace; pass a new --run-dir, "
                                "or --overwrite to move this run's files aside")
            own = _resume_point(ckpt_dir, saved, None)[0]
        ctx = dataclasses.replace(ctx, cfg=continued(cfg, saved_config, at))
        cfg = ctx.cfg
    own = own if isinstance(own, dict) and not os.path.exists(os.path.join(run_dir, CONFIG_FILE)) else None
    # A run whose checkpoints already reach train.steps trains nothing: its config is checked, not rewritten.
    finished = explicit is None and not overwrite and bool(saved) and saved[-1] >= cfg.train.steps
    copy = {"tokenizer": ctx.ds.tokenizer_path, "tokenizer_eos": ctx.ds.eos_token}  # the run's copy of the tokenizer
    taken: list = []  # settings that differ from the run's config.yaml, named once the run has started
    if lead:
        prepare_run_dir(run_dir, cfg, overwrite=overwrite, **copy, record=not finished, checkpoint_config=own,
                        changed=taken)
        console.info(run_header(cfg, with_config=False, run_dir=run_dir))
        budget, platform = memory.device_budget()
        if platform == "gpu" and budget is not None and (hint := micro_batch_hint(cfg, budget)):
            console.warn(hint)
    with Checkpointer(ckpt_dir, cfg.checkpoint) as ckpt:  # closed (its last save waited for) however this ends
        state, meta, restored = ctx.restore_or_init(ckpt, explicit, weights)
        start = int(state.step)
        resumed = continued(cfg, meta.get("config"), start) if restored is not None else cfg
        rescheduled = resumed != cfg  # the latest checkpoint was unusable: the schedule goes on from an earlier step
        ctx, cfg = dataclasses.replace(ctx, cfg=resumed), resumed
        if (finished and start < cfg.train.steps or rescheduled) and lead:  # it trains after all / on that schedule
            prepare_run_dir(run_dir, cfg, **copy)
        if lead and start < cfg.train.steps and (warning := warmup_warning(cfg)):
            console.warn(warning)
        if cfg.optim.continue_as != "none" and cfg.optim.continue_from == start and start < cfg.train.steps:
            o = cfg.optim
            how = "down from there" if o.continue_as == "decay" else f"back to the peak {o.peak_lr:.3g}, then down"
            console.info(f"train.extend={o.continue_as}: from step {start} (lr {continuation_lr(o):.3g}) the schedule "
                         f"goes {how} to {o.peak_lr * o.min_lr_ratio:.3g} at step {cfg.train.steps} "
                         "(recorded: optim.continue_*)")
        if restored is not None and not meta.get("validated") and (start >= cfg.train.steps
                                                                   or validation_due(cfg, start)):
            # saved unvalidated (a signal during its validation): validated since, by an earlier rerun?
            meta = {**meta, "validated": sh.lead_says(lead and validation_logged(run_dir, start))}
        # Every start cuts metrics.jsonl (and TensorBoard, by a purge marker) back to the step it starts
        # from: rows of steps a killed run logged after its last checkpoint would otherwise appear twice.
        nothing_to_log = start >= cfg.train.steps and meta.get("validated")  # finished and validated: no writes
        writer = MetricsWriter(run_dir, resume_step=start, cfg=cfg) if lead and not nothing_to_log else NullWriter()
        progress = Progress(cfg.train.steps, every=cfg.train.log_every, stream=None if lead else open(os.devnull, "w"))
        signals = SignalStop()
        mixture = [DomainShares(cfg, writer)] if cfg.data.mixture() is not None else []
        loop = Loop(ctx, run_dir, ckpt, [MetricsLog(cfg, writer, progress), *mixture, Profiler(cfg, run_dir), signals,
                                         *extra], loss)
        try:
            if restored is not None:
                loop.resume_from(meta)
                console.info(f"resumed from step {restored} (stage {meta.get('stage')}, {loop.tokens:,} tokens)")
                if cfg.optim.name == "muon" and not meta.get(MUON_WIDTH_KEY):
                    console.note("this Muon checkpoint does not say it was saved with Muon's width scaling "
                                 "(training/optim.py width_scale, 2026-11-28): if it was saved before, its wide "
                                 "kernels (fan_out > fan_in: gate and up, a fused qkv) step sqrt(fan_out / fan_in) "
                                 "further from here")
                if (was := meta.get("mesh")) and was != (now := sh.mesh_layout(ctx.mesh)):
                    console.note(f"saved on {_mesh_words(was)}, resumed on {_mesh_words(now)}: the same state, "
                                 "resharded; the losses follow an unbroken run's to rounding, not bit for bit")
            if taken:
                console.note(changes_note(taken))
            if own is not None and lead and not finished:  # copied checkpoints, checked and resumed: record the run
                prepare_run_dir(run_dir, cfg, **copy)
            console.info(_describe(ctx, run_dir))
            if began is not None:
                began.append(True)
            return _run(loop, state, start, meta, signals)
        except TrainingDiverged as e:
            raise diverged(e, ckpt, cfg) from None
        finally:
            for hook in loop.hooks:
                hook.close()
            loop.stream.close()


def _resume_point(ckpt_dir: str, steps: list[int], explicit) -> tuple[dict | None, int]:
    """(the resolved config saved with the checkpoint this run will resume from, its step); (None, 0) when none.
    Read-only, metadata only: `explicit`'s, else the latest step whose metadata verifies, as the restore picks; a
    checkpoint of a newer format is refused here, before the run directory is touched."""
    if explicit is not None:
        return explicit[2].get("config"), explicit[0]
    meta, step = resume_meta(ckpt_dir, steps)
    return (meta or {}).get("config"), step


def diverged(e: TrainingDiverged, ckpt: Checkpointer, cfg: Config) -> TrainingDiverged:
    """`e` with the advice: the newest checkpoint whose recorded training loss was finite and not `diverging`,
    and how to go on from it (or that there is none). The loss at step N is computed from the parameters after
    N - 1 steps, so a checkpoint of step `e.step - 1` is never advised: its parameters gave the NaN/inf."""
    with contextlib.suppress(UserError):
        ckpt.wait()  # the last save, committed (or failed) before its meta is read
    good, later = None, []
    for s in reversed(ckpt.all_steps()):
        if s >= e.step - 1:
            later.append(f"step {s}: its parameters gave the loss {e.loss} at step {e.step}")
            continue
        try:
            meta = ckpt.read_meta(s)
        except UserError:
            continue  # unreadable or failing verification: never advised
        loss = meta.get("train_loss")
        if loss is not None and not diverging(loss, meta.get("train_loss_lowest")):
            good = (s, loss)
            break
        later.append(f"step {s}: {'loss not recorded' if loss is None else f'loss {loss:.4g}'}")
    head = f"{e}; stopping, the checkpoints are left as they were."
    lr = cfg.optim.lower_rate()
    if good is None and not later:
        advice = (f"No checkpoint was saved before it: run the same command again with {lr} or a longer "
                  "optim.warmup_steps")
    elif good is None:
        advice = (f"No checkpoint recorded a finite training loss that was not diverging ({'; '.join(later)}): "
                  f"start over with --overwrite and {lr} or a longer optim.warmup_steps")
    elif not later:
        advice = (f"The newest checkpoint whose training loss was finite and not diverging is step {good[0]} (loss "
                  f"{good[1]:.4g}): run the same command again with {lr} to resume from it")
    else:
        advice = (f"The newest checkpoint whose training loss was finite and not diverging is step {good[0]} (loss "
                  f"{good[1]:.4g}; later {'; '.join(later)}): continue from it in a new run directory with {lr}: "
                  f"--checkpoint {os.path.join(ckpt.directory, str(good[0]))} --run-dir NEW_DIR")
    return TrainingDiverged(f"{head} {advice}", e.step, e.loss, good[0] if good else None)


def validation_due(cfg: Config, step: int) -> bool:
    """Whether the run validates after `step` on its way (every eval.interval steps; the last step's final
    validation is apart)."""
    return cfg.eval.interval > 0 and step % cfg.eval.interval == 0 and step < cfg.train.steps


def _run(loop: Loop, state, start: int, meta: dict, signals: SignalStop) -> TrainResult:
    """From `start`: nothing (a finished run; validated now if it was not), or the steps, the final
    validate-then-save point and the `on_end` hooks. A signal during the final validation saves the last
    step unvalidated and stops; one after it skips the `on_end` hooks (the run is finished)."""
    cfg, started = loop.cfg, time.perf_counter()
    finished = start >= cfg.train.steps
    if finished:
        console.info(f"this run already finished: step {start} of train.steps={cfg.train.steps}; to train on, raise "
                     "train.steps (with train.extend=decay or wsd: how the lr schedule goes on from here)")
    row = None
    if not meta.get("validated") and (finished or start and validation_due(cfg, start)):
        # the step was saved before its validation ended (a signal, or a stop at the last step): validated now, as
        # an unbroken run did; logged, so once. Under the signal guard, as every validation of the run is.
        signals.on_start(loop, state, start)
        row = loop.validate(state, start)
        if row is None:
            console.info(f"stopped by {loop.interrupted()} during the validation of step {start}; run the same "
                         "command again to validate it")
            return TrainResult(start, True, signals.signal_name)
        if finished:
            report_validation(row, start)
        else:
            console.info(f"step {start} validation (its run was stopped during it)\n{format_eval(row)}")
        loop.ckpt.attach_metric(start, row["val/mean/ppl"])  # saved without its perplexity: keep_best weighs it now
    if finished:
        return TrainResult(start, validation=row)
    state, step, stop = loop.run(state, start)
    if stop:
        return TrainResult(step, True, signals.signal_name, None, dict(loop.times), dict(loop.stage_waits))
    row = loop.point(state, step, validate=True, final=True)
    why = loop.interrupted()
    if row is None:  # the final validation was cut short by a signal: the last step is saved, not validated
        console.info(f"stopped by {why} during the final validation; step {step} saved. Run the same command "
                     "again to validate it.")
        return TrainResult(step, True, signals.signal_name, None, dict(loop.times), dict(loop.stage_waits))
    if why:
        console.info(f"{why} after the run finished (step {step} validated and saved): the end-of-run hooks are "
                     "skipped")
    else:
        loop.call_hooks("on_end", state, step)
    elapsed, t = time.perf_counter() - started, loop.times
    console.info(f"time: {elapsed:.1f} s in all, {elapsed - sum(t.values()):.1f} s training; outside it compile "
                 f"waits {t['compile_wait']:.1f} s, validation {t['validation']:.1f} s, checkpoints "
                 f"{t['checkpoint']:.1f} s" + (f", sample {t['sample']:.1f} s" if "sample" in t else ""))
    return TrainResult(step, False, None, row, dict(loop.times), dict(loop.stage_waits))


def report_validation(row: dict, step: int) -> None:
    """The validation row on the console: a table, then one JSON line (what scripts parse)."""
    console.info(f"validation at step {step}\n{format_eval(row)}")
    console.info(json.dumps({"step": step, **row}))
