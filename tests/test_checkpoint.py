"""Tests for yxanul_jax.training.checkpoint: real Orbax checkpoints on disk."""
from __future__ import annotations

import logging
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from yxanul_jax.core.config import CheckpointConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.training import orbax_logs
from yxanul_jax.training.checkpoint import Checkpointer, resolve_checkpoint_path


def _cfg(**kw) -> CheckpointConfig:
    base = dict(interval=1, max_to_keep=2, keep_best=True, async_save=False)
    return CheckpointConfig(**{**base, **kw})


def _small_state(value: float) -> dict:
    return {"w": jnp.full((2, 3), value, jnp.float32), "step": jnp.int32(int(value))}


def _template(tree):
    """Abstract template: ShapeDtypeStruct (with sharding) for jax arrays, numpy zeros for numpy."""
    def one(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return np.zeros_like(x)
    return jax.tree.map(one, tree)


def _bits(x) -> np.ndarray:
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a


def _corrupt(step_dir) -> None:
    """Overwrite every file of a checkpoint step with garbage (as a failing disk might)."""
    for root, _, files in os.walk(step_dir):
        for name in files:
            with open(os.path.join(root, name), "wb") as fh:
                fh.write(b"\x00garbage")


def test_round_trip_is_bit_exact(tmp_path):
    params = {"w": jax.random.normal(jax.random.key(0), (4, 8), jnp.float32),
              "norm": jnp.ones((8,), jnp.float32)}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    opt_state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = opt.update(grads, opt_state, params)  # non-trivial mu/nu/count
    bf16_specials = jnp.array([0.0, -0.0, 1e-40, jnp.inf, -jnp.inf, jnp.nan, 3.140625, -65504.0], jnp.bfloat16)
    state = {
        "params": params,
        "opt_state": opt_state,
        "fp8": {"amax_history": jax.random.uniform(jax.random.key(1), (16,), jnp.bfloat16),
                "scale": bf16_specials},
        "ints": jnp.array([-(2**31), -1, 0, 2**31 - 1], jnp.int32),
        "uints": jnp.array([0, 1, 2**32 - 1], jnp.uint32),
        "rng": jax.random.key_data(jax.random.key(42)),
        "typed_key": jax.random.key(7),
        "host": np.arange(5, dtype=np.float16),
    }
    meta = {"data": {"shard": 3, "offset": 12345, "files": ["a.arrow", "b.arrow"]},
            "curriculum": {"stage": 1}, "config": {"model": {"d_model": 128}, "lr": 3e-3},
            "note": None, "flag": True}
    with Checkpointer(str(tmp_path / "ck"), _cfg()) as ckpt:
        assert ckpt.save(10, state, meta, force=True)
    with Checkpointer(str(tmp_path / "ck"), _cfg()) as ckpt:
        step, restored, meta_back = ckpt.restore(_template(state))
    assert step == 10 and meta_back == meta
    assert jax.tree.structure(restored) == jax.tree.structure(state)  # optax namedtuples survive
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(restored)):
        assert a.dtype == b.dtype, path
        assert type(b) is type(a) or isinstance(b, jax.Array) == isinstance(a, jax.Array), path
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=str(path))
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding


def test_rotation_keeps_exactly_max_to_keep_plus_best(tmp_path):
    directory = str(tmp_path / "ck")
    ppl = {1: 9.0, 2: 3.0, 3: None, 4: 5.0, 5: None, 6: 4.0}
    with Checkpointer(directory, _cfg(max_to_keep=2)) as ckpt:
        for step, value in ppl.items():
            assert ckpt.save(step, _small_state(step), {"step": step}, val_ppl=value)
        assert ckpt.all_steps() == [2, 5, 6]
        assert ckpt.best_step() == 2
        # a diverged validation never becomes the best, even though it would be the lowest "number"
        ckpt.save(7, _small_state(7), {}, val_ppl=float("nan"))
        assert ckpt.all_steps() == [2, 6, 7] and ckpt.best_step() == 2
    assert sorted(os.listdir(directory)) == ["2", "6", "7"]  # nothing left over on disk
    # the best is known from disk after a restart, so a resumed run keeps it too
    with Checkpointer(directory, _cfg(max_to_keep=2)) as ckpt:
        assert ckpt.best_step() == 2
        ckpt.save(8, _small_state(8), {})
        assert ckpt.all_steps() == [2, 7, 8]
        ckpt.save(9, _small_state(9), {}, val_ppl=1.0)  # a new best: the old one goes
        assert ckpt.all_steps() == [8, 9] and ckpt.best_step() == 9


def test_rotation_without_best_keeps_only_latest(tmp_path):
    with Checkpointer(str(tmp_path / "ck"), _cfg(max_to_keep=2, keep_best=False)) as ckpt:
        for step, value in {1: 9.0, 2: 1.0, 3: 5.0, 4: 6.0}.items():
            ckpt.save(step, _small_state(step), {}, val_ppl=value)
        assert ckpt.all_steps() == [3, 4]


def test_save_interval_and_force(tmp_path):
    with Checkpointer(str(tmp_path / "ck"), _cfg(interval=3, max_to_keep=5)) as ckpt:
        assert [s for s in range(11) if ckpt.should_save(s)] == [3, 6, 9]
        assert not ckpt.save(4, _small_state(4), {})
        assert ckpt.all_steps() == []
        assert ckpt.save(4, _small_state(4), {}, force=True)
        assert ckpt.save(6, _small_state(6), {})
        assert not ckpt.save(6, _small_state(6), {}, force=True)  # already there: not rewritten
        assert ckpt.all_steps() == [4, 6] and ckpt.latest_step() == 6
        with pytest.raises(UserError, match="already holds the later step 6"):
            ckpt.save(5, _small_state(5), {}, force=True)  # would mix an older history into rotation
        with pytest.raises(TypeError, match="JSON"):
            ckpt.save(9, _small_state(9), {"iterator": b"raw bytes"})
    never = Checkpointer(str(tmp_path / "never"), _cfg(interval=0))
    assert not any(never.should_save(s) for s in range(100))
    never.close()


def test_corrupt_latest_falls_back_with_warning(tmp_path, capsys):
    directory = str(tmp_path / "ck")
    with Checkpointer(directory, _cfg(max_to_keep=3)) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, _small_state(step), {"step": step}, val_ppl=10.0 - step)
    _corrupt(os.path.join(directory, "3"))
    ckpt = Checkpointer(directory, _cfg(max_to_keep=3))  # a damaged step must not block opening
    step, state, meta = ckpt.restore(_template(_small_state(0)))
    assert step == 2 and meta == {"step": 2}
    np.testing.assert_array_equal(state["w"], np.full((2, 3), 2.0, np.float32))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert any("step 3" in line and "falling back to step 2" in line for line in warnings), warnings
    # the damaged step was moved aside (never deleted), so the run can save step 3 again
    moved = os.listdir(os.path.join(directory, "corrupt"))
    assert len(moved) == 1 and moved[0].startswith("3-") and ckpt.all_steps() == [1, 2]
    with pytest.raises(UserError, match="step 3 not found"):
        ckpt.restore(_template(_small_state(0)), step=3)
    assert ckpt.save(3, _small_state(33), {"step": 3}, force=True)
    ckpt.wait()
    assert ckpt.restore(_template(_small_state(0)))[0] == 3
    ckpt.close()


def test_no_readable_checkpoint_is_a_user_error(tmp_path, capsys):
    directory = str(tmp_path / "ck")
    with Checkpointer(directory, _cfg()) as ckpt:
        with pytest.raises(UserError, match="no checkpoint in"):
            ckpt.restore(_template(_small_state(0)))
        ckpt.save(1, _small_state(1), {})
        ckpt.save(2, _small_state(2), {})
    for step in ("1", "2"):
        _corrupt(os.path.join(directory, step))
    with Checkpointer(directory, _cfg()) as ckpt:
        capsys.readouterr()
        with pytest.raises(UserError, match="no usable checkpoint.*step 2: .*step 1: .*--overwrite.*--checkpoint"):
            ckpt.restore(_template(_small_state(0)))
        # the error names every step and why: no warning line before it repeats them (a used fallback warns)
        assert "cannot be used" not in capsys.readouterr().err
        with pytest.raises(UserError, match="step 5 not found"):
            ckpt.restore(_template(_small_state(0)), step=5)
    # asked again (the same command run twice): the same refusal, naming the damaged ones and why, never
    # "no checkpoint" (which a run takes as a fresh start from step 0)
    with Checkpointer(directory, _cfg()) as ckpt:
        with pytest.raises(UserError, match=r"no usable checkpoint.*corrupt.*\(1-\d+-\d+: .+; 2-\d+-\d+: .+\);"
                                            ".*--overwrite.*--checkpoint"):
            ckpt.restore(_template(_small_state(0)))


def test_an_unreadable_step_is_named_without_orbaxs_object_repr():
    # What Orbax 0.12 raised for a checkpoint whose array chunks were overwritten (seen 2026-11-21): its
    # message ends in a Python bound-method repr, which the warning and errors leave out.
    from yxanul_jax.training.checkpoint import _unreadable

    raised = Exception("Encountered error while reading array index: (slice(0, 4096, 1), slice(0, 128, 1)). "
                       "See full TensorStore details: <bound method pybind11_detail_function_record_v1_system_"
                       "libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1.spec of TensorStore({\n  'context': {")
    assert _unreadable(raised) == ("Exception: Encountered error while reading array index: "
                                   "(slice(0, 4096, 1), slice(0, 128, 1)).")


def test_mismatched_template_is_refused_not_cast(tmp_path):
    with Checkpointer(str(tmp_path / "ck"), _cfg()) as ckpt:
        ckpt.save(1, _small_state(1), {}, force=True)
        wrong_dtype = {"w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16), "step": jax.ShapeDtypeStruct((), jnp.int32)}
        with pytest.raises(UserError, match=r"'w' is float32\[2, 3\] in the checkpoint but bfloat16\[2, 3\]"):
            ckpt.restore(wrong_dtype)
        missing = {**wrong_dtype, "w": jax.ShapeDtypeStruct((2, 3), jnp.float32), "extra": jax.ShapeDtypeStruct((1,), jnp.float32)}
        with pytest.raises(UserError, match="'extra' is missing from the checkpoint"):
            ckpt.restore(missing)


def test_interrupted_save_is_ignored(tmp_path):
    directory = str(tmp_path / "ck")
    with Checkpointer(directory, _cfg()) as ckpt:
        ckpt.save(1, _small_state(1), {"step": 1})
    partial = os.path.join(directory, "2.orbax-checkpoint-tmp-1234567")  # a save killed mid-write
    os.makedirs(os.path.join(partial, "state"))
    with open(os.path.join(partial, "state", "manifest.ocdbt"), "wb") as fh:
        fh.write(b"half")
    with Checkpointer(directory, _cfg()) as ckpt:
        assert ckpt.latest_step() == 1
        assert ckpt.restore(_template(_small_state(0)))[0] == 1


def test_read_only_reader_beside_a_live_run_changes_nothing(tmp_path, capsys):
    # A sampler or exporter opens the checkpoints of a run that is still saving: its half-written
    # step must survive (Orbax's cleanup would delete it under the writer), a damaged step is skipped
    # in place (not moved aside under the run), and the reader cannot save.
    directory = str(tmp_path / "ck")
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "fp8": {"scale": jnp.ones((2,), jnp.float32)},
             "opt_state": {"mu": jnp.full((2, 3), 0.5)}, "step": jnp.int32(1)}
    with Checkpointer(directory, _cfg(max_to_keep=3)) as ckpt:
        ckpt.save(1, state, {"step": 1})
        ckpt.save(2, {**state, "step": jnp.int32(2)}, {"step": 2})
    writing = os.path.join(directory, "3.orbax-checkpoint-tmp-1700000000")  # the live run's save in flight
    os.makedirs(os.path.join(writing, "state"))
    _corrupt(os.path.join(directory, "2"))
    before = sorted(os.listdir(directory))
    reader = Checkpointer(directory, read_only=True)
    parts = {"params": _template(state["params"]), "fp8": _template(state["fp8"])}
    step, got, meta = reader.restore(parts, partial=True)
    assert step == 1 and meta == {"step": 1} and set(got) == {"params", "fp8"}
    np.testing.assert_array_equal(got["params"]["w"], state["params"]["w"])
    np.testing.assert_array_equal(got["fp8"]["scale"], state["fp8"]["scale"])
    err = capsys.readouterr().err
    assert "checkpoint step 2" in err and "left in place; falling back to step 1" in err, err
    with pytest.raises(ValueError, match="read-only"):
        reader.save(4, state, {}, force=True)
    reader.close()
    assert sorted(os.listdir(directory)) == before  # nothing written, removed or moved
    # a part of the template that the checkpoint lacks is still refused, in one line
    with Checkpointer(directory, read_only=True) as reader:
        with pytest.raises(UserError, match="'fp8.amax' is missing from the checkpoint"):
            reader.restore({"fp8": {"amax": jax.ShapeDtypeStruct((2,), jnp.float32)}}, step=1, partial=True)


def test_partial_restore_reads_params_past_unusable_optimizer_moments(tmp_path):
    # Sampling needs the parameters only: an Adam moment gone NaN must not make them unloadable,
    # while a full restore (resuming training) refuses that step.
    directory = str(tmp_path / "ck")
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "opt_state": {"nu": jnp.full((2, 3), jnp.nan)}}
    with Checkpointer(directory, _cfg()) as ckpt:
        ckpt.save(1, state, {}, force=True)
    with Checkpointer(directory, read_only=True) as reader:
        with pytest.raises(UserError, match="hold NaN or inf"):
            reader.restore(_template(state), step=1)
        step, got, _ = reader.restore({"params": _template(state["params"])}, step=1, partial=True)
    assert step == 1
    np.testing.assert_array_equal(got["params"]["w"], state["params"]["w"])


def test_async_save_then_wait(tmp_path):
    directory = str(tmp_path / "ck")
    big = jax.random.normal(jax.random.key(3), (256, 1024), jnp.float32)
    expected = np.asarray(big)
    ckpt = Checkpointer(directory, _cfg(async_save=True, max_to_keep=1))
    assert ckpt.save(5, {"big": big}, {"step": 5}, force=True)
    big.delete()  # as if the train step donated the buffer right after save() returned
    assert ckpt.save(6, {"big": jnp.asarray(expected) + 1}, {"step": 6}, force=True)
    ckpt.wait()
    assert sorted(os.listdir(directory)) == ["6"]  # committed, and the older one rotated out
    step, state, meta = ckpt.restore({"big": jax.ShapeDtypeStruct((256, 1024), jnp.float32)})
    assert step == 6 and meta == {"step": 6}
    np.testing.assert_array_equal(np.asarray(state["big"]), expected + 1)
    ckpt.close()


def test_resumed_training_reproduces_losses(tmp_path):
    """Train a tiny regression 8 steps straight, and 4 + checkpoint + restore + 4: same losses, bit for bit."""
    opt = optax.adamw(1e-2)
    true_w = jnp.arange(4.0)

    @jax.jit
    def train_step(state):
        key, sub = jax.random.split(jax.random.wrap_key_data(state["rng"]))
        x = jax.random.normal(sub, (16, 4))
        loss_fn = lambda p: jnp.mean((x @ p["w"] - x @ true_w) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "rng": jax.random.key_data(key)}, loss

    params = {"w": jnp.zeros(4)}
    init = {"params": params, "opt_state": opt.init(params), "rng": jax.random.key_data(jax.random.key(0))}

    state, straight = init, []
    for _ in range(8):
        state, loss = train_step(state)
        straight.append(np.asarray(loss))

    state, resumed = init, []
    with Checkpointer(str(tmp_path / "ck"), _cfg()) as ckpt:
        for step in range(1, 5):
            state, loss = train_step(state)
            resumed.append(np.asarray(loss))
        ckpt.save(4, state, {"data_position": 4})
    with Checkpointer(str(tmp_path / "ck"), _cfg()) as ckpt:
        step, state, meta = ckpt.restore(jax.eval_shape(lambda: init))
    assert step == 4 and meta == {"data_position": 4}
    for _ in range(4):
        state, loss = train_step(state)
        resumed.append(np.asarray(loss))
    np.testing.assert_array_equal(np.stack(resumed), np.stack(straight))


def test_resolve_checkpoint_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint_path(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no checkpoint"):
        resolve_checkpoint_path(str(tmp_path / "empty"))
    directory = tmp_path / "run" / "checkpoints"
    with Checkpointer(str(directory), _cfg(max_to_keep=3)) as ckpt:
        ckpt.save(100, _small_state(1), {})
        ckpt.save(200, _small_state(2), {})
    assert resolve_checkpoint_path(str(directory)) == (str(directory), None)
    assert resolve_checkpoint_path(str(directory / "100")) == (str(directory), 100)
    assert resolve_checkpoint_path(str(tmp_path / "run")) == (str(directory), None)
    with Checkpointer(*resolve_checkpoint_path(str(directory / "100"))[:1], _cfg()) as ckpt:
        assert ckpt.restore(_template(_small_state(0)), step=100)[0] == 100


@pytest.fixture
def none_open(monkeypatch):
    """This process as if no Checkpointer were open (one leaked by an earlier test would hold the filter)."""
    if orbax_logs.is_quiet():
        for name in ("absl", "asyncio"):
            logger = logging.getLogger(name)
            monkeypatch.setattr(logger, "filters", [f for f in logger.filters if f is not orbax_logs.LOG_FILTER])
        monkeypatch.setattr(orbax_logs, "_holders", 0)
        monkeypatch.setattr(orbax_logs, "_hook", None)


def test_a_closed_checkpointer_leaves_no_filter_or_hook_behind(tmp_path, none_open, monkeypatch):
    # Orbax's noise is filtered only while Checkpointers are open: the last close removes exactly the
    # logging filter and the unraisable hook they added, and nested ones share one installation.
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    before = [list(lg.filters) for lg in loggers], sys.unraisablehook
    outer = Checkpointer(str(tmp_path / "a"), _cfg())
    assert all(orbax_logs.LOG_FILTER in lg.filters for lg in loggers) and sys.unraisablehook is not before[1]
    with Checkpointer(str(tmp_path / "b"), _cfg()) as inner:
        inner.save(1, _small_state(1), {})
        assert [lg.filters.count(orbax_logs.LOG_FILTER) for lg in loggers] == [1, 1]
    assert orbax_logs.is_quiet()  # the outer one is still open
    outer.close()
    outer.close()  # twice: still balanced
    assert not orbax_logs.is_quiet()
    assert ([list(lg.filters) for lg in loggers], sys.unraisablehook) == before
    assert not any(orbax_logs.LOG_FILTER in lg.filters for lg in loggers)
    def unopenable(self):
        raise OSError(13, "Permission denied")
    monkeypatch.setattr(Checkpointer, "_open_manager", unopenable)
    with pytest.raises(OSError):
        Checkpointer(str(tmp_path / "c"))  # a failed open releases its hold too
    assert not orbax_logs.is_quiet() and sys.unraisablehook is before[1]


def _meta_file(step_dir) -> str:
    return os.path.join(step_dir, "meta", "metadata")  # Orbax's JsonSave: the meta, as plain JSON


def _edit_meta(step_dir, edit) -> None:
    import json

    with open(_meta_file(step_dir)) as fh:
        meta = json.load(fh)
    edit(meta)
    with open(_meta_file(step_dir), "w") as fh:
        json.dump(meta, fh)


def test_edited_metadata_is_skipped_with_a_warning_naming_it(tmp_path, capsys):
    # Everything a resume reads besides the arrays (the data cursor, the step, the config) is in the JSON meta:
    # an edit there is caught like a flipped bit in an array, and so is a step directory renamed.
    from yxanul_jax.training.integrity import META_CHECKSUMS

    directory = str(tmp_path / "ck")
    with Checkpointer(directory, _cfg(max_to_keep=5, keep_best=False)) as ckpt:
        for step in (1, 2, 3, 4):
            ckpt.save(step, _small_state(step), {"data": {"cursor": 100 * step}, "tokens": step}, force=True)
    os.rename(os.path.join(directory, "4"), os.path.join(directory, "7"))  # "skip ahead" by renaming
    _edit_meta(os.path.join(directory, "3"), lambda m: m["data"].update(cursor=0))
    with Checkpointer(directory, _cfg(max_to_keep=5, keep_best=False)) as ckpt:
        step, state, meta = ckpt.restore(_template(_small_state(0)))
    assert step == 2 and meta == {"data": {"cursor": 200}, "tokens": 2}  # no checksums handed back
    err = capsys.readouterr().err
    assert "checkpoint step 7" in err and "it was saved as step 4, not 7" in err, err
    assert "checkpoint step 3" in err and "its metadata 'data' does not match its checksum" in err, err
    assert sorted(n.split("-")[0] for n in os.listdir(os.path.join(directory, "corrupt"))) == ["3", "7"]
    # a checkpoint saved before metadata checksums (no META_CHECKSUMS) restores as before, with a note
    _edit_meta(os.path.join(directory, "2"), lambda m: m.pop(META_CHECKSUMS))
    with Checkpointer(directory, _cfg(max_to_keep=5, keep_best=False)) as ckpt:
        assert ckpt.restore(_template(_small_state(0)))[0] == 2
        assert ckpt.read_meta(2) == {"data": {"cursor": 200}, "tokens": 2}
    assert "was saved before metadata checksums" in capsys.readouterr().err
