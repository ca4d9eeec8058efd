"""Fault injection: damaged checkpoints are caught, moved aside and skipped; a run never logs a step
twice; a finished run says so; the last checkpoint carries its perplexity."""
import contextlib
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import CheckpointConfig, load_config
from yxanul_jax.core.rundir import CORRUPT_DIR
from yxanul_jax.training.checkpoint import Checkpointer

from conftest import TRAINED_RUN


def _ckpt(directory):
    return Checkpointer(str(directory), CheckpointConfig(interval=1, max_to_keep=5, keep_best=False,
                                                         async_save=False))


def _state(v):
    # random values: the stored chunk cannot be compressed away, so flipped bytes land in array data
    w = np.random.default_rng(v).normal(size=(64, 64)).astype(np.float32)
    w[0, 0] = v
    return {"params": {"w": jnp.asarray(w)}, "opt_state": {"mu": jnp.zeros((64, 64))}}


def _template():
    return {"params": {"w": np.zeros((64, 64), np.float32)}, "opt_state": {"mu": np.zeros((64, 64), np.float32)}}


def _largest_data_file(step_dir):
    files = [os.path.join(d, f) for d, _, names in os.walk(os.path.join(step_dir, "state")) for f in names
             if "METADATA" not in f and not f.startswith("manifest")]
    return max(files, key=os.path.getsize)


def _saved(directory, steps, bad=None):
    with _ckpt(directory) as ck:
        for s in steps:
            state = _state(s)
            if bad is not None and s in bad:
                state = bad[s](state)
            ck.save(s, state, {"step": s}, force=True)


def test_flipped_bytes_are_caught_moved_aside_and_skipped(tmp_path, capsys):
    _saved(tmp_path, (1, 2))
    path = _largest_data_file(tmp_path / "2")
    data = bytearray(open(path, "rb").read())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    open(path, "wb").write(bytes(data))
    with _ckpt(tmp_path) as ck:
        step, state, meta = ck.restore(_template())
    assert step == 1 and meta == {"step": 1} and float(state["params"]["w"][0, 0]) == 1.0
    err = capsys.readouterr().err
    assert "warning: checkpoint step 2" in err and "falling back to step 1" in err
    assert os.listdir(tmp_path / CORRUPT_DIR)[0].startswith("2-")


def test_missing_metadata_is_a_damaged_checkpoint_not_a_config_mismatch(tmp_path, capsys):
    _saved(tmp_path, (1, 2))
    os.remove(os.path.join(tmp_path, "2", "state", "_METADATA"))
    with _ckpt(tmp_path) as ck:
        assert ck.restore(_template())[0] == 1
    assert "falling back to step 1" in capsys.readouterr().err


def test_two_damaged_checkpoints_then_saving_goes_on(tmp_path):
    nan = lambda st: {**st, "params": {"w": st["params"]["w"].at[3, 3].set(jnp.nan)}}  # noqa: E731
    _saved(tmp_path, (1, 2, 3), bad={2: nan, 3: nan})  # NaN parameters saved (a diverged run)
    with _ckpt(tmp_path) as ck:
        step, _, _ = ck.restore(_template())
        assert step == 1 and ck.all_steps() == [1]
        assert ck.save(2, _state(20), {"step": 2}, force=True)  # the retrained run saves again
        assert ck.restore(_template())[0] == 2
    assert len(os.listdir(tmp_path / CORRUPT_DIR)) == 2


def test_no_step_is_logged_twice_and_a_finished_run_says_so(trained_run, tmp_path, capsys):
    import shutil

    from yxanul_jax.training.loop import fit

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # 6 steps done, the last checkpoint at 6
    metrics = run / "metrics.jsonl"
    with open(metrics, "a") as fh:  # rows a killed run logged after its last checkpoint
        for s in (7, 8, 9):
            fh.write(json.dumps({"step": s, "loss": 99.0}) + "\n")
    more = load_config(None, TRAINED_RUN + ["train.log_every=1", "train.steps=8", "train.extend=decay"])
    fit(more, str(run))  # train.steps may grow on resume, saying how the schedule goes on
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if "loss" in json.loads(x)]
    assert steps == sorted(set(steps)) and steps[-1] == 8 and 99.0 not in [
        json.loads(x).get("loss") for x in metrics.read_text().splitlines()]
    with Checkpointer(str(run / "checkpoints"), more.checkpoint) as ck:
        assert ck.latest_step() == 8 and ck.best_step() == 8  # the last checkpoint carries its perplexity
    capsys.readouterr()
    out = fit(more, str(run))
    assert out.step == 8 and "this run already finished: step 8" in capsys.readouterr().out
    history = (run / "config_history.jsonl").read_text()
    assert '"train.steps": [6, 8]' in history


def test_mistakes_found_before_anything_is_written(trained_run, tmp_path):
    from data_fixtures import run_cli
    from yxanul_jax.cli import main

    import pyarrow as pa
    import pyarrow.parquet as pq

    body = tmp_path / "body.parquet"  # its text is in 'body': the fix names train's own syntax, not a flag
    pq.write_table(pa.table({"body": ["x = 1\n" * 20] * 4}), body)
    for bad, needle in (("eval.domains.code=/nonexistent/code.parquet", "eval domain 'code'"),
                        ("eval.batch_size=0", "eval.batch_size"),
                        (f"eval.domains.code={body}", f"eval.domains.code={body}::{{column}}")):
        run = tmp_path / bad.split("=")[0]
        rc, _, err = run_cli(main, ["train", "--run-dir", run, *TRAINED_RUN, bad])  # the fixture's cache has the corpus
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and needle in lines[0] and "--text" not in lines[0], err[-2000:]
        assert not run.exists()  # no run directory left behind by a refused start


# Runs a module with files capped at LIMIT bytes (EFBIG, as on a full disk) in this process only;
# set in the child itself, since a preexec_fn would run Python between fork and exec in a threaded parent.
_CAPPED = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); sys.argv = sys.argv[2:]; "
           "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


@pytest.mark.slow
def test_a_failed_async_save_stops_cleanly_and_the_run_resumes(trained_run, tmp_path):
    """A checkpoint write that fails in the background (files capped at 32 kB, as on a full disk: the
    state is ~1 MB) ends the run in one line, exit 2, no partial step left, the last complete
    checkpoint intact; the same command with room to write resumes from it."""
    import shutil
    import subprocess
    import sys

    from conftest import REPO
    from yxanul_jax.core.rundir import cache_root
    from yxanul_jax.training.loop import fit

    run, cache = tmp_path / "run", tmp_path / "cache"
    shutil.copytree(trained_run, run)  # checkpoint at step 6
    # the demo corpus, and a compilation cache of its own: the capped run leaves truncated entries in it
    shutil.copytree(cache_root(), cache, ignore=lambda d, names: ["xla"] if d == str(cache_root()) else [])
    more = TRAINED_RUN + ["train.steps=10", "train.extend=decay", "checkpoint.interval=2", "checkpoint.async_save=true"]
    proc = subprocess.run([sys.executable, "-c", _CAPPED, str(32 << 10), "yxanul_jax.train", "--run-dir", str(run),
                           *more], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "YXANUL_CACHE": str(cache),
                               "JAX_COMPILATION_CACHE_DIR": str(cache / "xla")})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines[-1].startswith("error: writing checkpoint step 8 into") and "File too large" in lines[-1], lines[-1]
    assert "resume from step 6" in lines[-1] and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sorted(os.listdir(run / "checkpoints")) == ["6"]  # no half-written step left behind
    out = fit(load_config(None, more), str(run))  # room to write again: resumes from step 6
    assert out.step == 10 and "10" in os.listdir(run / "checkpoints")


@contextlib.contextmanager
def _read_only_copy(src, tmp_path):
    """A copy of `src` that cannot be written: a read-only tmpfs as root (root ignores permission bits),
    permission bits otherwise. Skips where root may not mount (an unprivileged container)."""
    import shutil
    import subprocess

    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0:
        shutil.copytree(src, where / "run")
        for d, _, names in os.walk(where):
            for p in [d, *(os.path.join(d, n) for n in names)]:
                os.chmod(p, 0o555 if os.path.isdir(p) else 0o444)
        try:
            yield where / "run"
        finally:
            for d, _, _ in os.walk(where):
                os.chmod(d, 0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("root here may not mount a tmpfs, and permission bits do not bind root")
    try:
        shutil.copytree(src, where / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        yield where / "run"
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_a_read_only_run_directory_is_one_line_and_changes_nothing(trained_run, tmp_path):
    from data_fixtures import run_cli
    from yxanul_jax.cli import main

    with _read_only_copy(trained_run, tmp_path) as run:
        before = sorted(os.listdir(run / "checkpoints"))
        rc, _, err = run_cli(main, ["train", "--run-dir", run, *TRAINED_RUN, "train.steps=8"])
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
        assert "Read-only file system" in lines[0] or "Permission denied" in lines[0], lines[0]
        assert sorted(os.listdir(run / "checkpoints")) == before


# Issue 27: everything a resume reads is verified; a wrong model is refused; a NaN names where to go on from


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_an_edited_data_cursor_is_refused_every_time_never_a_silent_step_0(trained_run, tmp_path):
    """The data cursor lives in the checkpoint's JSON, beside the checksummed arrays: edited, the checkpoint is
    skipped with a warning naming it; with none left the command exits 2 naming the two ways on, and so does
    the same command run again (it used to start from step 0)."""
    import shutil

    from data_fixtures import run_cli
    from yxanul_jax.cli import main

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # one checkpoint, step 6
    meta_file = run / "checkpoints" / "6" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["data"]["cursor"] = 0  # "start the data over" by hand
    meta_file.write_text(json.dumps(meta))
    metrics = (run / "metrics.jsonl").read_text()
    for attempt in (1, 2):
        rc, _, err = run_cli(main, ["train", "--run-dir", run, *TRAINED_RUN, "train.steps=8"])
        lines = _lines(err)
        assert rc == 2 and lines[-1].startswith("error: no usable checkpoint in"), err[-3000:]
        assert "--overwrite" in lines[-1] and "--checkpoint PATH" in lines[-1], lines[-1]
        assert "its metadata 'data' does not match its checksum" in lines[-1], lines[-1]  # named again on the rerun
        assert len(lines) == 1, err  # the error alone: no warning line repeating it
        if attempt == 1:
            assert "(step 6: " in lines[-1] and f"moved to '{run / 'checkpoints' / CORRUPT_DIR}'" in lines[-1], lines
    assert os.listdir(run / "checkpoints") == [CORRUPT_DIR]  # moved aside, never deleted, no step 0 saved
    assert (run / "metrics.jsonl").read_text() == metrics


def test_a_model_override_that_disagrees_with_the_checkpoint_is_refused(trained_run, tmp_path):
    """Overrides that change what the weights mean (a shape, or a function of them such as RoPE's base) are refused
    in one line naming the field, its value in the checkpoint and the override, before anything is read or
    written: --eval-only used to evaluate a truncated model. --eval-only --checkpoint alone takes the
    checkpoint's own config."""
    from data_fixtures import run_cli
    from yxanul_jax.cli import main

    ckpts = trained_run / "checkpoints"
    new = tmp_path / "new"
    for args, saved, given in (
            (["--eval-only", "--checkpoint", ckpts, "model.n_layers=1"], "model.n_layers=2", "model.n_layers=1"),
            (["--eval-only", "--run-dir", trained_run, "model.n_layers=1"], "model.n_layers=2", "model.n_layers=1"),
            (["--eval-only", "--checkpoint", ckpts / "6", "model.rope_theta=500000"], "model.rope_theta=10000.0",
             "model.rope_theta=500000.0"),
            (["--run-dir", new, "--checkpoint", ckpts, *TRAINED_RUN, "model.n_layers=1"], "model.n_layers=2",
             "model.n_layers=1")):
        rc, _, err = run_cli(main, ["train", *args])
        lines = _lines(err)
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: checkpoint step 6 in"), err[-3000:]
        assert f"was saved with {saved}, but {given} is given here" in lines[0], lines[0]
    assert not new.exists()
    rc, out, err = run_cli(main, ["train", "--eval-only", "--checkpoint", ckpts])
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["step"] == 6, err[-3000:]


def test_the_nan_advice_names_the_newest_checkpoint_whose_loss_was_finite_and_not_diverging(tmp_path):
    from yxanul_jax.training.loop import TrainingDiverged, diverged

    cfg = load_config(None, [])

    def advice(losses: dict, nan_at: int):
        """The advice for a NaN at `nan_at` over checkpoints saved with {step: (train_loss, lowest so far)}."""
        directory = tmp_path / f"ck{len(os.listdir(tmp_path))}"
        with _ckpt(directory) as ck:
            for s, (loss, lowest) in losses.items():
                ck.save(s, _state(s), {"train_loss": loss, "train_loss_lowest": lowest}, force=True)
            e = diverged(TrainingDiverged(f"loss became nan at step {nan_at}", nan_at, float("nan")), ck, cfg)
        return e, str(e), directory

    # 2 and 4 fine, 6 saved mid-spike, 8 the one whose parameters gave the NaN at 9
    e, text, directory = advice({2: (7.9, 7.8), 4: (7.4, 7.3), 6: (3.55e13, 7.2), 8: (7.0, 7.0)}, 9)
    assert e.last_good_step == 4 and e.step == 9 and text.startswith("loss became nan at step 9;")
    assert ("is step 4 (loss 7.4; later step 8: its parameters gave the loss nan at step 9; step 6: loss 3.55e+13)"
            in text)
    # Muon (the default): both rates named, the blocks' matrices step at muon_lr
    assert f"--checkpoint {directory / '4'} --run-dir NEW_DIR" in text
    assert "a lower optim.muon_lr and optim.lr (now 0.01 and 0.012)" in text, text
    e, text, _ = advice({2: (7.9, 7.8), 4: (7.4, 7.3)}, 7)  # the latest is good: resume the same run
    assert e.last_good_step == 4 and "run the same command again with a lower optim.muon_lr" in text
    adamw = load_config(None, ["optim.name=adamw"])  # AdamW: its one rate
    with _ckpt(tmp_path / "adamw") as ck:
        for s, loss in ((2, 7.9), (4, 7.4)):
            ck.save(s, _state(s), {"train_loss": loss, "train_loss_lowest": loss}, force=True)
        text = str(diverged(TrainingDiverged("loss became nan at step 7", 7, float("nan")), ck, adamw))
    assert "run the same command again with a lower optim.lr (now 0.003)" in text, text
    e, text, _ = advice({2: (12.0, 7.0), 4: (1e20, 7.0)}, 9)  # 12 after 7.0: diverging too
    assert e.last_good_step is None and "No checkpoint recorded a finite training loss" in text
    assert "step 4: loss 1e+20; step 2: loss 12" in text and "--overwrite" in text
    e, text, _ = advice({}, 3)
    assert e.last_good_step is None and "No checkpoint was saved before it" in text


def test_a_nan_loss_exits_2_naming_the_step_and_never_advises_the_checkpoint_that_gave_it(tmp_path):
    from data_fixtures import run_cli
    from yxanul_jax.cli import main

    run = tmp_path / "nan"  # a learning rate 1e30 times too high: the parameters after step 1 overflow
    rc, _, err = run_cli(main, ["train", "--run-dir", run, *TRAINED_RUN, "checkpoint.interval=1",
                                "curriculum=[{start_step: 0, seq_len: 32, batch_size: 8, lr_scale: 1e30}]"])
    error = [line for line in _lines(err) if line.startswith("error: ")]
    assert rc == 2 and len(error) == 1 and error[0] == _lines(err)[-1], err[-3000:]
    assert error[0].startswith("error: loss became nan at step 2;") and "None" not in error[0], error[0]
    assert "step 1: its parameters gave the loss nan at step 2" in error[0] and "--overwrite" in error[0], error[0]
    with _ckpt(run / "checkpoints") as ck:  # the checkpoint records its training loss
        assert ck.all_steps() == [1] and np.isfinite(ck.read_meta(1)["train_loss"])
