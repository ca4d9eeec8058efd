"""Where and how yxanul-jax writes: the run directory's layout (the names below are the only place
they are spelled), its config guard, the cache root, and atomic writes (`atomic_write`, `staged_dir`:
a hidden `.<name>.tmp-<pid>-*` sibling renamed into place; the next writer removes those of dead
processes).

Run directory::

    run_dir/
      config.yaml      resolved config, written atomically; a different config is refused
      tokenizer.json   the training data's tokenizer, so sampling and export need only this folder
      metrics.jsonl    one JSON object per logged step / validation
      tb/              TensorBoard event files (same scalars as metrics.jsonl)
      checkpoints/     Orbax checkpoints (yxanul_jax.training.checkpoint)
        corrupt/       checkpoints that failed verification, moved aside (never deleted)
      profile/         jax.profiler traces (profile.start_step)
      hlo/             optimized HLO of each stage's step (profile.dump_hlo)

Its name (`default_run_dir`, the one place the rule lives; the run header prints `RUN_DIR_RULE`): `--run-dir D`
when given, else `runs/<model.name>`, and `runs/<model.name>-<hash>` when command-line overrides changed the
model of the config file (or of the defaults) but not its name: `<hash>` is the first 8 hex digits of the
SHA-256 of the resolved `model` section, so a modified model never takes (and is then refused by) the
shipped model's run directory, and the same overrides always find their run again. Only `model.*` counts, and
of it not what a resume may change (`model.remat`, `model.attention`, `model.scan_unroll`): `train.steps=5`,
`optim.lr=1e-4` or `model.remat=full` keep `runs/<model.name>`.

Cache (`cache_root()`): `$YXANUL_CACHE`, else `~/.cache/yxanul_jax`; it holds the demo corpus,
tokenized evaluation files and JAX's persistent compilation cache (`xla/`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator

import yaml

from yxanul_jax.core import console
from yxanul_jax.core.coerce import load_yaml, to_dict, to_yaml
from yxanul_jax.core.config import DEFAULT_LR, Config, from_saved, load_config, peak_rate, resumable, weight_fields
from yxanul_jax.core.errors import UserError, one_line, write_error, writing

CACHE_ENV = "YXANUL_CACHE"


def cache_root() -> Path:
    """`$YXANUL_CACHE`, else `~/.cache/yxanul_jax`."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/yxanul_jax").expanduser()


CONFIG_FILE = "config.yaml"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_EOS_FILE = "special_tokens_map.json"
"""Beside tokenizer.json, Hugging Face's file whose `eos_token` names the end-of-text token, which a tokenizer.json
alone does not say (`eos_map`; `data.tokenizer` reads it, and writes it beside every copy it makes)."""
METRICS_FILE = "metrics.jsonl"
TERM_PREFIX = "loss/"
"""Prefix of the metrics.jsonl (and TensorBoard) keys of a train step's own loss terms (`loss/<name>`,
`training.steps.LossFn`)."""
TB_DIR = "tb"
CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt"
PROFILE_DIR = "profile"
HLO_DIR = "hlo"
RUN_ARTIFACTS = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_EOS_FILE, METRICS_FILE, TB_DIR, CHECKPOINT_DIR, PROFILE_DIR,
                 HLO_DIR)
"""What `prepare_run_dir(overwrite=True)` moves aside before a fresh start."""


# --------------------------------------------------------------------------------------------
# Writing without half-written results: a hidden temp sibling, renamed into place when complete


def _temp_sibling(final: Path) -> Path:
    """`.<name>.tmp-<pid>-<random>` next to `final`: hidden, and naming the process that writes it."""
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_stale_temps(final: str | os.PathLike) -> list[Path]:
    """Delete the temp siblings of `final` left by processes that died (killed mid-write); returns them.
    A temp path of a live process (a racing writer) is left alone."""
    final = Path(final).expanduser().absolute()
    prefix = f".{final.name}.tmp-"
    removed = []
    with contextlib.suppress(OSError):
        for p in final.parent.iterdir():
            pid = p.name[len(prefix):].split("-", 1)[0] if p.name.startswith(prefix) else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(pid):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def output_path(path: str | os.PathLike, flag: str = "--output") -> Path:
    """`path` made absolute; UserError when it is empty (it would name the working directory)."""
    if not os.fspath(path):
        raise UserError(f"{flag} is empty; {flag} must name a path to write")
    return Path(path).expanduser().absolute()


def _existing_ancestor(final: Path) -> Path:
    """The nearest of `final`'s folders that exists (what a write would have to create its missing folders in)."""
    ancestor = final.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    return ancestor


def check_output_parent(path: str | os.PathLike, flag: str = "--output") -> None:
    """UserError unless `path`'s folder can be made: its nearest existing ancestor is a writable
    directory (the missing folders are created when it is written) where a file can be created now
    (a hidden probe, removed at once: /proc passes the permission check and refuses new files), and not inside a
    run's checkpoint folder, whose steps training rotates and moves aside (what is written there goes with them)."""
    final = output_path(path, flag)
    real = Path(os.path.realpath(final))  # `..` and links resolved: where the write lands
    managed = next((a for a in (real, *real.parents) if a.name == CHECKPOINT_DIR and (a.parent / CONFIG_FILE).is_file()),
                   None)
    if managed is not None:
        raise UserError(f"{flag} '{path}' is inside the checkpoint folder '{managed}', whose steps training rotates "
                        f"and moves aside, taking what is written there with them; choose a path outside it, e.g. "
                        f"'{managed.parent / final.name}'")
    ancestor = _existing_ancestor(final)
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK):
        what = "is a file" if not ancestor.is_dir() else "is not writable"
        raise UserError(f"{flag} '{path}': '{ancestor}' {what}; choose another {flag}")
    probe = ancestor / _temp_sibling(final).name
    try:
        open(probe, "xb").close()
        probe.unlink()
    except OSError as e:
        raise _cannot_write(e, final) from e


def check_output_file(path: str | os.PathLike, flag: str = "--output") -> Path:
    """The absolute path of a file output (an existing file is replaced), or UserError when it is a folder
    or cannot be written (`check_output_parent`)."""
    final = output_path(path, flag)
    if final.is_dir():
        raise UserError(f"{flag} '{path}' is a folder; pass the path of a file to write")
    check_output_parent(final, flag)
    return final


def check_new_output(path: str | os.PathLike, why: str, flag: str = "--output", *, file: bool = False) -> Path:
    """The absolute path of a new output (a file or folder), or UserError when it exists (an empty
    folder is allowed: the output replaces it; not for a `file`) or cannot be written; `why` says why
    it is never overwritten."""
    final = output_path(path, flag)
    if final.exists() and (file or not final.is_dir() or any(final.iterdir())):
        raise UserError(f"{flag} '{path}' already exists; choose another {flag} or delete it ({why})")
    check_output_parent(final, flag)
    return final


def _cannot_write(e: OSError, final: Path) -> UserError:
    """The one line for an operating-system error while writing `final`, naming `final` (never a temp path):
    `writing`'s for a full or read-only disk, else the system's reason."""
    err = write_error(e, final)
    if err is not None:
        return err
    name = errno.errorcode.get(e.errno, e.errno) if e.errno is not None else type(e).__name__
    return UserError(f"cannot write '{final}': {e.strerror or one_line(e)} ({name}); pass another path")


def _of_output(name, final: Path) -> bool:
    """Whether the path an OSError names (`filename`) is `final`, a folder made for it, or its temp sibling
    (`.<name>.tmp-*`) or a path inside that: the write's own paths, not an input's."""
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    p = Path(os.fsdecode(name)).absolute()
    temp = f".{final.name}.tmp-"
    return p == final or p in final.parents or any(q.parent == final.parent and q.name.startswith(temp)
                                                   for q in (p, *p.parents))


@contextlib.contextmanager
def _naming_output(final: Path) -> Iterator[None]:
    """Inside, an operating-system error about the write's own paths (`_of_output`) is one UserError line naming
    `final`, never the temp path; any other error (an input's) passes unchanged."""
    try:
        yield
    except OSError as e:
        if _of_output(e.filename, final) or _of_output(e.filename2, final):
            raise _cannot_write(e, final) from e
        raise


def atomic_write(path: str, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_report(out_dir: str, stem: str, record: dict, markdown: str) -> None:
    """A script's report: OUT/STEM.json (the record) and OUT/STEM.md (its table), each written atomically;
    then the table and the record as one JSON line on stdout (what every script in scripts/ ends with)."""
    atomic_write(os.path.join(out_dir, f"{stem}.json"), json.dumps(record, indent=2) + "\n")
    atomic_write(os.path.join(out_dir, f"{stem}.md"), markdown)
    print(markdown)
    print(json.dumps(record))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and a rename (a full or read-only
    disk: one UserError line naming `path`, nothing left behind; `~` expanded, as `output_path` checks it)."""
    final = Path(path).expanduser().absolute()
    with writing(final), _naming_output(final), _new_parents(final):
        remove_stale_temps(final)
        tmp = _temp_sibling(final)
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def _new_parents(final: Path) -> Iterator[None]:
    """Make `final`'s missing folders; if the body fails, remove those it made (when still empty)."""
    made, p = [], final.parent
    while not p.exists():
        made.append(p)
        p = p.parent
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for d in made:  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh hidden sibling temp dir; on success rename it to `final`, on any failure delete it.

    Readers never see a half-written `final`; temp dirs of dead processes (a killed earlier run) are
    removed first. If `final` appeared meanwhile (a racing process), raises FileExistsError and
    leaves `final` untouched.
    """
    final = Path(final).expanduser().absolute()
    with writing(final), _naming_output(final), _new_parents(final):  # a write failure: one line naming `final`
        remove_stale_temps(final)
        tmp = _temp_sibling(final)
        tmp.mkdir()
        try:
            yield tmp
            try:
                os.rename(tmp, final)  # atomic; fails if final is a non-empty directory
            except OSError as e:
                raise FileExistsError(f"'{final}' appeared while writing it") from e
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Run directory


RUNS_DIR = "runs"
"""Where `default_run_dir` puts run directories (relative to the working directory)."""
RUN_DIR_RULE = ("runs/<model.name>, with -<hash of the model config> when overrides changed the model; "
                "--run-dir D chooses")
"""`default_run_dir`'s rule in one line: the run header and `--run-dir`'s help show it."""


def default_run_dir(cfg: Config, config_path: str | None) -> str:
    """The run directory of `cfg` when no --run-dir is given (`RUN_DIR_RULE`, this module's docstring):
    `runs/<model.name>`, or `runs/<model.name>-<hash>` when `cfg.model` differs from the model of
    `config_path` (None: the defaults), `<hash>` the first 8 hex digits of the SHA-256 of its resolved fields.
    The model fields a resume may change (`model.remat`, `model.attention`, `model.scan_unroll`) count as the
    file's: the OOM advice `model.remat=full` resumes the run it was given for, not a fresh one in a folder of its
    own. Before 2026-11-29 they counted; a folder named that way, where it exists, is still the run's."""
    base = load_config(config_path).model
    same = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if resumable(f"model.{f.name}")}
    name, legacy = _model_dir(dataclasses.replace(cfg.model, **same), base), _model_dir(cfg.model, base)
    return legacy if legacy != name and os.path.isdir(legacy) else name


def _model_dir(model, base) -> str:
    if model == base:
        return os.path.join(RUNS_DIR, model.name)
    digest = hashlib.sha256(json.dumps(to_dict(model), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join(RUNS_DIR, f"{model.name}-{digest}")


CONFIG_HISTORY_FILE = "config_history.jsonl"
LOCK_FILE = ".lock"
WANDB_ID_FILE = "wandb_run_id"
"""The file holding the run's Weights & Biases run id (`monitor.wandb`), so a resume continues that run."""


ABSENT = "<absent>"
"""`differences`' value of a key one of the two configs lacks."""


def _override(key: str, value: Any) -> str:
    """`key=value` as a command-line override that gives back `value`: a string that would read as another value
    (`yes`, `null`, `3`) or holds a space is quoted."""
    if isinstance(value, str):
        try:
            same = load_yaml(value) == value
        except yaml.YAMLError:
            same = False
        if not same or any(c.isspace() for c in value):
            return f"\"{key}='{value}'\""
    return f"{key}={value}"


def differences(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every difference between two config dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in list(new) + [k for k in old if k not in new]:
            here = f"{key}.{k}" if key else str(k)
            if k not in old or k not in new:
                out.append((here, old.get(k, ABSENT), new.get(k, ABSENT)))
            else:
                out += differences(old[k], new[k], here)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{key}.{i}" if key else str(i))]
    return [] if old == new else [(key or "<root>", old, new)]


def _with_defaults(saved: Any) -> Any:
    """A saved config dict with the keys added since it was written set to their defaults (a field a
    newer version added is no difference; a key whose default changed since takes its old value, `config.from_saved`);
    as saved when it no longer reads as a Config."""
    try:
        return to_dict(from_saved(saved))
    except (UserError, TypeError, ValueError):
        return saved


def _resolved_head(config: Any) -> Any:
    """A config dict with model.head_dim 0 where it equals d_model // n_heads (what 0 resolves to), so two configs
    that spell one head width differently (init.from_hf wrote the width out before it kept 0) do not differ."""
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return config
    try:
        auto = int(model["d_model"]) // max(int(model["n_heads"]), 1)
        if model.get("head_dim") and int(model["head_dim"]) == auto:
            return {**config, "model": {**model, "head_dim": 0}}
    except (KeyError, TypeError, ValueError):
        pass
    return config


def _resolved_lr(config: Any) -> Any:
    """A config dict with an unset optim.lr written as the rate it resolves to (`OptimConfig.peak_lr`: the optimizer's
    own), so that a run saved with the number and one leaving it unset compare by the rate they train at."""
    optim = config.get("optim") if isinstance(config, dict) else None
    if isinstance(optim, dict) and optim.get("lr") is None and optim.get("name") in DEFAULT_LR:
        return {**config, "optim": {**optim, "lr": peak_rate(optim["name"], None)}}
    return config


def checkpoint_steps(directory: str) -> list[int]:
    """Committed Orbax step directories (`<dir>/<int>`) in `directory`, ascending; [] if it is absent."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def check_run_dir(run_dir: str) -> None:
    """UserError when `run_dir`, or the nearest of its folders that exists, is not a directory."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"run directory '{run_dir}' is a file; pass a directory as --run-dir")
    ancestor = _existing_ancestor(Path(run_dir).expanduser().absolute())
    if not ancestor.is_dir():
        raise UserError(f"run directory '{run_dir}': '{ancestor}' is a file; pass a --run-dir that is not inside it")


def read_run_config(config_path: str) -> dict:
    """A run directory's config.yaml as a mapping; UserError when it is unreadable, emptied or not a mapping."""
    try:
        with open(config_path, encoding="utf-8") as fh:
            old = load_yaml(fh)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"'{config_path}' is unreadable ({type(e).__name__}); "
                        "pass a new --run-dir, or --overwrite to start over")
    if old is None:  # emptied: compared with the defaults it would give advice that contradicts itself
        raise UserError(f"'{config_path}' is empty, so the run's model and data are unknown; restore it, pass a "
                        "new --run-dir, or --overwrite to start over")
    if not isinstance(old, dict):  # a list or a scalar: no run's config, nothing to compare
        raise UserError(f"'{config_path}' does not hold a run's config (a YAML {type(old).__name__}, not a mapping "
                        "of sections); pass a new --run-dir, or --overwrite to start over")
    return old


def eos_map(eos_token: str) -> bytes:
    """The TOKENIZER_EOS_FILE that names `eos_token` the end-of-text token."""
    return (json.dumps({"eos_token": eos_token}) + "\n").encode()


def settings_differences(saved: Any, cfg: Config) -> list[tuple[str, Any, Any]]:
    """`differences` of a run's saved resolved config (a dict) and `cfg`: saved defaults filled in, the head and
    the rate resolved alike on both sides; the Muon group's settings (`optim.muon_*`) left out between two AdamW
    configs, which never read them (a changed default of theirs is no change of an AdamW run)."""
    old, now = (_resolved_lr(_resolved_head(c)) for c in (_with_defaults(saved), yaml.safe_load(to_yaml(cfg))))
    diffs = differences(old, now)
    if _optimizer(old) == _optimizer(now) == "adamw":
        diffs = [d for d in diffs if not d[0].startswith("optim.muon_")]
    return diffs


def _optimizer(config: Any) -> Any:
    """A config dict's optim.name (None where it has none)."""
    optim = config.get("optim") if isinstance(config, dict) else None
    return optim.get("name") if isinstance(optim, dict) else None


def _give_back(key: str, was: Any) -> str | None:
    """The override that gives `key` its saved value `was` back, where one override can (not a list, a mapping,
    an empty string or a key the saved config lacked)."""
    return _override(key, was) if isinstance(was, (str, int, float)) and was not in ("", ABSENT) else None


def check_continuation(cfg: Config, saved: Any, path: str) -> None:
    """UserError when `--checkpoint path`, saved with the resolved config `saved` (a dict; None: nothing to compare,
    its arrays are checked when read), would continue its train state under a setting that a resume in its own run
    directory could not change (`config.resumable`), as the run directory's guard refuses them. Its data.train is
    compared by content when the data stream is restored, wherever the data now lies."""
    if not isinstance(saved, dict):
        return
    fixed = [d for d in settings_differences(saved, cfg) if not resumable(d[0]) and not d[0].startswith("data.train")]
    if fixed:
        key, was, now = fixed[0]
        back = f"{give_back}, or " if (give_back := _give_back(key, was)) else ""
        raise UserError(f"--checkpoint {path} was saved with '{key}' {was!r}, not {now!r}, which continuing its train "
                        f"state cannot change; pass {back}init.from_checkpoint={path} instead of --checkpoint to "
                        "start a fresh run (a fresh optimizer, from step 0) from its weights")


def changes_note(diffs: list[tuple[str, Any, Any]]) -> str:
    """The note that settings differing from a run's config.yaml (`differences`) are taken: said, not only recorded,
    since a default changed by an upgrade (optim.muon_lr, 2026-11-28) applies this way too. The keys the trainer
    writes (optim.continue_*) come after those a user sets."""
    chosen = [d for d in diffs if not d[0].startswith("optim.continue_")]
    diffs = chosen + [d for d in diffs if d not in chosen]
    shown = ", ".join(f"{k} {was!r} -> {now!r}" for k, was, now in diffs[:6])
    # a changed default moves a resumed run silently unless it is said how to keep the saved values (each one)
    keep = " ".join(back for k, was, _ in chosen[:6] if (back := f"{k}=null" if was is None else _give_back(k, was)))
    return (f"{len(diffs)} setting(s) differ from the run's {CONFIG_FILE} and are taken from here on: "
            f"{shown}{', ...' if len(diffs) > 6 else ''} (recorded in {CONFIG_HISTORY_FILE})"
            + (f"; to keep the saved values, pass them: {keep}" if keep else ""))


def prepare_run_dir(run_dir: str, cfg: Config, *, overwrite: bool = False, resume: bool = True,
                    tokenizer: str | None = None, tokenizer_eos: str | None = None, record: bool = True,
                    checkpoint_config: dict | None = None, changed: list | None = None) -> str:
    """Create `run_dir`, write its resolved `config.yaml` (and a copy of the `tokenizer` file, when
    given, as `tokenizer.json`, with `tokenizer_eos` named its end-of-text token in TOKENIZER_EOS_FILE beside it),
    and return its checkpoint directory. `record=False`: the same
    checks, nothing written (a finished run asked to train again changes nothing). Settings a resume may change
    that differ are taken, recorded in CONFIG_HISTORY_FILE and said (`changes_note`), or with `changed` (a list)
    appended to it for the caller to say once the run has started.

    * No config there yet: write it, unless the folder holds what a run writes (a metrics file, a tokenizer
      copy, TensorBoard files...) without a config or a checkpoint: not a run this can continue, and its files
      would be overwritten (UserError, unless `overwrite`, which moves them aside). Checkpoints alone (copied from
      elsewhere) are a run: `checkpoint_config`, the resolved config saved with the latest of them, stands for the
      missing config.yaml and is compared as that would be; nothing is written then (the caller calls again
      without it once the run has resumed).
    * The same resolved config: keep it; with `resume` the trainer continues from the checkpoints,
      with `resume=False` existing checkpoints are refused (UserError) rather than clobbered.
    * A different config: UserError naming the first differing key, unless `overwrite`.
    * `overwrite=True`: start over. Existing artifacts (config.yaml, metrics.jsonl, tb/,
      checkpoints/) are moved into `run_dir/replaced-<UTC time>/`, nothing is deleted, and the
      new config is written.
    """
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    check_run_dir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    ckpt_dir = os.path.join(run_dir, CHECKPOINT_DIR)
    text = to_yaml(cfg)
    written, held = os.path.exists(config_path), checkpoint_steps(ckpt_dir)
    copied = checkpoint_config is not None and not written and bool(held)  # checkpoints without their config.yaml
    diffs = []

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
            console.info(f"--overwrite: the previous run's {', '.join(present)} moved to {aside}")
    elif not written and not copied:
        foreign = [name for name in RUN_ARTIFACTS if os.path.exists(os.path.join(run_dir, name))]
        if foreign and not held:  # checkpoints whose config was not read: the restore checks them
            raise UserError(f"run directory '{run_dir}' holds {', '.join(foreign)} but no {CONFIG_FILE}, so it is "
                            "not a run to continue and training would write over them; pass a new --run-dir, or "
                            "--overwrite to move them aside and start over")
    else:  # the run's config: its config.yaml, or for checkpoints copied without it the latest one's own
        old = read_run_config(config_path) if written else checkpoint_config
        diffs = settings_differences(old, cfg)
        if copied:  # maybe with their data at another path: the stream's restore checks the dataset by content
            diffs = [d for d in diffs if not d[0].startswith("data.train")]  # (its fingerprint)
        fixed = [d for d in diffs if not resumable(d[0])]  # config.RESUME marks the others
        if fixed and held:
            key, was, now = fixed[0]
            back = f"{give_back} to resume it as it was, " if (give_back := _give_back(key, was)) else ""
            if key.startswith("model.") and key.split(".")[1] in weight_fields():
                ways = f"pass {back}a new --run-dir, or --overwrite to start over"
            else:  # the same model: its weights can start another run
                ways = (f"pass {back}a new --run-dir with init.from_checkpoint={ckpt_dir} to start from its weights "
                        "(a fresh optimizer, from step 0), or --overwrite to start over")
            raise UserError(f"run directory '{run_dir}' holds a run whose '{key}' is {was!r}, not {now!r}, which a "
                            f"resume cannot change; {ways}")
    if held and not resume and not overwrite:  # (--overwrite moved them aside) refused before anything is written
        raise UserError(f"run directory '{run_dir}' already holds checkpoints (latest step {held[-1]}); "
                        "resume from them, pass a new --run-dir, or --overwrite to start over")
    if diffs and record and written:  # nothing trained yet, or only settings a resume may change: take the new
        changes = {k: [was, now] for k, was, now in diffs}
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with open(os.path.join(run_dir, CONFIG_HISTORY_FILE), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"time": stamp, "changes": changes}, default=str) + "\n")
        atomic_write(config_path, text)
        if changed is None:
            console.note(changes_note(diffs))
        else:  # the caller says so once the run has started (a refusal on the way is then the only line)
            changed.extend(diffs)
    if not record or copied:  # copied checkpoints are recorded once the run has resumed from them (a later call):
        return ckpt_dir  # a refusal on the way leaves no config that contradicts the next attempt
    if not os.path.exists(config_path):
        atomic_write(config_path, text)
    if tokenizer:
        files = {TOKENIZER_FILE: Path(tokenizer).read_bytes()}
        if tokenizer_eos:
            files[TOKENIZER_EOS_FILE] = eos_map(tokenizer_eos)
        for name, data in files.items():
            copy = Path(run_dir, name)
            if not copy.is_file() or copy.read_bytes() != data:
                atomic_write_bytes(str(copy), data)
    return ckpt_dir


class RunLock:
    """`run_dir/.lock` holding this process's PID and host: a second `train` on the same run
    directory is refused while the first lives; a lock left by a dead process is taken over. A run that changed
    nothing else in the folder (a refused start) leaves its times as they were: the lock came and went."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(os.path.abspath(os.path.expanduser(run_dir)), LOCK_FILE)
        self.held = False
        self._times: tuple[tuple[int, int], tuple] | None = None  # the folder's (atime, mtime) before, its state after

    def acquire(self) -> "RunLock":
        import socket

        folder = os.path.dirname(self.path)
        before = os.stat(folder) if os.path.isdir(folder) else None
        os.makedirs(folder, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder and holder.get("host") == me["host"] and _alive(holder.get("pid")):
                    raise UserError(f"run directory '{os.path.dirname(self.path)}' is in use by another train "
                                    f"process (PID {holder['pid']}); wait for it to finish or pass another --run-dir")
                if holder and holder.get("host") != me["host"]:
                    raise UserError(f"run directory '{os.path.dirname(self.path)}' is locked by a process on host "
                                    f"{holder.get('host')} (PID {holder.get('pid')}); if it is gone, delete "
                                    f"{self.path} and run again")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # a dead process's lock: take it over
                before = None  # its going is a change of the folder: its times are not put back
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
            self.held = True
            if before is not None:
                self._times = ((before.st_atime_ns, before.st_mtime_ns), _entries(folder))
            return self
        raise UserError(f"could not take the lock {self.path}; another process keeps recreating it")

    def _holder(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                holder = json.load(fh)
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None  # not a lock this wrote: a dead process's, taken over

    def release(self) -> None:
        if self.held:
            folder = os.path.dirname(self.path)
            try:
                untouched = self._times is not None and _entries(folder) == self._times[1]
            except OSError:  # the folder went (moved or deleted meanwhile): nothing to put back
                untouched = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            if untouched:  # no entry of the folder came or went but the lock: its times as they were
                with contextlib.suppress(OSError):
                    os.utime(folder, ns=self._times[0])
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _entries(folder: str) -> tuple:
    """What says whether a folder's entries changed: its mtime and each name's inode (a file replaced by a rename
    within the clock's tick leaves the mtime as it was, not the inode)."""
    with os.scandir(folder) as it:
        inodes = sorted((e.name, e.inode()) for e in it)
    return os.stat(folder).st_mtime_ns, inodes


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


