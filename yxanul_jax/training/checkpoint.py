"""Orbax checkpoints for training: keep the latest N plus the best by validation perplexity, save
asynchronously, and restore with fallback past damaged checkpoints.

One checkpoint is one Orbax step directory `<dir>/<step>/` holding two items written together:

* `state`: a pytree of arrays (params, optimizer state, FP8 state, RNG key data, ...), saved with
  `StandardSave` (tensorstore/OCDBT) and restored bit-exactly into a template;
* `meta`: a JSON dict (data-iterator state, curriculum position, the resolved config, ...) and
  `checksums`: per array, two wrap-around sums of its raw bits (plain and position-weighted),
  computed on device at save, and `meta_checksums`: the SHA-256 of every other meta key and the step
  it was saved as (`yxanul_jax.training.integrity`), and `format_version`: the checkpoint format
  (`integrity.FORMAT_VERSION`; a newer one than this code reads is refused in one line, never moved aside).

A restore verifies what it read: the meta first (no key edited, the step directory not renamed),
then the arrays (checksums equal, every float finite). A checkpoint that fails that, or whose
metadata or arrays cannot be read, is moved aside into `<dir>/corrupt/<step>-<UTC time>/` (never
deleted; the reason written into it as `REASON.txt`) with a warning naming what failed, and
the previous one is tried; saving continues from there. When none is usable the restore refuses, and
so does every later one while `corrupt/` holds them and no checkpoint is left (a run never silently
starts again from step 0): `--overwrite` starts over, `--checkpoint PATH` starts from a chosen one.
A checkpoint saved before metadata checksums existed (no `meta_checksums`) restores as before, its
arrays verified, with a note that its metadata cannot be checked.

Orbax writes into `<step>.orbax-checkpoint-tmp-*` and renames when complete, so a run killed mid-save
leaves the previous checkpoints untouched and the half-written one is ignored (and cleaned up).
A save that cannot be written (disk full, read-only or unwritable folder), found at once or when its
async write finishes, raises one `CheckpointWriteError` naming the step and the step to resume from;
the half-written directory is removed and the complete checkpoints stay.

Retention combines Orbax's `LatestN(max_to_keep)` with `BestN(n=1)` over the metric `val_ppl`
(lower is better): exactly the `max_to_keep` most recent steps survive, plus the best one when it is
older. A step saved without a (finite) perplexity is never "best", but is kept while it is recent.

While a Checkpointer is open, Orbax's log noise is filtered (`yxanul_jax.training.orbax_logs`); the
signal guard that asks for a last checkpoint is `yxanul_jax.training.preemption`.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from yxanul_jax.core import console
from yxanul_jax.core.config import CheckpointConfig, FP8Config, ModelConfig, fp8_mismatch, model_mismatch
from yxanul_jax.core.errors import UserError, one_line
from yxanul_jax.core.rundir import CHECKPOINT_DIR, CORRUPT_DIR, atomic_write, checkpoint_steps
from yxanul_jax.training.integrity import (CHECKSUMS, FORMAT, FORMAT_VERSION, LEGACY, META_CHECKSUMS, format_refusal,
                                           leaf_specs, meta_checksums, mismatch, tree_checksums, verify, verify_meta)
from yxanul_jax.training.orbax_logs import keep_quiet_until_exit, quiet_orbax, write_failure


REASON_FILE = "REASON.txt"
"""Written into a checkpoint moved aside into `corrupt/`: why it could not be used."""

METRIC = "val_ppl"
METRIC_ITEM = "metrics"  # the item (folder and file) Orbax keeps a step's metrics in
"""Name of the metric that Orbax stores with each step and ranks by (lower is better)."""


def _val_ppl(metrics: dict) -> float:
    return metrics[METRIC]


class _Manager(ocp.CheckpointManager):
    """A CheckpointManager for which an unreadable metrics file means "no metric" for that step.

    Orbax reads every step's metrics file when it opens a directory and fails outright on a
    corrupt one, so a single damaged checkpoint would block resuming from the intact ones.
    """

    def _get_metrics(self, step: int):
        try:
            return super()._get_metrics(step)
        except Exception as e:  # noqa: BLE001 - any decode/IO failure means "metric unknown"
            console.warn(f"checkpoint step {step}: metrics file unreadable ({type(e).__name__}: "
                         f"{one_line(e, 300)}); it will not count as best")
            return None


_TENSORSTORE_DETAILS = re.compile(r"\s*See full TensorStore details:.*$")


def _unreadable(e: BaseException) -> str:
    """Why a checkpoint could not be read, in one line: the exception's first line, without the
    Python object repr Orbax appends as "full TensorStore details"."""
    return f"{type(e).__name__}: {_TENSORSTORE_DETAILS.sub('', one_line(e))[:300]}"


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (disk full, read-only or unwritable folder)."""


class CheckpointFormatError(UserError):
    """An intact checkpoint of a format this code does not read (`integrity.format_refusal`: a newer yxanul-jax's)."""


def _restore_args(abstract: Any) -> Any:
    """Orbax restore arguments for a template of `jax.ShapeDtypeStruct`s: each leaf onto its sharding,
    or onto the default device when it has none (as `StandardRestore` does)."""
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = jax.tree.map(lambda a: a if getattr(a, "sharding", None) is not None
                          else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=default), abstract)
    return ocp.checkpoint_utils.construct_restore_args(placed)


# --------------------------------------------------------------------------------------------
# The checkpointer


class Checkpointer:
    """Save and restore training checkpoints in one directory (usually `<run_dir>/checkpoints`).

    Typical use in a training loop::

        ckpt = Checkpointer(ckpt_dir, cfg.checkpoint)
        if ckpt.latest_step() is not None:
            step, state, meta = ckpt.restore(abstract_state)
        ...
        if ckpt.should_save(step) and tree_is_finite(state):   # integrity.tree_is_finite
            ckpt.save(step, state, meta, val_ppl=ppl_or_None)
        ...
        ckpt.close()   # waits for the last async save
    """

    def __init__(self, directory: str, cfg: CheckpointConfig | None = None, *, read_only: bool = False):
        """`read_only`: for readers beside a run (sampling, export, evaluation, another run's start):
        nothing in `directory` is written, removed or moved, so a live run's half-written save stays
        untouched and a damaged step is skipped in place; `save` raises."""
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.cfg = cfg or CheckpointConfig()
        self.read_only = read_only
        # Orbax's log noise is filtered until close(); the filter is shared with other open Checkpointers
        self._quiet = contextlib.ExitStack()
        self._quiet.enter_context(quiet_orbax())
        try:
            self._mngr = self._open_manager()
        except BaseException:
            self._quiet.close()
            raise
        self._pending: int | None = None  # the step whose async save may still be running
        self._failed: CheckpointWriteError | None = None

    def _open_manager(self) -> "_Manager":
        """The Orbax manager: retention and async saving from `cfg`, or a reader that changes nothing."""
        cfg = self.cfg
        if self.read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, best_fn=_val_ppl, best_mode="min",
                                                   enable_async_checkpointing=False, cleanup_tmp_directories=False)
        else:
            policies: list = [ocm.LatestN(n=cfg.max_to_keep)]
            if cfg.keep_best:
                policies.append(ocm.BestN(get_metric_fn=_val_ppl, reverse=True, n=1,
                                          keep_checkpoints_without_metrics=False))
            options = ocp.CheckpointManagerOptions(
                preservation_policy=ocm.AnyPreservationPolicy(policies),
                # best_fn also makes Orbax write each step's metrics to disk, so the best survives a
                # restart; the metric is recorded even with keep_best off (best_step() still answers).
                best_fn=_val_ppl,
                best_mode="min",
                enable_async_checkpointing=cfg.async_save,
                cleanup_tmp_directories=True,
            )
        # Registering the handlers up front lets a freshly opened manager read item metadata
        # (used to check the template) before anything has been saved or restored. PyTreeRestore
        # reads a subset of the saved state (`restore(..., partial=True)`).
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        state_handler, meta_handler = ocp.StandardCheckpointHandler(), ocp.JsonCheckpointHandler()
        registry.add("state", ocp.args.StandardSave, state_handler)
        registry.add("state", ocp.args.StandardRestore, state_handler)
        registry.add("state", ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler())
        registry.add("meta", ocp.args.JsonSave, meta_handler)
        registry.add("meta", ocp.args.JsonRestore, meta_handler)
        return _Manager(self.directory, options=options, handler_registry=registry)

    # ---- queries

    def should_save(self, step: int) -> bool:
        """True at every positive multiple of `interval` (never when interval is 0)."""
        return self.cfg.interval > 0 and step > 0 and step % self.cfg.interval == 0

    def all_steps(self) -> list[int]:
        """Steps present (including one whose async save is still being written), ascending."""
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def metric(self, step: int) -> float | None:
        """The validation perplexity recorded with checkpoint `step` (`METRIC`), or None (saved without one)."""
        return (self._mngr.metrics(step) or {}).get(METRIC)

    def best_step(self) -> int | None:
        """The present step with the lowest finite validation perplexity, or None if none has one."""
        return self._mngr.best_step()

    # ---- saving

    def save(self, step: int, state: Any, meta: dict, *, val_ppl: float | None = None,
             force: bool = False) -> bool:
        """Save `state` (array pytree) and `meta` (JSON dict) as checkpoint `step`.

        Saves when `force` or `should_save(step)`; returns whether a save was started. The latest
        step is not saved again (returns False), so call this after validating that step if
        `val_ppl` should be attached; a step older than the latest raises UserError. With
        `async_save` the arrays are copied to host before this returns (their device buffers may
        then be donated); the files are written in the background (`wait()`/`close()` block until
        done, `check()` asks without blocking). Old checkpoints beyond `max_to_keep` (and not the
        best) are deleted once this one is committed. A write that fails raises CheckpointWriteError.

        `val_ppl`: validation perplexity at this step, or None. A NaN/inf value is recorded as no
        metric, so a diverged model can never become the best. This does not check `state`
        itself: refuse non-finite states with `tree_is_finite` before calling.
        """
        if self.read_only:
            raise ValueError(f"this Checkpointer of '{self.directory}' is read-only; open one without read_only to save")
        if not (force or self.should_save(step)):
            return False
        latest = self._mngr.latest_step()
        if latest is not None and step < latest:
            # Rotation orders checkpoints by step, so an older step saved after a newer one would
            # mix two histories (and later saves would collide with the newer steps).
            raise UserError(f"cannot save step {step} into '{self.directory}': it already holds the later "
                            f"step {latest}; continue from an earlier checkpoint in a new --run-dir")
        if step == latest:
            console.note(f"checkpoint step {step} already exists in {self.directory}; not saving it again")
            return False
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint meta must be a JSON-serializable dict (bytes -> str first): {e}") from e
        metrics = None
        if val_ppl is not None:
            value = float(val_ppl)
            if math.isfinite(value):
                metrics = {METRIC: value}
            else:
                console.warn(f"step {step}: validation perplexity is {value}; saving without a metric so it "
                             "can never be the best checkpoint")
        meta = {**meta, FORMAT: FORMAT_VERSION, CHECKSUMS: tree_checksums(state)}
        meta[META_CHECKSUMS] = meta_checksums(meta, step)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.wait()  # the previous async save, finished first (a failure names its own step)
        with self._writing(step):
            self._mngr.save(step, args=args, metrics=metrics, force=True)
        self._pending = step if self.cfg.async_save else None
        return True

    def attach_metric(self, step: int, val_ppl: float) -> bool:
        """Record `val_ppl` for checkpoint `step` saved without one (a signal cut its validation short, and the
        resumed run validated it): Orbax takes a metric only as it saves, so the metrics item the save would have
        written (`<step>/metrics/metrics`, `METRIC`) is written into the step's folder and the manager re-reads
        its steps; `keep_best` then weighs it as any validated step. Returns whether it was attached (not for a
        step that is not here, has a metric, or a value that is not finite)."""
        if self.read_only or step not in self.all_steps() or self.metric(step) is not None:
            return False
        value = float(val_ppl)
        if not math.isfinite(value):
            return False
        self.wait()
        if jax.process_index() == 0:  # the primary host writes, as Orbax's own saves do
            item = os.path.join(self.directory, str(step), METRIC_ITEM)
            os.makedirs(item, exist_ok=True)
            atomic_write(os.path.join(item, METRIC_ITEM), json.dumps({METRIC: value}))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"yxanul attach_metric {step}")
        self._mngr.reload()
        return True

    @contextlib.contextmanager
    def _writing(self, step: int | None):
        """Turn a failed write (here or in an async save finishing now) into one CheckpointWriteError:
        the partial step directory is removed, the complete checkpoints stay, and later waits and the
        close do not raise it again."""
        if self._failed is not None:
            raise self._failed
        try:
            yield
        except Exception as e:  # noqa: BLE001 - only write failures are translated; the rest re-raised
            reason = write_failure(e)
            if reason is None:
                raise
            self._remove_partial()
            # Orbax's abandoned writes go on failing after close(), until the process exits
            keep_quiet_until_exit()
            done = checkpoint_steps(self.directory)
            resume = (f"run the same command again to resume from step {done[-1]}, the last complete checkpoint"
                      if done else "run the same command again (no checkpoint was completed)")
            what = f"checkpoint step {step}" if step is not None else "a checkpoint"
            self._failed = CheckpointWriteError(f"writing {what} into '{self.directory}' failed: {reason}; free "
                                                f"space or make the folder writable, then {resume}")
            raise self._failed from None

    def _remove_partial(self) -> None:
        """Delete the half-written `<step>.orbax-checkpoint-tmp*` directories (process 0), freeing space."""
        if jax.process_index() != 0 or not os.path.isdir(self.directory):
            return
        for name in os.listdir(self.directory):
            if ".orbax-checkpoint-tmp" in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    # ---- restoring

    def restore(self, abstract_state: Any, step: int | None = None, *, partial: bool = False,
                expect: Callable[[dict], str | None] | None = None) -> tuple[int, Any, dict]:
        """Restore checkpoint `step` (None: the latest usable one) into `abstract_state`'s layout.

        `partial=True`: `abstract_state` is a dict of some of the saved state's top-level parts (e.g.
        `{"params": ..., "fp8": ...}` for sampling) and only those are read, each checked as below.

        `abstract_state` is a pytree like the saved state whose leaves are `jax.ShapeDtypeStruct`
        (with `.sharding` for a sharded restore; none means the default device), `jax.Array`
        (restored with its sharding) or `np.ndarray` (restored as numpy). Shapes and dtypes must
        equal the saved ones: Orbax would otherwise cast silently, so a mismatch raises UserError
        (usually a different model config). Values come back bit-exact.

        `expect(meta)`: why this checkpoint's (verified) meta does not fit the caller, or None; a reason
        raises UserError "checkpoint step N in 'DIR' <reason>" before any array is read (the model
        config a caller was given differs from the one saved: a mistake, not a damaged checkpoint).

        With `step=None`, an unusable checkpoint (unreadable, or its meta or arrays fail verification)
        is skipped with a warning naming the step and what failed, and the previous one is tried, and
        so on. Raises UserError when the directory holds no checkpoint, when none is usable (also on
        every later call, while the damaged ones sit in `corrupt/`), or when the requested `step` is
        missing or unusable: a run never silently restarts from step 0.

        Returns `(step, state, meta)` (the meta without its checksums and format version). A read-only
        Checkpointer leaves an unusable step in place.
        """
        self._mngr.reload()  # another process may have written here since we opened it
        present = self.all_steps()
        if step is not None:
            if step not in present:
                raise UserError(f"checkpoint step {step} not found in '{self.directory}'; "
                                f"steps present: {present or 'none'}")
            candidates = [step]
        else:
            if not present:
                if quarantined(self.directory):
                    raise UserError(none_usable(self.directory, [], read_only=self.read_only))
                raise UserError(f"no checkpoint in '{self.directory}'; pass --checkpoint with a "
                                "checkpoint directory or step directory")
            candidates = present[::-1]
        wanted = leaf_specs(abstract_state)
        failures, skipped = [], []  # skipped: the warnings of the steps passed over, shown once one is used
        for i, s in enumerate(candidates):
            meta, reason = self._verified_meta(s)
            if reason is None and expect is not None:
                wrong = expect(meta)
                if wrong:
                    raise UserError(f"checkpoint step {s} in '{self.directory}' {wrong}")
            if reason is None:
                try:
                    saved = leaf_specs(self._mngr.item_metadata(s)["state"])
                except Exception as e:  # noqa: BLE001 - anything unreadable means "try the previous one"
                    reason = _unreadable(e)
                else:
                    if not saved:  # no state metadata: a damaged checkpoint, not a different config
                        reason = "its array metadata (state/_METADATA) is missing"
            if reason is None:
                diff = mismatch(saved, wanted, partial)
                if diff:
                    raise UserError(f"checkpoint step {s} in '{self.directory}' does not match the state "
                                    f"being restored: {diff}; resume with the config it was saved with "
                                    "(its meta holds the resolved config)")
                if partial:
                    state_args = ocp.args.PyTreeRestore(abstract_state, partial_restore=True,
                                                        restore_args=_restore_args(abstract_state))
                else:
                    state_args = ocp.args.StandardRestore(abstract_state)
                try:
                    out = self._mngr.restore(s, args=ocp.args.Composite(state=state_args))
                except Exception as e:  # noqa: BLE001
                    reason = _unreadable(e)
                else:
                    reason = verify(out["state"], meta)
                    if reason is None:
                        for line in skipped:  # the newer ones that could not be used, now that one could
                            console.warn(line)
                        return s, out["state"], _without_checksums(meta)
            failures.append(f"step {s}: {reason}")
            if step is None:
                aside = self._quarantine(s, reason)
                where = f"moved to {aside}" if aside else "left in place"
                nxt = f"falling back to step {candidates[i + 1]}" if i + 1 < len(candidates) else "no earlier one"
                skipped.append(f"checkpoint step {s} in {self.directory} cannot be used ({reason}); {where}; {nxt}")
        if step is not None:
            raise UserError(f"checkpoint step {step} in '{self.directory}' cannot be used ({failures[0]}); "
                            "pass another step or the checkpoint directory to take the latest usable one")
        raise UserError(none_usable(self.directory, failures, read_only=self.read_only))

    def _verified_meta(self, step: int, note: bool = True) -> tuple[dict | None, str | None]:
        """(the JSON meta of `step`, None) when it reads back as saved, else (None or the meta, why not).
        A meta saved before metadata checksums is taken as it is (with a note, unless not `note`)."""
        try:
            meta = dict(self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        except Exception as e:  # noqa: BLE001 - an unreadable meta makes the checkpoint unusable
            return None, _unreadable(e)
        reason = verify_meta(meta, step)
        newer = format_refusal(meta) if reason in (None, LEGACY) else None
        if newer:  # intact, but written by a later yxanul-jax: refused, never moved aside as damaged
            raise CheckpointFormatError(f"checkpoint step {step} in '{self.directory}' {newer}")
        if reason == LEGACY:
            if note:
                console.note(f"checkpoint step {step} in {self.directory} was saved before metadata checksums: its "
                             "arrays are verified, its data position and config cannot be")
            reason = None
        return meta, reason

    def _quarantine(self, step: int, reason: str) -> str | None:
        """Move a damaged step aside into `<dir>/corrupt/` (process 0 only; never deleted), `reason`
        written into it (`REASON_FILE`)."""
        if jax.process_index() != 0 or self.read_only:
            return None
        import datetime

        src = os.path.join(self.directory, str(step))
        if not os.path.isdir(src):
            return None
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        dst = os.path.join(self.directory, CORRUPT_DIR, f"{step}-{stamp}")
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            with contextlib.suppress(OSError):
                with open(os.path.join(dst, REASON_FILE), "w", encoding="utf-8") as fh:
                    fh.write(reason + "\n")
        except OSError as e:
            console.warn(f"could not move damaged checkpoint step {step} aside ({type(e).__name__}); leaving it")
            return None
        self._mngr.reload()
        return dst

    def read_meta(self, step: int | None = None) -> dict:
        """The verified JSON meta of checkpoint `step` (None: the latest), without its checksums and
        without reading any array; UserError when it is unreadable or fails verification."""
        self._mngr.reload()
        present = self.all_steps()
        if not present or (step is not None and step not in present):
            raise UserError(f"checkpoint step {step if step is not None else '(latest)'} not found in "
                            f"'{self.directory}'; steps present: {present or 'none'}")
        step = present[-1] if step is None else step
        meta, reason = self._verified_meta(step, note=False)  # restoring it says so
        if reason is not None:
            raise UserError(f"checkpoint step {step} in '{self.directory}' cannot be used ({reason}); "
                            "pass another step")
        return _without_checksums(meta)

    # ---- lifecycle

    def check(self) -> None:
        """Raise CheckpointWriteError now if the last async save has finished and failed (cheap: call it
        every step, so a full disk stops the run at once, not at the next save). Single-process only:
        across processes the failure surfaces at the next save, which they all reach together."""
        if self._pending is not None and jax.process_count() == 1 and not self._mngr.is_saving_in_progress():
            self.wait()

    def wait(self) -> None:
        """Block until every started save is committed (and old steps are deleted); raises
        CheckpointWriteError once if a save could not be written."""
        if self._failed is None:
            with self._writing(self._pending):
                self._mngr.wait_until_finished()
            self._pending = None

    def close(self) -> None:
        """Wait for pending saves and release Orbax's threads (after a failed write: only release), then
        stop filtering Orbax's log noise (`orbax_logs.quiet_orbax`, shared with other open Checkpointers)."""
        try:
            if self._failed is None:
                with self._writing(self._pending):
                    self._mngr.close()
            else:
                with contextlib.suppress(Exception):
                    self._mngr.close()
        finally:
            self._quiet.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_checkpoint(path: str, abstract_state: Any, *, partial: bool = False,
                    expect: Callable[[dict], str | None] | None = None,
                    what: str = "--checkpoint") -> tuple[int, Any, dict]:
    """`Checkpointer.restore` of `--checkpoint PATH` (`resolve_checkpoint_path`; `what` names the option), read-only."""
    directory, step = resolve_checkpoint_path(path, what)
    with Checkpointer(directory, read_only=True) as ckpt:
        return ckpt.restore(abstract_state, step, partial=partial, expect=expect)


def resume_meta(directory: str, steps: list[int]) -> tuple[dict | None, int]:
    """(the meta of the checkpoint a restore of `directory` would take, its step): the latest of `steps` whose
    metadata verifies (a damaged one the restore moves aside, taking an earlier one); (None, 0) when none. Read-only,
    metadata only; a checkpoint of a newer format is refused (CheckpointFormatError)."""
    with Checkpointer(directory, read_only=True) as reader:
        for s in reversed(steps):
            try:
                return reader.read_meta(s), s
            except CheckpointFormatError:
                raise
            except UserError:
                continue
    return None, 0


def read_checkpoint_meta(path: str, what: str = "--checkpoint") -> dict:
    """`Checkpointer.read_meta` of `--checkpoint PATH` (its step, or the latest), read-only."""
    directory, step = resolve_checkpoint_path(path, what)
    with Checkpointer(directory, read_only=True) as ckpt:
        return ckpt.read_meta(step)


def require_checkpoint(run_dir: str, use: str) -> None:
    """UserError unless run directory `run_dir` holds a checkpoint step: with only moved-aside ones, `none_usable`;
    with none at all, that a run saves one every checkpoint.interval steps and at its end. `use`: what for."""
    directory = os.path.join(run_dir, CHECKPOINT_DIR)
    if checkpoint_steps(directory):
        return
    if quarantined(directory):
        raise UserError(none_usable(directory, [], read_only=True))
    raise UserError(f"'{run_dir}' has no checkpoint {use} yet (a run saves one every checkpoint.interval steps and at "
                    "its end); train it, or wait for its first save, or pass --checkpoint PATH")


def same_model(model: ModelConfig, given: Callable[[str, Any, Any], str] | None = None,
               fp8: FP8Config | None = None) -> Callable[[dict], str | None]:
    """A checkpoint check (`Checkpointer.restore(expect=...)`): why a checkpoint's saved model config does not
    describe `model` (`config.model_mismatch`: the field, its saved value and this one), or with `fp8` its FP8
    settings (`config.fp8_mismatch`), or None. `given(key, was, now)`: where `now` came from and the fix (default:
    an override given here). A checkpoint whose meta holds no config is read as before (its arrays' shapes are
    still compared)."""
    def check(meta: dict) -> str | None:
        saved = meta.get("config") if isinstance(meta.get("config"), dict) else {}
        diff = model_mismatch(saved["model"], model) if isinstance(saved.get("model"), dict) else None
        if diff is None and fp8 is not None and isinstance(saved.get("fp8"), dict):
            diff = fp8_mismatch(saved["fp8"], fp8)
        if diff is None:
            return None
        key, was, now = diff
        where = given(key, was, now) if given else (
            f"{key}={now} is given here; a checkpoint is read only into the model it was saved from: drop that "
            f"override, or pass {key}={was}")
        return f"was saved with {key}={was}, but {where}"
    return check


def quarantined(directory: str) -> list[tuple[str, str]]:
    """(name, reason or "") of each checkpoint moved aside into `<directory>/corrupt/`, by step."""
    where = os.path.join(directory, CORRUPT_DIR)
    try:
        names = sorted((n for n in os.listdir(where) if os.path.isdir(os.path.join(where, n))),
                       key=lambda n: (int(n.split("-")[0]) if n.split("-")[0].isdigit() else -1, n))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(where, name, REASON_FILE), encoding="utf-8") as fh:
                why = one_line(fh.read(), 200)
        except OSError:
            why = ""
        out.append((name, why))
    return out


def none_usable(directory: str, failures: list[str], *, read_only: bool = False) -> str:
    """The refusal when no checkpoint in `directory` can be used: what failed (`failures`, from this restore;
    none: the damaged ones moved into `corrupt/` before, with their reasons), and the ways on."""
    if read_only:
        fix = "restore the files, or pass --checkpoint with another checkpoint"
    else:
        fix = ("pass --overwrite to start over (the run's files are moved aside, nothing is deleted), or "
               "--checkpoint PATH to start from a checkpoint you choose")
    aside, where = quarantined(directory), os.path.join(directory, CORRUPT_DIR)
    if failures:
        moved = f"; moved to '{where}'" if aside else ""
        return f"no usable checkpoint in '{directory}' ({'; '.join(failures)}){moved}; {fix}"
    named = "; ".join(f"{name}: {why}" if why else name for name, why in aside)
    return (f"no usable checkpoint in '{directory}': every one failed verification and was moved to '{where}' "
            f"({named}); {fix}")


def _without_checksums(meta: dict) -> dict:
    """The meta as its writer passed it to `save`: without what `save` adds (checksums, the format version)."""
    return {k: v for k, v in meta.items() if k not in (CHECKSUMS, META_CHECKSUMS, FORMAT)}


def resolve_checkpoint_path(path: str, what: str = "--checkpoint") -> tuple[str, int | None]:
    """Turn `--checkpoint PATH` into `(checkpoint directory, step or None for the latest)`.

    PATH may be a checkpoint directory (`run/checkpoints`), one step inside it
    (`run/checkpoints/1200`), or a run directory (its `checkpoints/` is used). Raises UserError, naming the
    option as `what`, if PATH does not exist or holds no checkpoint.
    """
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(full):
        raise UserError(f"{what} '{path}' is a file, not a checkpoint; pass a checkpoint directory "
                        "(run_dir/checkpoints) or one step directory inside it")
    if not os.path.isdir(full):
        raise UserError(f"{what} '{path}' does not exist; pass a checkpoint directory "
                        "(run_dir/checkpoints) or one step directory inside it")
    if checkpoint_steps(full):
        return full, None
    nested = os.path.join(full, CHECKPOINT_DIR)
    if checkpoint_steps(nested):
        return nested, None
    name = os.path.basename(full)
    if name.isdigit():  # a step directory; restore() says so if it is damaged or uncommitted
        return os.path.dirname(full), int(name)
    raise UserError(f"{what} '{path}' holds no checkpoint (no step directories such as "
                    f"'{os.path.join(path, '1000')}'); pass a checkpoint directory or a step directory")
