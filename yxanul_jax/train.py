"""`python -m yxanul_jax.train`: train (or `--eval-only`) a Yxanul model; with no arguments, the tiny
model on the embedded demo corpus (the Python standard library's sources, tokenized on first use).

The command only parses: flags and config -> run directory -> one library call
(`training.loop.fit`, or `training.session.evaluate_checkpoint` for --eval-only) -> exit code.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import jax

from yxanul_jax.core.args import ArgumentParser, add_config_args, cli_entry, config_from_args, user_path
from yxanul_jax.core.config import Config, MeshConfig, load_config
from yxanul_jax.core.rundir import CONFIG_FILE, RUN_DIR_RULE, default_run_dir
from yxanul_jax.inference.run_sample import EndOfRunSample
from yxanul_jax.training import sharding as sh
from yxanul_jax.training.loop import fit, report_validation
from yxanul_jax.training.session import checkpoint_config, evaluate_checkpoint


def parse_args(argv):
    p = ArgumentParser(prog="python -m yxanul_jax.train", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    p.add_argument("--checkpoint", default=None, type=user_path, help="resume from this checkpoint (directory or step dir)")
    p.add_argument("--eval-only", action="store_true", help="validate the checkpoint and exit")
    p.add_argument("--disable-fp8", action="store_true", help="train the same model in BF16 (fp8.enabled=false)")
    p.add_argument("--run-dir", default=None, type=user_path, help=f"run directory (default: {RUN_DIR_RULE})")
    p.add_argument("--overwrite", action="store_true",
                   help="reuse a run directory that holds a different config (old files are moved aside)")
    return p.parse_intermixed_args(argv)  # overrides may come before, between or after flags


SAVED_GROUP_DROPPED = tuple(f"{key}={json.dumps(getattr(MeshConfig(), key.split('.', 1)[1]))}"
                            for key in sh.PER_PROCESS_KEYS)
"""--eval-only reads a run's saved config without how its processes joined (`sharding.PER_PROCESS_KEYS` back at
their defaults: the group and its timeouts): the processes of this command are its own (the environment's launcher,
or the command line's flags), and join the same way whether the config comes from the run directory or, read after
joining, from --checkpoint."""


def load_run_config(args) -> Config:
    """The config of this command: for --eval-only, the run's saved one (an existing run directory's, else
    --checkpoint's own) with the command line's overrides; else defaults <- --config <- overrides;
    --disable-fp8 last."""
    saved = os.path.join(args.run_dir, CONFIG_FILE) if args.run_dir else None
    if args.eval_only and args.config is None and saved and os.path.isfile(saved):
        # validate the run as it was trained, by the processes this command was started as (a multi-process run's
        # saved group would wait for processes that are not coming; the command line may give its own)
        cfg = load_config(saved, [*SAVED_GROUP_DROPPED, *args.overrides], run=True)
    elif args.eval_only and args.config is None and args.checkpoint:
        # the checkpoint's own config, read through Orbax, which starts JAX: the processes join first, as the command
        # line and the environment say (only the keys of joining: the others apply to the saved config, not the
        # defaults)
        group = [o for o in args.overrides if o.split("=", 1)[0] in sh.PER_PROCESS_KEYS]
        sh.maybe_initialize_distributed(load_config(None, [*SAVED_GROUP_DROPPED, *group]).mesh)
        cfg = checkpoint_config(args.checkpoint, [*SAVED_GROUP_DROPPED, *args.overrides])  # the model it trained as
    else:
        cfg = config_from_args(args)
    if args.disable_fp8:
        cfg = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    return cfg


def eval_only(cfg: Config, run_dir: str, checkpoint: str | None) -> int:
    """Validate a checkpoint (explicit, or the run directory's latest) on every domain and print the row."""
    step, row = evaluate_checkpoint(cfg, run_dir, checkpoint)
    if jax.process_index() == 0:
        report_validation(row, step)
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args)
    run_dir = args.run_dir or default_run_dir(cfg, args.config)
    if args.eval_only:
        return eval_only(cfg, run_dir, args.checkpoint)
    # a NaN/inf loss is a TrainingDiverged: a UserError naming the step and the checkpoint to go on from (exit 2)
    result = fit(cfg, run_dir, checkpoint=args.checkpoint, overwrite=args.overwrite, hooks=[EndOfRunSample()])
    if result.interrupted:  # saved, not finished: 128 + the signal, as a shell reports a process it stopped
        return 128 + int(getattr(signal, result.signal or "SIGTERM", signal.SIGTERM))
    return 0


if __name__ == "__main__":
    sys.exit(main())
