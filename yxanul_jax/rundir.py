"""Where yxanul-jax writes: the run directory's layout (the names below are the only place they are
spelled), its config guard, and the cache root.

Run directory::

    run_dir/
      config.yaml      resolved config, written atomically; a different config is refused
      metrics.jsonl    one JSON object per logged step / validation
      tb/              TensorBoard event files (same scalars as metrics.jsonl)
      checkpoints/     Orbax checkpoints (yxanul_jax.checkpoint)
      profile/         jax.profiler traces (profile.start_step)
      hlo/             optimized HLO of each stage's step (profile.dump_hlo)

Cache (`cache_root()`): `$YXANUL_CACHE`, else `~/.cache/yxanul_jax`; it holds the demo corpus,
tokenized evaluation files and JAX's persistent compilation cache (`xla/`).
"""
from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from yxanul_jax.config import Config, to_yaml
from yxanul_jax.errors import UserError

CACHE_ENV = "YXANUL_CACHE"


def cache_root() -> Path:
    """`$YXANUL_CACHE`, else `~/.cache/yxanul_jax`."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/yxanul_jax").expanduser()


CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
CHECKPOINT_DIR = "checkpoints"
PROFILE_DIR = "profile"
HLO_DIR = "hlo"
RUN_ARTIFACTS = (CONFIG_FILE, METRICS_FILE, TB_DIR, CHECKPOINT_DIR, PROFILE_DIR, HLO_DIR)
"""What `prepare_run_dir(overwrite=True)` moves aside before a fresh start."""


# --------------------------------------------------------------------------------------------
# Run directory


def atomic_write(path: str, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _first_difference(old: Any, new: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """(dotted key, old value, new value) of the first difference between two config dicts."""
    missing = "<absent>"
    if isinstance(old, dict) and isinstance(new, dict):
        for k in list(new) + [k for k in old if k not in new]:
            here = f"{key}.{k}" if key else str(k)
            if k not in old or k not in new:
                return here, old.get(k, missing), new.get(k, missing)
            found = _first_difference(old[k], new[k], here)
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = _first_difference(a, b, f"{key}.{i}" if key else str(i))
            if found:
                return found
        return None
    return None if old == new else (key or "<root>", old, new)


def checkpoint_steps(directory: str) -> list[int]:
    """Committed Orbax step directories (`<dir>/<int>`) in `directory`, ascending; [] if it is absent."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def prepare_run_dir(run_dir: str, cfg: Config, *, overwrite: bool = False, resume: bool = True) -> str:
    """Create `run_dir`, write its resolved `config.yaml`, and return its checkpoint directory.

    * No config there yet: write it.
    * The same resolved config: keep it; with `resume` the trainer continues from the checkpoints,
      with `resume=False` existing checkpoints are refused (UserError) rather than clobbered.
    * A different config: UserError naming the first differing key, unless `overwrite`.
    * `overwrite=True`: start over. Existing artifacts (config.yaml, metrics.jsonl, tb/,
      checkpoints/) are moved into `run_dir/replaced-<UTC time>/`, nothing is deleted, and the
      new config is written.
    """
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"run directory '{run_dir}' is a file; pass a directory as --run-dir")
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    ckpt_dir = os.path.join(run_dir, CHECKPOINT_DIR)
    text = to_yaml(cfg)

    if overwrite:
        present = [name for name in RUN_ARTIFACTS if os.path.exists(os.path.join(run_dir, name))]
        if present:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
            aside = os.path.join(run_dir, f"replaced-{stamp}")
            n = 1
            while os.path.exists(aside):
                n += 1
                aside = os.path.join(run_dir, f"replaced-{stamp}-{n}")
            os.makedirs(aside)
            for name in present:
                os.replace(os.path.join(run_dir, name), os.path.join(aside, name))
    elif os.path.exists(config_path):
        try:
            with open(config_path, encoding="utf-8") as fh:
                old = yaml.safe_load(fh)
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
            raise UserError(f"'{config_path}' is unreadable ({type(e).__name__}); "
                            "pass a new --run-dir or overwrite=true")
        diff = _first_difference(old, yaml.safe_load(text))
        if diff:
            key, was, now = diff
            raise UserError(f"run directory '{run_dir}' holds a different config: '{key}' is {was!r} there "
                            f"but {now!r} now; pass a new --run-dir or overwrite=true to start over")
    steps = checkpoint_steps(ckpt_dir)
    if steps and not resume:
        raise UserError(f"run directory '{run_dir}' already holds checkpoints (latest step {steps[-1]}); "
                        "resume from them, pass a new --run-dir, or overwrite=true to start over")
    if not os.path.exists(config_path):
        atomic_write(config_path, text)
    return ckpt_dir


