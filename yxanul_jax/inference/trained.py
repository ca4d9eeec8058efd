"""A trained model as the sampling and export commands need it: config, parameters, FP8 state, tokenizer.

`load_trained(run_dir=D)` reads the run's `config.yaml` and restores its latest readable checkpoint;
`load_trained(checkpoint=P)` restores that checkpoint (a directory, or one step's directory) with the
config saved inside it. The tokenizer is the copy the run keeps (`run_dir/tokenizer.json`), else the
training data's (`data.train`'s, or the demo corpus's). Only parameters and FP8 state are read (no
optimizer moments), as host arrays, and nothing in the run is written or moved: loading beside a run
that is still training is safe.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import jax

from yxanul_jax.core.args import user_path
from yxanul_jax.core.config import Config, from_saved, load_config, validate
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import CHECKPOINT_DIR, CONFIG_FILE, TOKENIZER_EOS_FILE, TOKENIZER_FILE
from yxanul_jax.data.tokenizer import LoadedTokenizer, load_tokenizer
from yxanul_jax.training.checkpoint import Checkpointer, require_checkpoint, resolve_checkpoint_path, same_model
from yxanul_jax.training.steps import abstract_train_state


@dataclasses.dataclass
class Trained:
    cfg: Config
    params: dict
    fp8: dict
    step: int
    tokenizer_path: str
    eos_id: int | None = None  # the training data manifest's, when the tokenizer is the dataset's copy

    @property
    def variables(self) -> dict:
        """The Flax variables of `transformer.Yxanul` ({"params", "fp8_meta"?})."""
        return {"params": self.params, **self.fp8}

    def tokenizer(self) -> LoadedTokenizer:
        return load_tokenizer(self.tokenizer_path, eos_id=self.eos_id)


def tokenizer_source(cfg: Config, run_dir: str | None = None) -> tuple[str, int | None]:
    """(the tokenizer.json the run trained with, its EOS id when only a manifest says it): the run directory's copy
    (whose `data.tokenizer.SPECIAL_TOKENS_MAP` beside it names the EOS), else its prepared dataset's, or the demo
    corpus's, with the dataset manifest's EOS id. A run directory from before its copy had that file takes the
    manifest's EOS when its dataset is still there with the same tokenizer.json."""
    if run_dir and os.path.isfile(copy := os.path.join(run_dir, TOKENIZER_FILE)):
        if os.path.isfile(os.path.join(run_dir, TOKENIZER_EOS_FILE)) or not cfg.data.train:
            return copy, None  # (the demo corpus's EOS is the first candidate, what a bare copy guesses)
        with contextlib.suppress(UserError, OSError):
            ds = _training_data(cfg)
            if ds.tokenizer_path and Path(ds.tokenizer_path).read_bytes() == Path(copy).read_bytes():
                return copy, ds.eos_id
        return copy, None
    ds = _training_data(cfg)
    if ds.tokenizer_path is None:
        raise UserError(f"the run's dataset '{cfg.data.train}' has no tokenizer.json; re-prepare it with "
                        "python -m yxanul_jax.prepare")
    return ds.tokenizer_path, ds.eos_id


def _training_data(cfg: Config):
    from yxanul_jax.data.corpus import training_dataset_path
    from yxanul_jax.data.dataset import open_dataset

    return open_dataset(training_dataset_path(cfg.data.train, cfg.model.vocab_size))


def run_tokenizer(cfg: Config, run_dir: str | None = None) -> LoadedTokenizer:
    """The tokenizer the run trained with (`tokenizer_source`), its EOS the one the training data ended documents with."""
    path, eos_id = tokenizer_source(cfg, run_dir)
    return load_tokenizer(path, eos_id=eos_id)


def add_source_args(parser) -> None:
    """`--run-dir` / `--checkpoint`: where the sampling and export commands take a trained model from."""
    parser.add_argument("--run-dir", default=None, type=user_path,
                        help="a training run directory (its latest checkpoint)")
    parser.add_argument("--checkpoint", default=None, type=user_path,
                        help="a checkpoint directory or one step's directory")


def load_trained(run_dir: str | None = None, checkpoint: str | None = None) -> Trained:
    """Restore a trained model from a run directory or a checkpoint (exactly one of them; the
    commands' --run-dir / --checkpoint). Reads only: a run still training there is not disturbed."""
    if bool(run_dir) == bool(checkpoint):
        raise UserError("pass exactly one of a run directory (--run-dir) and a checkpoint (--checkpoint)")
    if run_dir:
        config_path = os.path.join(run_dir, CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise UserError(f"'{run_dir}' is not a run directory (no {CONFIG_FILE}); pass the --run-dir of a "
                            "training run, or --checkpoint PATH")
        cfg = load_config(config_path, run=True)  # a damaged or emptied file: one line naming it (`read_yaml`)
        require_checkpoint(run_dir, "to read")
        directory, step = os.path.join(run_dir, CHECKPOINT_DIR), None
        expect = same_model(cfg.model, lambda key, was, now: (
            f"'{config_path}' says {key}={now} (edited since?); put back {key.split('.', 1)[1]}: {was} there, or pass "
            "--checkpoint with the step's folder, which reads the config saved in it"), fp8=cfg.fp8)
    else:
        directory, step = resolve_checkpoint_path(checkpoint)
        cfg, expect = None, None
        if os.path.basename(directory) == CHECKPOINT_DIR:
            run_dir = os.path.dirname(directory)
    ckpt = Checkpointer(directory, read_only=True)
    try:
        if cfg is None:  # the config saved with the checkpoint
            cfg = validate(from_saved(ckpt.read_meta(step)["config"]))
        step, state, _ = ckpt.restore(abstract_train_state(cfg).model_parts(), step, partial=True, expect=expect)
    finally:
        ckpt.close()
    state = jax.device_get(state)
    return Trained(cfg, state["params"], state["fp8"], int(step), *tokenizer_source(cfg, run_dir))
