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
    more = load_config(None, TRAINED_RUN + ["train.log_every=1", "train.steps=8"])
    fit(more, str(run))  # train.steps may grow on resume
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
    more = TRAINED_RUN + ["train.steps=10", "checkpoint.interval=2", "checkpoint.async_save=true"]
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
