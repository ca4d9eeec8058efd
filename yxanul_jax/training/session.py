"""What a run builds once before its first step: data, mesh, state layout, validation domains; and the state
it starts from (fresh, restored, or a fresh optimizer on the weights of another checkpoint or of Hugging Face).

`RunContext.open(cfg)` runs every check that can fail before anything is written (mesh and batch
divisibility, enough tokens for the stream's lanes, evaluation domains and their batches) and keeps
what it built, so the loop, validation and `--eval-only` use one mesh, one layout and one list of
domains. `evaluate_checkpoint` is `--eval-only` as a library call.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
from jax.sharding import Mesh

from yxanul_jax.core import console
from yxanul_jax.core.coerce import apply_overrides, from_dict, to_dict
from yxanul_jax.core.config import Config, InitConfig, ModelConfig, from_saved, stream_lanes, validate, weight_fields
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import CHECKPOINT_DIR, CONFIG_FILE, cache_root, checkpoint_steps, read_run_config
from yxanul_jax.data.dataset import PreparedDataset, open_dataset
from yxanul_jax.data.loader import BatchStream, TrainStream
from yxanul_jax.data.mixture import MixtureStream
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.transformer import check_attention_platform
from yxanul_jax.training import sharding as sh
from yxanul_jax.training.checkpoint import (Checkpointer, quarantined, read_checkpoint, read_checkpoint_meta,
                                            require_checkpoint, resume_meta, same_model)
from yxanul_jax.training.evaluate import Domain, evaluate, resolve_domains
from yxanul_jax.training.stages import enable_compilation_cache, stage_index
from yxanul_jax.training.steps import check_xla_options, init_train_state, make_eval_step, step_xla_options


def init_source(cfg: Config) -> tuple[str, str]:
    """(the init key, its path) of a run whose weights start from elsewhere (`init.from_hf`, `init.from_checkpoint`),
    else ("", "")."""
    for key in ("from_hf", "from_checkpoint"):
        if getattr(cfg.init, key):
            return f"init.{key}", getattr(cfg.init, key)
    return "", ""


def open_training_sets(cfg: Config) -> dict[str, PreparedDataset]:
    """name -> prepared dataset of a mixture (`data.train` a mapping), each checked against the model's vocabulary;
    UserError naming the dataset whose tokenizer differs from the first one's (one tokenizer for all). One
    dataset, or the demo corpus: {"": ds} (`open_training_data`)."""
    if cfg.data.mixture() is None:
        return {"": open_training_data(cfg)}
    sets: dict[str, PreparedDataset] = {}
    for name, path in cfg.data.train.items():
        ds = open_dataset(path)
        ds.check_vocab(cfg.model.vocab_size, *init_source(cfg))
        if sets:
            first_name, first = next(iter(sets.items()))
            ds.check_tokenizer(first, f"data.train.{name} ('{path}')", f"data.train.{first_name}",
                               "prepare every dataset of a mixture with one tokenizer")
        sets[name] = ds
    return sets


def open_training_data(cfg: Config) -> PreparedDataset:
    """The prepared dataset of a single `data.train`, or the embedded demo corpus (built on first use); a
    mixture goes through `open_training_sets`."""
    from yxanul_jax.data.corpus import training_dataset_path

    if not cfg.data.train:
        console.info(f"data: embedded demo corpus (Python stdlib sources, {cfg.model.vocab_size}-entry BPE; built "
                     f"once, then read from {cache_root()})")
    ds = open_dataset(training_dataset_path(cfg.data.train, cfg.model.vocab_size))
    ds.check_vocab(cfg.model.vocab_size, *init_source(cfg))
    return ds


def validation_seq_len(cfg: Config, step: int) -> int:
    """Validation row length after `step` steps: eval.seq_len; else, when the best checkpoint is chosen by
    perplexity, the last stage's (one length for every comparison); else that of the stage of the last
    step taken."""
    if cfg.eval.seq_len:
        return cfg.eval.seq_len
    if cfg.checkpoint.keep_best:
        return cfg.curriculum[-1].seq_len
    return cfg.curriculum[stage_index(cfg, max(step - 1, 0))].seq_len


def open_train_stream(cfg: Config, train_sets: dict[str, PreparedDataset]) -> BatchStream:
    """The training stream of `data.train` (`train_sets`: `RunContext.train_sets`) on this process: one dataset's
    `TrainStream`, or a mixture's `MixtureStream`."""
    kw = dict(seed=cfg.data.shuffle_seed, lanes=stream_lanes(cfg), process_index=jax.process_index(),
              process_count=jax.process_count(), num_workers=cfg.data.num_workers, prefetch=cfg.data.prefetch)
    mixture = cfg.data.mixture()
    if mixture is None:
        return TrainStream(next(iter(train_sets.values())), **kw)
    return MixtureStream(train_sets, mixture, **kw)


def _check_training(cfg: Config, train_sets: dict[str, PreparedDataset], mesh) -> None:
    """The checks only training needs, on this machine's devices and data: batches divide over the mesh,
    the stream has tokens for its lanes, evaluation batches divide over the processes, XLA takes the step's options."""
    sh.check_divisible(cfg, mesh)
    check_xla_options(cfg)
    open_train_stream(cfg, train_sets).close()  # enough tokens for the lanes, in every dataset
    if cfg.eval.batch_size % jax.process_count():
        raise UserError(f"config key 'eval.batch_size' ({cfg.eval.batch_size}) must divide evenly over "
                        f"{jax.process_count()} processes")


@dataclasses.dataclass
class RunContext:
    """A run's data, mesh, state layout, validation domains and eval step, built once (`open`)."""

    cfg: Config
    ds: PreparedDataset
    layout: sh.StateLayout
    domains: list[Domain]
    eval_step: Callable
    train_sets: dict[str, PreparedDataset] = dataclasses.field(default_factory=dict)
    """name -> dataset of a mixture; one dataset: {"": ds}."""

    @classmethod
    def open(cls, cfg: Config, mesh: Mesh | None = None, *, training: bool = True) -> "RunContext":
        """Open the data and check everything a run (`training`) or a validation needs; writes nothing."""
        check_attention_platform(cfg.model, jax.default_backend())  # training and validation alike
        mesh = mesh if mesh is not None else sh.make_mesh(cfg.mesh)
        train_sets = open_training_sets(cfg)
        ds = next(iter(train_sets.values()))
        if training:
            _check_training(cfg, train_sets, mesh)
        domains = resolve_domains(cfg.eval.domains, ds, in_domain=train_sets if cfg.eval.in_domain else {})
        eval_step = jax.jit(make_eval_step(cfg), compiler_options=step_xla_options(cfg) or None)  # the train step's FP8 form
        return cls(cfg, ds, sh.state_layout(cfg, mesh), domains, eval_step, train_sets)

    @property
    def mesh(self) -> Mesh:
        return self.layout.mesh

    def validate(self, params: Any, fp8_state: Any, step: int,
                 should_stop: Callable[[], bool] | None = None) -> dict | None:
        """Validation of the model after `step` steps on every domain, batches split over the mesh and over
        processes: {"val/<domain>/loss", ".../ppl", ".../tokens", "val/mean/loss", "val/mean/ppl"}; None when
        `should_stop()` (asked before each batch) abandoned it. A batch this process's devices do not divide is
        padded with rows that count nothing (`sharding.padded_rows`)."""
        e = self.cfg.eval
        local_devices, sharding = self.mesh.devices.size // jax.process_count(), sh.eval_batch_sharding(self.mesh)
        return evaluate(self.eval_step, params, fp8_state, self.domains,
                        seq_len=validation_seq_len(self.cfg, step), batch_size=e.batch_size,
                        max_batches=e.max_batches, put=lambda b: sh.global_batch(sh.padded_rows(b, local_devices),
                                                                                 sharding),
                        process_index=jax.process_index(), process_count=jax.process_count(), should_stop=should_stop)

    def start_weights(self) -> Any:
        """init.from_checkpoint's parameters, read onto the mesh (its FP8 state is not taken: the first step
        calibrates a fresh one, so fp8.* may differ); UserError, before anything is written, for a path holding no
        checkpoint, one of another model, or one trained on token ids of another tokenizer than data.train's."""
        path = self.cfg.init.from_checkpoint
        step, read, meta = read_checkpoint(path, {"params": self.layout.abstract.params}, partial=True,
                                           expect=same_model(self.cfg.model), what="init.from_checkpoint")
        theirs = _tokenizer_hashes(meta.get("data"))
        ours = self.ds.manifest.get("tokenizer", {}).get("sha256")
        if ours and theirs and ours not in theirs:
            raise UserError(f"init.from_checkpoint '{path}' was trained on text of another tokenizer (sha256 "
                            f"{sorted(theirs)[0][:12]}...) than data.train's ({ours[:12]}...), so its token ids mean "
                            "other words; prepare the data with that run's tokenizer.json")
        console.info(f"initialized from step {step} of '{path}' (its parameters; a fresh optimizer from step 0)")
        return read["params"]

    def restore_or_init(self, ckpt: Checkpointer, explicit: tuple | None,
                        weights: Any = None) -> tuple[Any, dict, int | None]:
        """(state, meta, restored step or None), laid out on the mesh: `explicit` (`read_checkpoint`'s
        (step, state, meta) of --checkpoint), else the latest readable checkpoint of `ckpt`, else
        `weights` (`start_weights`: init.from_checkpoint's) or init.from_hf's with fresh moments, else a fresh
        state from train.seed."""
        cfg, abstract, shardings = self.cfg, self.layout.abstract, self.layout.shardings
        if explicit is not None:
            step, state, meta = explicit
            return state, meta, step
        if ckpt.latest_step() is not None or quarantined(ckpt.directory):  # none usable: restore() refuses
            step, state, meta = ckpt.restore(abstract, expect=same_model(cfg.model))
            return state, meta, step
        if weights is None and cfg.init.from_hf:  # a fresh run from a Hugging Face Llama: its weights
            from yxanul_jax.model import hf

            _, tensors = hf.read_hf(cfg.init.from_hf)
            weights = hf.from_hf(cfg.model, tensors, abstract.params)
            console.info(f"initialized from the Hugging Face model in {cfg.init.from_hf}")
        if weights is not None:  # fresh moments and FP8 state, step 0
            from yxanul_jax.training.optim import make_optimizer

            def init_from(key, params):
                return init_train_state(cfg, key).replace(params=params, opt_state=make_optimizer(cfg).init(params))

            return jax.jit(init_from, out_shardings=shardings)(jax.random.key(cfg.train.seed), weights), {}, None
        init = jax.jit(lambda key: init_train_state(cfg, key), out_shardings=shardings)
        return init(jax.random.key(cfg.train.seed)), {}, None


def _tokenizer_hashes(data_meta) -> set[str]:
    """Every tokenizer sha256 a checkpoint's saved stream position names (one dataset's, each of a mixture's)."""
    found: set[str] = set()
    if isinstance(data_meta, dict):
        for key, value in data_meta.items():
            if key == "tokenizer_sha256" and isinstance(value, str):
                found.add(value)
            else:
                found |= _tokenizer_hashes(value)
    elif isinstance(data_meta, list):
        for value in data_meta:
            found |= _tokenizer_hashes(value)
    return found


INIT_SIZES = (*weight_fields(), "max_position")
"""The model fields a start from other weights takes from them: what shapes the weights, and (init.from_hf) the
context its config.json gives."""


def _same_path(a: str, b: str) -> bool:
    return a == b or os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def resume_start(cfg: Config, run_dir: str, ckpt_dir: str) -> Config:
    """`cfg` for a run directory that holds checkpoints, with the init source its run started from carried over:
    `init.*` is read at a fresh start only, so config.yaml keeps naming the run's start, however the resume was
    spelled, and its sizes come from its own checkpoints (`resolve_start_model`). Another source given here is
    refused (UserError): the run would resume and the weights named be ignored without a word (a forgotten
    --run-dir, a run meant to start again). After the process group is joined: reading a checkpoint starts JAX."""
    config_path = os.path.join(run_dir, CONFIG_FILE)
    steps = checkpoint_steps(ckpt_dir)
    if os.path.exists(config_path):
        saved = read_run_config(config_path)
    else:  # checkpoints copied without their config.yaml: the latest one's own
        saved = (resume_meta(ckpt_dir, steps)[0] or {}).get("config") if steps else None
    init = saved.get("init") if isinstance(saved, dict) else None
    try:
        started = from_dict(InitConfig, init) if isinstance(init, dict) else InitConfig()
    except UserError:  # a saved section this version cannot read: nothing to carry, nothing to compare
        return cfg
    key, path = init_source(cfg)
    was_key, was = init_source(dataclasses.replace(cfg, init=started))
    if key and not (key == was_key and _same_path(path, was)):
        latest = f" (latest step {steps[-1]})" if steps else ""
        own = f", a run started from {was_key}={was}" if was_key else ""
        back = f"pass {was_key}={was} or leave {key} out" if was_key else f"leave {key} out"
        raise UserError(f"{key}={path} starts a fresh run from those weights, but run directory '{run_dir}' holds "
                        f"checkpoints{latest}{own}, which training would resume instead; pass a new --run-dir, or "
                        f"--overwrite to move that run aside and start from {path}, or {back} to resume it")
    return dataclasses.replace(cfg, init=started)


def resolve_start_model(cfg: Config, ckpt_dir: str, fresh: bool, checkpoint: str | None = None) -> Config:
    """`cfg` with the model's sizes of the weights a run given `init.from_hf` / `init.from_checkpoint` starts from:
    on a fresh start those of the source (one note naming each size this changes), on a resume those of the
    checkpoint it resumes from, `checkpoint` (--checkpoint) or else the run's own latest (`INIT_SIZES`; the source
    is read only once: it may be gone or changed since, or its path relative to another folder). Unchanged without
    an init key, or when no checkpoint can tell (the restore then names the problem). After the process group is
    joined: reading a checkpoint starts JAX."""
    if not (cfg.init.from_hf or cfg.init.from_checkpoint):
        return cfg
    if checkpoint or not fresh:
        meta = read_checkpoint_meta(checkpoint) if checkpoint else resume_meta(ckpt_dir, checkpoint_steps(ckpt_dir))[0]
        saved = (meta or {}).get("config")
        model = saved.get("model") if isinstance(saved, dict) else None
        return _with_sizes(cfg, model, INIT_SIZES) if isinstance(model, dict) else cfg
    if cfg.init.from_hf:
        from yxanul_jax.model.hf import resolve_init

        return resolve_init(cfg)
    path = cfg.init.from_checkpoint
    saved = read_checkpoint_meta(path, what="init.from_checkpoint").get("config")
    model = saved.get("model") if isinstance(saved, dict) else None
    if not isinstance(model, dict):  # saved no config: its arrays' shapes are compared when read
        return cfg
    resolved = _with_sizes(cfg, model, weight_fields())
    replaced = [f"model.{k} {getattr(cfg.model, k)!r} -> {getattr(resolved.model, k)!r}" for k in weight_fields()
                if getattr(cfg.model, k) != getattr(resolved.model, k)]
    if replaced:
        console.note(f"init.from_checkpoint: the model's sizes are those of '{path}': {', '.join(replaced)}")
    return resolved


def _with_sizes(cfg: Config, saved_model: dict, fields) -> Config:
    """`cfg` with `fields` of a saved model config (a dict; a field it lacks keeps `cfg`'s), validated."""
    sizes = {k: saved_model[k] for k in fields if k in saved_model}
    return validate(dataclasses.replace(cfg, model=from_dict(ModelConfig, {**to_dict(cfg.model), **sizes})))


def evaluate_checkpoint(cfg: Config, run_dir: str, checkpoint: str | None = None,
                        mesh: Mesh | None = None) -> tuple[int, dict]:
    """(step, validation row) of a checkpoint (`checkpoint`, else the run directory's latest) on every
    domain; only its parameters and FP8 state are read, nothing is written. The library form of
    `train --eval-only`: it starts what `loop.fit` starts (backend check, multi-host, compilation cache)."""
    fp8_lib.check_backend(cfg.fp8)
    sh.join_processes(cfg)
    enable_compilation_cache()
    if not checkpoint:
        require_checkpoint(run_dir, "to validate")
    ctx = RunContext.open(cfg, mesh, training=False)
    step, model, _ = read_checkpoint(checkpoint or os.path.join(run_dir, CHECKPOINT_DIR),
                                     ctx.layout.abstract.model_parts(), partial=True, expect=same_model(cfg.model))
    return step, ctx.validate(model["params"], model["fp8"], step)


def checkpoint_config(path: str, overrides: list[str] = ()) -> Config:
    """The resolved config saved in `--checkpoint PATH`'s (verified) meta with `overrides` applied; a checkpoint
    without one gives the defaults with `overrides`."""
    saved = read_checkpoint_meta(path).get("config")
    base = from_saved(saved) if isinstance(saved, dict) else Config()
    return validate(apply_overrides(base, list(overrides)))


def same_train_state(cfg: Config, path: str) -> Callable[[dict], str | None]:
    """`same_model`, and for a restore of the whole train state (`--checkpoint PATH`, `path`) the same optimizer:
    its state is that optimizer's (a saved config without `optim.name` was AdamW's, `config.from_saved`)."""
    model = same_model(cfg.model)

    def check(meta: dict) -> str | None:
        wrong = model(meta)
        saved = meta.get("config")
        if wrong or not isinstance(saved, dict):
            return wrong
        try:
            was = from_saved(saved).optim.name
        except (UserError, TypeError, ValueError):
            return None  # an unreadable config: the arrays' comparison names the difference
        now = cfg.optim.name
        if was == now:
            return None
        return (f"was saved with optim.name={was}, but optim.name={now} is given here, and --checkpoint continues "
                f"its optimizer state: pass optim.name={was}, or init.from_checkpoint={path} instead of --checkpoint "
                "to start a fresh optimizer on its weights")
    return check
