"""A trained model as the sampling and export commands need it: config, parameters, FP8 state, tokenizer.

`load_trained(run_dir=D)` reads the run's `config.yaml` and restores its latest readable checkpoint;
`load_trained(checkpoint=P)` restores that checkpoint (a directory, or one step's directory) with the
config saved inside it. The tokenizer is the training data's (`data.train`'s `tokenizer.json`, or
the demo corpus's). Only parameters and FP8 state are restored (no optimizer moments, on the host's
default device).
"""
from __future__ import annotations

import dataclasses
import os

import jax
import yaml

from yxanul_jax.core.config import Config, from_dict, validate
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import CHECKPOINT_DIR, CONFIG_FILE
from yxanul_jax.data.tokenizer import LoadedTokenizer, load_tokenizer
from yxanul_jax.training.checkpoint import Checkpointer, resolve_checkpoint_path
from yxanul_jax.training.steps import abstract_train_state


@dataclasses.dataclass
class Trained:
    cfg: Config
    params: dict
    fp8: dict
    step: int
    tokenizer_path: str

    @property
    def variables(self) -> dict:
        """The Flax variables of `transformer.Yxanul` ({"params", "fp8_meta"?})."""
        return {"params": self.params, **self.fp8}

    def tokenizer(self) -> LoadedTokenizer:
        return load_tokenizer(self.tokenizer_path)


def _config_from_file(path: str) -> Config:
    with open(path, encoding="utf-8") as fh:
        return validate(from_dict(Config, yaml.safe_load(fh)))


def tokenizer_path_of(cfg: Config) -> str:
    """The tokenizer.json the run trained with: its prepared dataset's, or the demo corpus's."""
    from yxanul_jax.data.loader import open_dataset

    if cfg.data.train:
        path = open_dataset(cfg.data.train).tokenizer_path
    else:
        from yxanul_jax.data.corpus import ensure_demo_dataset
        path = open_dataset(ensure_demo_dataset(vocab_size=cfg.model.vocab_size)).tokenizer_path
    if path is None:
        raise UserError(f"the run's dataset '{cfg.data.train}' has no tokenizer.json; re-prepare it with "
                        "python -m yxanul_jax.prepare")
    return path


def add_source_args(parser) -> None:
    """`--run-dir` / `--checkpoint`: where the sampling and export commands take a trained model from."""
    parser.add_argument("--run-dir", default=None, help="a training run directory (its latest checkpoint)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint directory or one step's directory")


def load_trained(run_dir: str | None = None, checkpoint: str | None = None) -> Trained:
    """Restore a trained model from a run directory or a checkpoint (exactly one of them)."""
    if bool(run_dir) == bool(checkpoint):
        raise UserError("pass exactly one of --run-dir DIR and --checkpoint PATH")
    if run_dir:
        config_path = os.path.join(run_dir, CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise UserError(f"'{run_dir}' is not a run directory (no {CONFIG_FILE}); pass the --run-dir of a "
                            "training run, or --checkpoint PATH")
        cfg = _config_from_file(config_path)
        directory, step = os.path.join(run_dir, CHECKPOINT_DIR), None
    else:
        directory, step = resolve_checkpoint_path(checkpoint)
        cfg = None
    ckpt = Checkpointer(directory, Config().checkpoint)
    try:
        if cfg is None:  # the config saved with the checkpoint
            cfg = validate(from_dict(Config, ckpt.read_meta(step)["config"]))
        abstract = abstract_train_state(cfg)
        step, state, _ = ckpt.restore(abstract, step)
    finally:
        ckpt.close()
    params, fp8 = jax.device_get(state.params), jax.device_get(state.fp8)
    return Trained(cfg, params, fp8, int(step), tokenizer_path_of(cfg))
