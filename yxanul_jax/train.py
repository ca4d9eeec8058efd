"""`python -m yxanul_jax.train`: train (or `--eval-only`) a Yxanul model; with no arguments, the tiny
model on the embedded demo corpus (the Python standard library's sources, tokenized on first use).

This module only orchestrates: config -> data -> run directory -> state (fresh or restored) ->
per-stage compiled steps -> loop with one-step-behind metrics, validation, checkpoints and
signal-safe exit. The pieces live in config, data, steps, stages, evaluate, checkpoint, monitor.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time

import jax
import numpy as np

from yxanul_jax.analysis import accounting
from yxanul_jax.core import console
from yxanul_jax.core.config import Config, add_config_args, stream_lanes, config_from_args, load_config, to_dict
from yxanul_jax.core.errors import ArgumentParser, UserError, cli_entry
from yxanul_jax.core.rundir import (CHECKPOINT_DIR, CONFIG_FILE, PROFILE_DIR, RunLock, check_run_dir, checkpoint_steps,
                                    prepare_run_dir)
from yxanul_jax.data.loader import Lanes, PreparedDataset, TokenStream, TrainStream, open_dataset
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.transformer import attention_implementation
from yxanul_jax.training import sharding as sh
from yxanul_jax.training.checkpoint import Checkpointer, SignalGuard, read_checkpoint, tree_is_finite
from yxanul_jax.training.evaluate import evaluate, format_eval, resolve_domains
from yxanul_jax.training.monitor import MetricsWriter, Progress, mfu, peak_flops_per_device, run_header
from yxanul_jax.training.stages import StageCompiler, enable_compilation_cache, stage_index
from yxanul_jax.training.steps import init_train_state, make_eval_step


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the last good checkpoint (step `last_good_step`) is left as it was."""

    last_good_step: int | None = None


def parse_args(argv):
    p = ArgumentParser(prog="python -m yxanul_jax.train", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    p.add_argument("--checkpoint", default=None, help="resume from this checkpoint (directory or step dir)")
    p.add_argument("--eval-only", action="store_true", help="validate the checkpoint and exit")
    p.add_argument("--disable-fp8", action="store_true", help="train the same model in BF16 (fp8.enabled=false)")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/<model.name>)")
    p.add_argument("--overwrite", action="store_true",
                   help="reuse a run directory that holds a different config (old files are moved aside)")
    return p.parse_intermixed_args(argv)  # overrides may come before, between or after flags


def load_run_config(args) -> Config:
    saved = os.path.join(args.run_dir, CONFIG_FILE) if args.run_dir else None
    if args.eval_only and args.config is None and saved and os.path.isfile(saved):
        cfg = load_config(saved, args.overrides)  # validate the run as it was trained
    else:
        cfg = config_from_args(args)
    if args.disable_fp8:
        cfg = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    fp8_lib.check_backend(cfg.fp8)
    return cfg


def open_training_data(cfg: Config) -> PreparedDataset:
    if cfg.data.train:
        ds = open_dataset(cfg.data.train)
    else:
        from yxanul_jax.data.corpus import ensure_demo_dataset

        console.info(f"data: embedded demo corpus (Python stdlib sources, {cfg.model.vocab_size}-entry BPE; "
                     "built on first use)")
        ds = open_dataset(ensure_demo_dataset(vocab_size=cfg.model.vocab_size))
    ds.check_vocab(cfg.model.vocab_size)
    return ds


def restore_or_init(cfg: Config, ckpt: Checkpointer, explicit: tuple | None, layout: sh.StateLayout):
    """(state, meta, restored_from_step or None), laid out as `layout` says; `explicit` is
    `read_checkpoint`'s (state, meta, step) when the run starts from --checkpoint."""
    abstract, shardings = layout.abstract, layout.shardings
    if explicit is not None:
        step, state, meta = explicit
        return state, meta, step
    if ckpt.latest_step() is not None:
        step, state, meta = ckpt.restore(abstract)
        return state, meta, step
    if cfg.init.from_hf:  # a fresh run from a Hugging Face Llama: its weights, fresh moments
        from yxanul_jax.model import hf
        from yxanul_jax.training.optim import make_optimizer

        _, tensors = hf.read_hf(cfg.init.from_hf)
        imported = hf.from_hf(cfg.model, tensors, abstract.params)

        def init_from(key, params):
            state = init_train_state(cfg, key)
            return state.replace(params=params, opt_state=make_optimizer(cfg).init(params))

        state = jax.jit(init_from, out_shardings=shardings)(jax.random.key(cfg.train.seed), imported)
        console.info(f"initialized from the Hugging Face model in {cfg.init.from_hf}")
        return state, {}, None
    init = jax.jit(lambda key: init_train_state(cfg, key), out_shardings=shardings)
    return init(jax.random.key(cfg.train.seed)), {}, None


def _batch_for(stream, stage, sharding) -> dict:
    """The next global [A, B, L] batch of a stage, assembled from this process's rows."""
    b = stream.next_batch(stage.seq_len, stage.batch_size * stage.grad_accum_steps)
    a = stage.grad_accum_steps
    return sh.global_batch({k: np.asarray(v).reshape(a, -1, *v.shape[1:]) for k, v in b.items()}, sharding)


def validate_on_mesh(cfg: Config, eval_step, params, fp8_state, domains, seq_len: int, mesh) -> dict:
    """Validation of the model on every domain, batches split over the mesh and over processes."""
    e = cfg.eval
    return evaluate(eval_step, params, fp8_state, domains, seq_len=seq_len, batch_size=e.batch_size,
                    max_batches=e.max_batches, put=lambda b: sh.global_batch(b, sh.eval_batch_sharding(mesh)),
                    process_index=jax.process_index(), process_count=jax.process_count())


class Trainer:
    """The loop's state that outlives one step: writers, checkpointer, compiled stages, counters."""

    def __init__(self, cfg: Config, ds: PreparedDataset, run_dir: str, ckpt: Checkpointer,
                 layout: sh.StateLayout | None = None, domains: dict | None = None):
        self.cfg, self.ds, self.run_dir, self.ckpt = cfg, ds, run_dir, ckpt
        self.layout = layout if layout is not None else sh.state_layout(cfg, sh.make_mesh(cfg.mesh))
        self.mesh = self.layout.mesh  # checked by check_run before the run directory is touched
        self.batch_sharding = self.layout.batch
        self.domains = domains if domains is not None else resolve_domains(cfg.eval.domains, ds)
        self.eval_step = jax.jit(make_eval_step(cfg))
        self.compiler = StageCompiler(cfg, run_dir if cfg.profile.dump_hlo else None, self.layout)
        self.stream = TrainStream(ds, seed=cfg.data.shuffle_seed, lanes=stream_lanes(cfg),
                                  process_index=jax.process_index(),
                                  process_count=jax.process_count(), num_workers=cfg.data.num_workers,
                                  prefetch=cfg.data.prefetch)
        self.peak = peak_flops_per_device(jax.devices()[0])
        self.tokens = 0
        self.times = {"compile_wait": 0.0, "validation": 0.0, "checkpoint": 0.0}  # seconds outside training
        self.stage_waits: dict[int, float] = {}  # stage -> seconds its first step waited for its compile
        self.stopped_by: str | None = None  # the signal that stopped the run early ("SIGTERM", ...)

    def meta(self, stage: int) -> dict:
        return {"data": self.stream.get_state(), "stage": stage, "tokens": self.tokens, "config": to_dict(self.cfg)}

    def validate(self, state, step: int, seq_len: int, writer: MetricsWriter | None) -> dict:
        row = validate_on_mesh(self.cfg, self.eval_step, state.params, state.fp8, self.domains,
                               eval_seq_len(self.cfg, seq_len), self.mesh)
        if writer is not None:
            writer.write({"step": step, "tokens": self.tokens, **row})
        return row

    def save(self, state, step: int, stage: int, val_ppl: float | None = None) -> bool:
        if not tree_is_finite(state.params):
            console.warn(f"parameters are not finite at step {step}; not saving")
            return False
        return self.ckpt.save(step, state, {**self.meta(stage), "validated": val_ppl is not None}, val_ppl=val_ppl,
                              force=True)

    def run(self, state, start_step: int, writer: MetricsWriter, progress: Progress):
        cfg = self.cfg
        total = cfg.train.steps
        pending = None  # metrics of the last dispatched step, fetched after the next one is queued
        last_time = time.perf_counter()
        paused = 0.0  # seconds since last_time spent waiting for a compile, validating or saving
        stage_i = stage_index(cfg, start_step)
        self.compiler.prefetch(stage_i)
        saturated_names, saturation_warned = fp8_lib.saturation_names(state.fp8), {}  # stage -> ratio warned

        def flush():
            nonlocal pending, last_time, paused
            if pending is None:
                return
            step, si, metrics = pending
            pending = None
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            now = time.perf_counter()
            stage = cfg.curriculum[si]
            # Throughput and MFU count training only; compile waits, validation and saves are timed apart.
            tps = m["step_tokens"] / max(now - last_time - paused, 1e-9)
            last_time, paused = now, 0.0
            if not math.isfinite(m["loss"]):
                raise TrainingDiverged(f"loss became {m['loss']} at step {step}")
            self.tokens += int(m["step_tokens"])
            util = mfu(tps, accounting.flops_per_token(cfg.model, stage.seq_len), jax.device_count(), self.peak)
            progress.update(step, si, stage.seq_len, m["loss"], tps, util)
            ratio = m.get("fp8_saturation", 0.0)
            if ratio >= max(fp8_lib.SATURATION_WARN, 2 * saturation_warned.get(si, 0.0)):
                saturation_warned[si] = ratio  # again in a stage only at twice the ratio; rows carry the metric
                console.warn(fp8_lib.saturation_warning(step, ratio,
                                                        saturated_names[int(m["fp8_saturation_at"])]))
            if step % cfg.train.log_every == 0 or step == total:
                writer.write({"step": step, "stage": si, "seq_len": stage.seq_len, "loss": m["loss"],
                              "lr": m["lr"], "grad_norm": m["grad_norm"], "tokens": self.tokens,
                              "tokens_per_sec": tps, "mfu": util, **({"z_loss": m["z_loss"]} if cfg.train.z_loss else {}),
                              **({"fp8_nonfinite": int(m["fp8_nonfinite"])} if "fp8_nonfinite" in m else {}),
                              **({"fp8_grad_underflow": float(m["fp8_grad_underflow"])}
                                 if "fp8_grad_underflow" in m else {}),
                              **({"fp8_saturation": m["fp8_saturation"]} if "fp8_saturation" in m else {})})

        with SignalGuard() as guard:
            for step in range(start_step, total):
                si = stage_index(cfg, step)
                stage = cfg.curriculum[si]
                entering = si != stage_i or step == start_step
                if entering:
                    stage_i = si
                    console.info(f"stage {si} from step {step}: seq_len {stage.seq_len} x batch {stage.batch_size} "
                                 f"x accum {stage.grad_accum_steps}"
                                 + (f" ({stage.description})" if stage.description else ""))
                    if si + 1 < len(cfg.curriculum) and cfg.curriculum[si + 1].start_step < total:
                        self.compiler.prefetch(si + 1)  # compile the next stage while this one trains
                t0 = time.perf_counter()
                compiled = (self.compiler.first_step(si) if step == 0 else None) or self.compiler.get(si)
                waited = time.perf_counter() - t0
                paused += waited
                self.times["compile_wait"] += waited
                if entering:
                    self.stage_waits[si] = waited
                batch = _batch_for(self.stream, stage, self.batch_sharding)
                if cfg.profile.start_step == step:
                    jax.profiler.start_trace(os.path.join(self.run_dir, PROFILE_DIR))
                state, metrics = compiled(state, batch)
                flush()
                self.ckpt.check()  # a full disk stops the run here, not one interval later
                pending = (step + 1, si, metrics)
                if cfg.profile.start_step >= 0 and step + 1 == cfg.profile.start_step + cfg.profile.num_steps:
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                done = step + 1
                do_eval = cfg.eval.interval > 0 and done % cfg.eval.interval == 0 and done < total
                # the last step is saved once, after the final validation, with its perplexity
                interval_save = self.ckpt.should_save(done) and done < total
                stop = stop_requested(guard, done)
                if do_eval or interval_save or stop:
                    flush()
                    t0 = time.perf_counter()
                    row = self.validate(state, done, stage.seq_len, writer) if do_eval else {}
                    if do_eval:
                        console.info(f"step {done} validation\n{format_eval(row)}")
                    t1 = time.perf_counter()
                    self.save(state, done, si, row.get("val/mean/ppl"))
                    writer.flush()  # TensorBoard loses nothing a checkpoint covers
                    paused += time.perf_counter() - t0
                    self.times["validation"] += t1 - t0
                    self.times["checkpoint"] += time.perf_counter() - t1
                if stop:
                    self.ckpt.wait()
                    self.stopped_by = guard.signal_name
                    by = guard.signal_name or "a signal to another process"
                    console.info(f"stopped by {by} at step {done}; checkpoint saved. "
                                 "Run the same command again to resume.")
                    return state, done, True
            flush()
        return state, cfg.train.steps, False


STOP_CHECK_EVERY = 5  # steps between the processes' agreement on a stop (a small collective)


def stop_requested(guard: SignalGuard, step: int) -> bool:
    """Whether to stop after `step`. One process: its own signal flag. Several: every process
    shares its flag every STOP_CHECK_EVERY steps, so a SIGTERM on any one stops all of them at the
    same step with one checkpoint (a collective save that only some processes enter would hang)."""
    if jax.process_count() == 1:
        return guard.requested
    if step % STOP_CHECK_EVERY:
        return False
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.array([int(guard.requested)], np.int32))
    return bool(np.max(flags))


def print_sample(cfg: Config, state) -> None:
    """A short continuation of `train.sample_prompt` by the model just trained: the run ends in text."""
    from yxanul_jax.data.tokenizer import load_tokenizer
    from yxanul_jax.inference.sampling import generate
    from yxanul_jax.inference.trained import tokenizer_path_of

    tok = load_tokenizer(tokenizer_path_of(cfg))
    prompt = list(map(int, tok.tokenizer.encode(cfg.train.sample_prompt).ids))
    if not prompt or len(prompt) + cfg.train.sample_tokens > cfg.model.max_position:
        return
    variables = {"params": jax.device_get(state.params), **jax.device_get(state.fp8)}
    out = generate(cfg.model, cfg.fp8, variables, [prompt], cfg.train.sample_tokens, temperature=0.8, top_k=40,
                   seed=cfg.train.seed, eos_id=tok.eos_id)["tokens"][0]
    text = tok.tokenizer.decode([t for t in out if t != tok.eos_id])
    console.info(f"sample (train.sample_prompt, {len(out)} tokens, temperature 0.8, top-k 40):\n"
                 f"{cfg.train.sample_prompt}{text}")


def _report_eval(row: dict, step: int) -> None:
    console.info(f"validation at step {step}\n{format_eval(row)}")
    console.info(json.dumps({"step": step, **row}))


class _NullWriter:
    """Metrics sink of the processes other than 0 (only process 0 writes the run directory)."""

    def write(self, row: dict) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def eval_seq_len(cfg: Config, stage_seq_len: int) -> int:
    """Validation row length: eval.seq_len; else, when the best checkpoint is chosen by perplexity,
    the last stage's (one length for every comparison); else the current stage's."""
    if cfg.eval.seq_len:
        return cfg.eval.seq_len
    return cfg.curriculum[-1].seq_len if cfg.checkpoint.keep_best else stage_seq_len


def check_run(cfg: Config, ds: PreparedDataset, mesh) -> dict:
    """Every check that can fail before training, run before anything is written: mesh and batch
    divisibility, evaluation domains (files, columns, templates, vocabulary) and their batches.
    Returns the resolved evaluation domains."""
    sh.check_divisible(cfg, mesh)
    Lanes(TokenStream(ds.split("train"), ds.eos_id, cfg.data.shuffle_seed), stream_lanes(cfg))  # enough tokens
    if cfg.eval.batch_size < 1 or cfg.eval.max_batches < 0:
        raise UserError(f"config keys 'eval.batch_size' ({cfg.eval.batch_size}) must be >= 1 and "
                        f"'eval.max_batches' ({cfg.eval.max_batches}) >= 0")
    if cfg.eval.batch_size % jax.process_count():
        raise UserError(f"config key 'eval.batch_size' ({cfg.eval.batch_size}) must divide evenly over "
                        f"{jax.process_count()} processes")
    return resolve_domains(cfg.eval.domains, ds)


def train(cfg: Config, run_dir: str | None = None, *, checkpoint: str | None = None, overwrite: bool = False,
          mesh=None) -> dict:
    """Train `cfg` in `run_dir` (default `runs/<model.name>`), resuming from its checkpoints (or from
    `checkpoint`), and return {"step", "interrupted", "signal" (what stopped it early: "SIGTERM", ...,
    or None), "validation" (the final row, or None), "times"
    (seconds outside training: compile waits, validation, checkpoints; `stage_waits`: per stage, what
    its first step waited for its compile)}.

    The library form of `python -m yxanul_jax.train` (a notebook or another program calls this).
    Raises UserError for a user mistake (found before anything is written to the run directory)
    and TrainingDiverged when the loss becomes NaN/inf; the last good checkpoint is left intact
    either way. The run directory is locked while it trains.
    """
    fp8_lib.check_backend(cfg.fp8)
    if cfg.init.from_hf:
        from yxanul_jax.model.hf import resolve_init
        cfg = resolve_init(cfg)  # the model's sizes are the checkpoint's
    sh.maybe_initialize_distributed(cfg.mesh)
    mesh = mesh if mesh is not None else sh.make_mesh(cfg.mesh)
    lead = jax.process_index() == 0
    run_dir = run_dir or os.path.join("runs", cfg.model.name)
    check_run_dir(run_dir)
    ds = open_training_data(cfg)
    domains = check_run(cfg, ds, mesh)
    layout = sh.state_layout(cfg, mesh)
    # a missing, damaged or mismatched --checkpoint is refused before the run directory is touched
    explicit = read_checkpoint(checkpoint, layout.abstract) if checkpoint else None
    enable_compilation_cache()
    lock = RunLock(run_dir).acquire() if lead else None
    try:
        return _train_locked(cfg, run_dir, ds, domains, layout, lead, explicit, overwrite)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(cfg, run_dir, ds, domains, layout, lead, explicit, overwrite) -> dict:
    ckpt_dir = os.path.join(run_dir, CHECKPOINT_DIR)
    saved = checkpoint_steps(ckpt_dir)
    # A run whose checkpoints already reach train.steps trains nothing: its config is checked, not rewritten.
    finished = explicit is None and not overwrite and bool(saved) and saved[-1] >= cfg.train.steps

    if lead:
        prepare_run_dir(run_dir, cfg, overwrite=overwrite, tokenizer=ds.tokenizer_path, record=not finished)
        console.info(run_header(cfg, with_config=False))
    ckpt = Checkpointer(ckpt_dir, cfg.checkpoint)
    state, meta, restored = restore_or_init(cfg, ckpt, explicit, layout)
    trainer = Trainer(cfg, ds, run_dir, ckpt, layout, domains)
    start = int(state.step)
    if finished and start < cfg.train.steps and lead:  # its latest checkpoint was unusable: it trains after all
        prepare_run_dir(run_dir, cfg, tokenizer=ds.tokenizer_path)
    if restored is not None:
        trainer.stream.set_state(meta["data"])
        trainer.tokens = int(meta.get("tokens", 0))
        console.info(f"resumed from step {restored} (stage {meta.get('stage')}, {trainer.tokens:,} tokens)")
    attention = attention_implementation(cfg.model) + (" (auto)" if cfg.model.attention == "auto" else "")
    console.info(f"model {cfg.model.name}: {accounting.param_count(cfg):,} parameters, attention {attention}; data "
                 f"{cfg.data.train or 'demo corpus'}; FP8 "
                 f"{f'{cfg.fp8.backend} ({cfg.fp8.scaling})' if cfg.fp8.active else 'off'}; {len(cfg.curriculum)} "
                 f"stage(s); {cfg.train.steps} steps; mesh data={layout.mesh.shape['data']} x "
                 f"fsdp={layout.mesh.shape['fsdp']}; "
                 f"run dir {run_dir} (resolved config in {CONFIG_FILE})")
    # Every start cuts metrics.jsonl (and TensorBoard, by a purge marker) back to the step it starts
    # from: rows of steps a killed run logged after its last checkpoint would otherwise appear twice.
    nothing_to_log = start >= cfg.train.steps and meta.get("validated")  # finished and validated: no writes
    writer = MetricsWriter(run_dir, resume_step=start) if lead and not nothing_to_log else _NullWriter()
    progress = Progress(cfg.train.steps, stream=None if lead else open(os.devnull, "w"))
    row, step, interrupted = None, start, False
    started = time.perf_counter()
    try:
        if start >= cfg.train.steps:
            console.info(f"this run already finished: step {start} of train.steps={cfg.train.steps}; raise "
                         "train.steps to train on")
            if not meta.get("validated"):  # stopped at its last step before validating: do it now
                last_stage = stage_index(cfg, start - 1)
                row = trainer.validate(state, start, cfg.curriculum[last_stage].seq_len, writer)
                _report_eval(row, start)
            return {"step": start, "interrupted": False, "validation": row, "times": {}}
        state, step, interrupted = trainer.run(state, start, writer, progress)
        if not interrupted:
            progress.close()
            last_stage = stage_index(cfg, step - 1)
            t0 = time.perf_counter()
            row = trainer.validate(state, step, cfg.curriculum[last_stage].seq_len, writer)
            _report_eval(row, step)  # every process: the values are global, so they must agree
            t1 = time.perf_counter()
            trainer.save(state, step, last_stage, row["val/mean/ppl"])
            writer.flush()
            ckpt.wait()
            t2 = time.perf_counter()
            trainer.times["validation"] += t1 - t0
            trainer.times["checkpoint"] += t2 - t1
            if lead and cfg.train.sample_tokens:
                print_sample(cfg, state)
                trainer.times["sample"] = time.perf_counter() - t2
        elapsed = time.perf_counter() - started
        outside = sum(trainer.times.values())
        console.info(f"time: {elapsed:.1f} s in all, {elapsed - outside:.1f} s training; outside it compile waits "
                     f"{trainer.times['compile_wait']:.1f} s, validation {trainer.times['validation']:.1f} s, "
                     f"checkpoints {trainer.times['checkpoint']:.1f} s"
                     + (f", sample {trainer.times['sample']:.1f} s" if "sample" in trainer.times else ""))
    except TrainingDiverged as e:
        progress.close()
        e.last_good_step = ckpt.latest_step()
        raise
    finally:
        ckpt.wait()
        ckpt.close()
        writer.close()
        trainer.stream.close()
    return {"step": step, "interrupted": interrupted, "signal": trainer.stopped_by, "validation": row,
            "times": {**trainer.times, "stage_waits": dict(trainer.stage_waits)}}


def default_run_dir(cfg: Config, config_path: str | None) -> str:
    """`runs/<model.name>`; when overrides changed the model but not its name, `runs/<name>-<hash>`,
    so a modified model never takes (and is then refused by) the shipped model's run directory."""
    import hashlib

    shipped = load_config(config_path).model
    if cfg.model == shipped:
        return os.path.join("runs", cfg.model.name)
    digest = hashlib.sha256(json.dumps(to_dict(cfg.model), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join("runs", f"{cfg.model.name}-{digest}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args)
    run_dir = args.run_dir or default_run_dir(cfg, args.config)
    if args.eval_only:
        sh.maybe_initialize_distributed(cfg.mesh)
        ds = open_training_data(cfg)
        enable_compilation_cache()
        return eval_only(cfg, ds, run_dir, args.checkpoint, sh.make_mesh(cfg.mesh))
    try:
        result = train(cfg, run_dir, checkpoint=args.checkpoint, overwrite=args.overwrite)
    except TrainingDiverged as e:
        console.error(f"{e}; stopping. The last good checkpoint (step {e.last_good_step}) is intact; lower "
                      "optim.lr or raise the warmup, then resume from it.")
        return 1
    if result["interrupted"]:  # saved, not finished: 128 + the signal, as a shell reports a process it stopped
        return 128 + int(getattr(signal, result["signal"] or "SIGTERM"))
    return 0


def eval_only(cfg: Config, ds: PreparedDataset, run_dir: str, checkpoint: str | None, mesh) -> int:
    """Validate a checkpoint (explicit, or the run directory's latest) on every domain."""
    if not checkpoint and not checkpoint_steps(os.path.join(run_dir, CHECKPOINT_DIR)):
        raise UserError(f"no checkpoint in run directory '{run_dir}' to validate; train it first, or pass "
                        "--checkpoint PATH")
    step, model, _ = read_checkpoint(checkpoint or os.path.join(run_dir, CHECKPOINT_DIR),
                                     sh.state_layout(cfg, mesh).abstract.model_parts(), partial=True)
    seq_len = eval_seq_len(cfg, cfg.curriculum[stage_index(cfg, max(step - 1, 0))].seq_len)
    row = validate_on_mesh(cfg, jax.jit(make_eval_step(cfg)), model["params"], model["fp8"],
                           resolve_domains(cfg.eval.domains, ds), seq_len, mesh)
    if jax.process_index() == 0:
        _report_eval(row, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
