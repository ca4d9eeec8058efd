"""The training entry point end to end (CPU, tiny models): loss falls, stages, resume, guards, eval-only."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.training.checkpoint import Checkpointer

from conftest import REPO, TRAINED_RUN, shared_path
from data_fixtures import run_cli

# A model small enough that each CLI run takes seconds; vocab 512 matches the 512-entry demo corpus.
FAST = ["model.vocab_size=512", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.ffn_dim=128", "model.embed_rank=16", "curriculum.0.seq_len=32", "curriculum.0.batch_size=8",
        "curriculum.1.start_step=6", "curriculum.1.seq_len=64", "curriculum.1.batch_size=4", "train.steps=12",
        "train.log_every=1", "eval.interval=6", "eval.max_batches=2", "eval.batch_size=4",
        "checkpoint.interval=4", "checkpoint.async_save=false", "optim.warmup_steps=2", "train.sample_tokens=0"]


@pytest.fixture(scope="module")
def env():
    """The environment of CLI subprocesses: the session's caches (conftest), CPU."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def train(env, *args, timeout=600, check=True):
    """The CLI in a subprocess: only where a process boundary is the point (signals, a kill)."""
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.train", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def cli(*args) -> tuple[int, str, str]:
    """The CLI in this process, as `yxanul train ARGS` runs it: exit code, stdout and stderr."""
    from yxanul_jax.cli import main

    return run_cli(main, ["train", *args])


def rows(run_dir, kind="loss"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [r for r in map(json.loads, fh) if kind in r]


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    """FAST trained by the library call, in process (FP8 on, through the stage change at step 6,
    validation at 6 and 12, checkpoints at 4, 8, 12): (run dir, train()'s result, its stdout)."""
    import contextlib
    import io

    from yxanul_jax.training.loop import fit as train_fn

    run = tmp_path_factory.mktemp("fast") / "run"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = train_fn(load_config(None, FAST), str(run))
    return str(run), result, out.getvalue()


@pytest.mark.slow
def test_default_command_loss_falls(tmp_path):
    run = str(tmp_path / "run")
    rc, out, err = cli("--run-dir", run, "train.steps=16", "curriculum.1.start_step=8", "optim.warmup_steps=4",
                       "train.log_every=1", "eval.max_batches=2")
    assert rc == 0, err
    # the run ends in text: a sample from the model it trained, under the validation table
    tail = out[out.index("validation at step 16"):]
    assert "sample (train.sample_prompt, " in tail and "\ndef " in tail
    losses = [r["loss"] for r in rows(run)]
    assert len(losses) == 16
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses  # 8.31 -> 7.12 here
    row = rows(run)[-1]
    for key in ("step", "stage", "seq_len", "loss", "lr", "grad_norm", "tokens", "tokens_per_sec", "mfu"):
        assert key in row
    assert {r["stage"] for r in rows(run)} == {0, 1} and rows(run)[-1]["seq_len"] == 128
    val = rows(run, "val/mean/loss")
    assert val and "val/heldout/ppl" in val[-1]
    assert os.path.exists(os.path.join(run, "config.yaml")) and os.listdir(os.path.join(run, "tb"))


def test_a_signal_stops_at_its_step_with_a_checkpoint_and_the_resume_is_bit_exact(fast_run, tmp_path):
    # Deterministic: a hook raises SIGTERM in the main thread after step 5 is dispatched, so the guard's
    # handler has run before the loop asks whether to stop; the loop saves step 5 and returns.
    from yxanul_jax.training.hooks import Hook
    from yxanul_jax.training.loop import fit

    class SigtermAfter(Hook):
        def __init__(self, at):
            self.at = at

        def after_step(self, loop, state, done):
            if done == self.at:
                signal.raise_signal(signal.SIGTERM)

    want = {r["step"]: r["loss"] for r in rows(fast_run[0])}  # the same config, never interrupted
    want_val = {r["step"]: r["val/mean/loss"] for r in rows(fast_run[0], "val/mean/loss")}
    # step 5; step 6, where the signal cuts its validation short (saved unvalidated, validated on the resume)
    for at in (5, 6):
        run = str(tmp_path / f"stopped{at}")
        cfg = load_config(None, FAST + ["checkpoint.interval=100"])
        previous = signal.getsignal(signal.SIGTERM)
        stopped = fit(cfg, run, hooks=[SigtermAfter(at)])
        assert signal.getsignal(signal.SIGTERM) == previous  # the guard is gone with the loop
        assert (stopped.step, stopped.interrupted, stopped.signal, stopped.validation) == (at, True, "SIGTERM", None)
        with Checkpointer(os.path.join(run, "checkpoints"), cfg.checkpoint) as ckpt:
            assert ckpt.all_steps() == [at] and ckpt.read_meta(at)["validated"] is False
        resumed = fit(cfg, run)
        assert resumed.step == 12 and not resumed.interrupted
        got = {r["step"]: r["loss"] for r in rows(run)}
        assert sorted(got) == sorted(want)  # no step lost or logged twice
        assert got == want  # bit-exact on CPU
        val = [(r["step"], r["val/mean/loss"]) for r in rows(run, "val/mean/loss")]
        assert dict(val) == want_val and len(val) == len(want_val), val  # every validation, once


@pytest.mark.slow
def test_sigterm_to_the_command_saves_and_exits_128_plus_the_signal(env, tmp_path):
    # A process boundary is the point here. train.steps is far more than the run can take before the signal
    # arrives, and the first metrics row comes after the guard is installed: the stop is always in the loop.
    run = str(tmp_path / "killed")
    cmd = [sys.executable, "-m", "yxanul_jax.train", "--run-dir", run, *FAST, "train.steps=100000",
           "checkpoint.interval=0", "eval.interval=0"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(run, "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (os.path.exists(metrics) and rows(run)):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out  # saved but not finished: not a 0
    assert "stopped by SIGTERM" in out
    with Checkpointer(os.path.join(run, "checkpoints"), load_config(None, FAST).checkpoint) as ckpt:
        saved = ckpt.all_steps()
    assert len(saved) == 1 and 1 <= saved[0] < 100000


# The command with a hook that sends SIGTERM to itself at one moment of the final phase (issue 27): in the
# final validation (its second batch), while the final checkpoint is written (async), or in the end-of-run
# sample (before its third token). It prints when it sent the signal, so the test can time the exit.
_STOP_DRIVER = r"""
import signal, sys, time
import yxanul_jax.inference.run_sample as run_sample
import yxanul_jax.train as command
import yxanul_jax.training.evaluate as evaluate
from yxanul_jax.training.hooks import Hook

moment, argv, final = sys.argv[1], sys.argv[2:], []

def stop():
    print(f"SIGTERM sent at {time.time()}", file=sys.stderr, flush=True)
    signal.raise_signal(signal.SIGTERM)

class Moment(Hook):
    def on_loop_end(self, loop):
        final.append(True)  # the steps are over: the final validation, save and sample follow

    def on_save(self, loop, step):
        if moment == "save" and final:
            stop()

batches = evaluate.eval_batches
def eval_batches(*args, **kwargs):
    for i, batch in enumerate(batches(*args, **kwargs)):
        if (moment == "validation" and final or moment == "revalidation") and i == 1:
            stop()
        yield batch
evaluate.eval_batches = eval_batches

generate = run_sample.generate
def generate_and_count(*args, should_stop, **kwargs):
    calls = []
    def asked():  # before each token
        calls.append(1)
        if moment == "sample" and len(calls) == 3:
            stop()
        return should_stop()
    return generate(*args, should_stop=asked, **kwargs)
run_sample.generate = generate_and_count

fit = command.fit
command.fit = lambda *args, hooks=(), **kwargs: fit(*args, hooks=[Moment(), *hooks], **kwargs)
sys.exit(command.main(argv))
"""


@pytest.mark.parametrize("moment", ["validation", "save", pytest.param("sample", marks=pytest.mark.slow)])
def test_a_signal_in_the_final_phase_saves_the_last_step_and_exits_within_10_s(env, tmp_path, moment):
    """The final phase runs under the signal guard: a SIGTERM cuts the final validation short (the last step is
    saved unvalidated: 143, run again to validate), lets the final save finish (the run is finished: 0), or ends
    the sample (0); before, it killed the run, the last step unsaved."""
    run = tmp_path / "run"
    extra = {"validation": [], "save": ["checkpoint.async_save=true"], "sample": ["train.sample_tokens=8"]}[moment]
    proc = subprocess.run([sys.executable, "-c", _STOP_DRIVER, moment, "--run-dir", str(run), *TRAINED_RUN,
                           "train.steps=3", "eval.max_batches=4", *extra],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    ended = time.time()
    sent = [float(line.split()[-1]) for line in proc.stderr.splitlines() if line.startswith("SIGTERM sent at")]
    assert len(sent) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ended - sent[0] < 10, ended - sent[0]
    finished = moment != "validation"
    assert proc.returncode == (0 if finished else 128 + signal.SIGTERM), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    with Checkpointer(str(run / "checkpoints"), read_only=True) as ckpt:
        assert ckpt.all_steps() == [3] and ckpt.read_meta(3)["validated"] is finished
    if moment == "validation":
        assert "stopped by SIGTERM during the final validation; step 3 saved" in proc.stdout
        # a signal in the rerun's validation of that step: the same clean stop (no traceback), still unvalidated
        again = subprocess.run([sys.executable, "-c", _STOP_DRIVER, "revalidation", "--run-dir", str(run),
                                *TRAINED_RUN, "train.steps=3", "eval.max_batches=4"],
                               env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert again.returncode == 128 + signal.SIGTERM and "Traceback" not in again.stderr, again.stderr[-3000:]
        assert "stopped by SIGTERM during the validation of step 3; run the same command again" in again.stdout
        rc, out, err = cli("--run-dir", str(run), *TRAINED_RUN, "train.steps=3", "eval.max_batches=4")
        assert rc == 0 and "this run already finished: step 3" in out and "validation at step 3" in out, err
        ppl = next(json.loads(line) for line in out.splitlines() if line.startswith('{"step": 3'))["val/mean/ppl"]
        with Checkpointer(str(run / "checkpoints"), read_only=True) as ckpt:  # its perplexity is the checkpoint's
            assert ckpt.best_step() == 3 and ckpt.metric(3) == pytest.approx(ppl, rel=1e-3)
        # validated once: a later rerun finds its row in metrics.jsonl, validates nothing and logs nothing again
        rc, out, err = cli("--run-dir", str(run), *TRAINED_RUN, "train.steps=3", "eval.max_batches=4")
        assert rc == 0 and "this run already finished: step 3" in out and "validation at step 3" not in out, err
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert sum(1 for r in rows if r["step"] == 3 and "val/mean/loss" in r) == 1, rows
    elif moment == "sample":
        assert "sample skipped" in proc.stderr and "sample (train.sample_prompt" not in proc.stdout


def test_train_as_a_library_call_has_a_pulse(fast_run):
    # levanter's "has a pulse": the library entry point, in process, FP8 on, through a stage change
    run, out, text = fast_run
    assert load_config(None, FAST).fp8.active and load_config(None, FAST).fp8.scaling == "delayed"
    assert out.step == 12 and not out.interrupted
    assert 0 < out.validation["val/mean/loss"] < np.log(512) + 1
    assert "stage 0 from step 0: seq_len 32" in text and "stage 1 from step 6: seq_len 64" in text
    assert "config:" not in text  # the resolved config is in the run directory, not on the console
    assert "parameters, attention xla (auto), remat none; data" in text  # what `model.attention: auto` became here
    assert os.path.exists(os.path.join(run, "config.yaml"))
    assert "s training; outside it compile waits" in text
    assert [r["step"] for r in rows(run, "val/mean/loss")] == [6, 12]


def test_a_warmup_as_long_as_the_run_is_one_warning_line_and_the_run_goes_on(tmp_path):
    rc, _, err = cli("--run-dir", str(tmp_path / "run"), *TRAINED_RUN, "train.steps=2", "optim.warmup_steps=4")
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert rc == 0 and warnings == ["warning: optim.warmup_steps (4) is not below train.steps (2): the learning rates "
                                    "rise through the whole run (the last step at 50% of the peak), and the cosine "
                                    "decay never starts; set optim.warmup_steps=0 (no warmup) for a full schedule"], err


def test_fit_trains_a_loss_of_one_s_own_and_logs_its_terms(tmp_path):
    """fit(loss=...): the step differentiates it from the first (bootstrap) step on, each term of its own is a
    metrics.jsonl column `loss/<name>`, and validation still reports the NLL."""
    import contextlib
    import functools
    import io

    import jax.numpy as jnp

    from yxanul_jax.training.loop import fit
    from yxanul_jax.training.steps import loss_sums

    def extra(h_BxLxD, params, batch):
        return {"hidden_l2": 1e-3 * jnp.sum(batch["mask"] * jnp.sum(jnp.square(h_BxLxD.astype(jnp.float32)), -1))}

    with contextlib.redirect_stdout(io.StringIO()):
        out = fit(load_config(None, [*TRAINED_RUN, "train.steps=3", "train.log_every=1"]), str(tmp_path / "run"),
                  loss=functools.partial(loss_sums, extra=extra))
    logged = rows(str(tmp_path / "run"), "loss/hidden_l2")
    assert [r["step"] for r in logged] == [1, 2, 3] and all(r["loss/hidden_l2"] > 0 for r in logged)
    assert "val/mean/loss" in out.validation and "val/mean/hidden_l2" not in out.validation
    import yaml  # the run records the rate it trained at, not "the optimizer's default" (OptimConfig.with_rate)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optim"]["lr"] == 0.012


def test_a_run_with_split_micro_batches_trains_the_same_losses(tmp_path):
    # train.micro_split (what remat: auto sets where it lets `none` fit): the same rows per step, each micro-batch cut
    # in 2 inside the step; float32 without FP8, so the losses agree to float rounding (rtol 1e-5)
    import contextlib
    import io

    from yxanul_jax.training.loop import fit as train_fn

    base = FAST + ["train.steps=8", "eval.interval=0", "checkpoint.interval=0", "model.dtype=float32",
                   "fp8.enabled=false"]
    losses, logs = {}, {}
    for k in (1, 2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):  # as in one log file
            train_fn(load_config(None, base + [f"train.micro_split={k}"]), str(tmp_path / f"split{k}"))
        losses[k], logs[k] = [r["loss"] for r in rows(str(tmp_path / f"split{k}"))], out.getvalue()
    assert len(losses[1]) == 8 and losses[1][-1] < losses[1][0]
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-5)
    assert "each micro-batch run as 2 of 4 rows (train.micro_split)" in logs[2] and "run as" not in logs[1]
    assert "stage 1 from step 6: seq_len 64 x batch 4 x accum 1, each micro-batch run as 2 of 2 rows" in logs[2]
    # a stage's line comes after the last stage's final step line (the metrics are fetched a step late)
    lines = logs[1].splitlines()
    assert lines.index("stage 1 from step 6: seq_len 64 x batch 4 x accum 1 (full rows)") > next(
        i for i, line in enumerate(lines) if line.startswith("step 6/8 | stage 0")), logs[1]


def test_two_stage_curriculum_compiles_each_stage_once_and_keeps_data_position(tmp_path):
    from yxanul_jax.training.loop import Loop
    from yxanul_jax.training.session import RunContext

    cfg = load_config(None, FAST + ["eval.interval=0", "checkpoint.interval=0"])
    ckpt = Checkpointer(str(tmp_path / "ckpt"), cfg.checkpoint)
    ctx = RunContext.open(cfg)
    loop = Loop(ctx, str(tmp_path), ckpt)  # no hooks: the bare loop
    state, _, _ = ctx.restore_or_init(ckpt, None)
    state, step, stop = loop.run(state, 0)
    ckpt.close()
    assert (step, stop, int(state.step)) == (12, None, 12)
    assert loop.compiler.compile_counts == [1, 1]
    s0, s1 = cfg.curriculum
    expected = s1.start_step * s0.tokens_per_step + (12 - s1.start_step) * s1.tokens_per_step
    assert loop.stream.tokens_consumed == expected == loop.tokens


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    run = str(tmp_path / "nan")
    # Stage 1 multiplies the learning rate by 1e30: the parameters overflow and the loss turns NaN.
    rc, _, err = cli("--run-dir", run, *FAST, "curriculum.1.start_step=4", "curriculum.1.lr_scale=1e30",
                     "eval.interval=0")
    assert rc == 2, err
    assert "error: loss became nan at step 6;" in err and "is step 4 (loss " in err, err
    assert "lower optim.muon_lr and optim.lr" in err, err
    cfg = load_config(None, FAST)
    ckpt = Checkpointer(os.path.join(run, "checkpoints"), cfg.checkpoint)
    assert ckpt.all_steps() == [4]
    from yxanul_jax.training.integrity import tree_is_finite
    from yxanul_jax.training.steps import abstract_train_state
    step, state, _ = ckpt.restore(abstract_train_state(dataclasses.replace(cfg)))
    assert step == 4 and tree_is_finite(state.params)
    ckpt.close()


def _domain_files(tmp_path):
    """Three small real-text validation files (stdlib sources and docs) in three input formats."""
    import sysconfig

    import pyarrow as pa
    import pyarrow.parquet as pq

    stdlib = sysconfig.get_paths()["stdlib"]
    texts = [open(os.path.join(stdlib, f), encoding="utf-8").read()[:4000] for f in ("json/__init__.py", "csv.py")]
    prose = tmp_path / "prose.txt"
    prose.write_text(__import__("this").__doc__ or "".join(texts))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps({"question": t[:300], "answer": t[300:600]}) for t in texts))
    code = tmp_path / "code.parquet"
    pq.write_table(pa.table({"text": texts}), code)
    return {"prose": str(prose), "qa": f"{qa}::{{question}}\\n{{answer}}", "code": str(code)}


def _eval_only(run, domains):
    args = [f"eval.domains.{k}={v}" for k, v in domains.items()]
    rc, out, err = cli("--run-dir", run, "--eval-only", *FAST, *args)
    assert rc == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    for name in domains:
        assert data[f"val/{name}/loss"] > 0 and data[f"val/{name}/ppl"] > 1
    assert "val/mean/ppl" in data and data["step"] == 12
    return data


def test_eval_only_reports_every_domain(fast_run, tmp_path):
    _eval_only(fast_run[0], _domain_files(tmp_path))
    # Real validation sets of the SPEC (C4, GSM8K, HumanEval) when ../shared is present.
    val = shared_path("data", "validation")
    _eval_only(fast_run[0], {"english": str(val / "c4_validation_2k.parquet"),
                             "math": f"{val / 'gsm8k_validation.parquet'}::{{question}}\\n{{answer}}",
                             "code": f"{val / 'humaneval_validation.parquet'}::{{prompt}}{{canonical_solution}}"})


def test_eval_only_joins_as_its_own_command_line_says_not_as_the_run_trained(tmp_path):
    """--eval-only reads the run's saved config but joins its processes as this command says: a group of N processes
    or a long timeout saved by the training job is not waited on (the --checkpoint path must join before it can read
    the saved config at all, so both paths join alike)."""
    from yxanul_jax.core.coerce import to_yaml
    from yxanul_jax.core.config import MeshConfig
    from yxanul_jax.core.rundir import CONFIG_FILE
    from yxanul_jax.train import load_run_config, parse_args

    trained = load_config(None, ["mesh.num_processes=4", "mesh.coordinator_address=10.0.0.1:1234",
                                 "mesh.init_timeout_s=900", "mesh.heartbeat_timeout_s=600", "model.d_model=48"])
    (tmp_path / CONFIG_FILE).write_text(to_yaml(trained))
    cfg = load_run_config(parse_args(["--eval-only", "--run-dir", str(tmp_path)]))
    assert cfg.mesh == MeshConfig() and cfg.model.d_model == 48  # the run's model, this command's group
    cfg = load_run_config(parse_args(["--eval-only", "--run-dir", str(tmp_path), "mesh.init_timeout_s=60"]))
    assert cfg.mesh.init_timeout_s == 60 and cfg.mesh.heartbeat_timeout_s == MeshConfig().heartbeat_timeout_s


def test_run_dir_with_another_config_is_refused(fast_run, tmp_path):
    run = fast_run[0]
    before = sorted(os.listdir(run))
    rc, _, err = cli("--run-dir", run, *FAST, "model.d_model=32")
    assert rc == 2 and err.strip().splitlines()[-1].startswith("error: ") and "model.d_model" in err
    assert sorted(os.listdir(run)) == before  # refused before anything is written
    rc, _, err = cli("--run-dir", str(tmp_path / "nothing"), "--eval-only", *FAST)
    assert rc == 2 and "error: " in err


def _tree(path) -> dict:
    """Every file under `path` with its bytes: what a refused or no-op command must leave as it was."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def test_refusals_and_no_op_runs_write_nothing(fast_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fast_run[0], run)
    before, touched = _tree(run), os.stat(run).st_mtime_ns

    def refused(*args, needle):
        rc, _, err = cli(*args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and lines[-1].startswith("error: ") and needle in lines[-1], err[-2000:]

    # a bad --checkpoint: checked before the new run directory exists, or before --overwrite moves anything
    refused("--run-dir", str(tmp_path / "new"), *FAST, "--checkpoint", str(run / "checkpoints" / "999"),
            needle="does not exist")
    refused("--run-dir", str(tmp_path / "new"), *FAST, "model.d_model=32", "--checkpoint", str(run / "checkpoints"),
            needle="was saved with model.d_model=64, but model.d_model=32 is given here")
    refused("--run-dir", str(run), *FAST, "--overwrite", "--checkpoint", str(tmp_path / "nothing"),
            needle="does not exist")
    refused("--run-dir", str(tmp_path / "new"), *FAST, "--checkpoint", str(run / "config.yaml"),
            needle="is a file, not a checkpoint")
    refused("--run-dir", str(tmp_path / "new"), *FAST, "train.steps=10", "--checkpoint", str(run / "checkpoints"),
            needle="--checkpoint is at step 12 and train.steps is 10: there is nothing to train")  # had written a run
    # what a resume in the checkpoint's own folder refuses: refused for --checkpoint too, before the folder exists
    # (a raised train.steps without train.extend had left an empty folder; warmup and batch were taken silently)
    refused("--run-dir", str(tmp_path / "new"), *FAST, "train.steps=14", "--checkpoint", str(run / "checkpoints"),
            needle="train.steps went from 12 to 14 on a run resuming at step 12")
    more = ["train.steps=14", "train.extend=decay", "--checkpoint", str(run / "checkpoints")]
    refused("--run-dir", str(tmp_path / "new"), *FAST, "optim.warmup_steps=3", *more,
            needle=f"--checkpoint {run / 'checkpoints'} was saved with 'optim.warmup_steps' 2, not 3, which continuing "
                   "its train state cannot change; pass optim.warmup_steps=2, or init.from_checkpoint=")
    refused("--run-dir", str(tmp_path / "new"), *FAST, "curriculum.1.batch_size=8", *more,
            needle="was saved with 'curriculum.1.batch_size' 4, not 8")
    assert not (tmp_path / "new").exists()
    # the run's own earlier step into the run itself: its later checkpoints would be overwritten (and its metrics cut)
    earlier = min(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert earlier < 12
    refused("--run-dir", str(run), *FAST, "--checkpoint", str(run / "checkpoints" / str(earlier)),
            needle=f"--checkpoint starts at step {earlier}, but run directory '{run}' holds the later step 12")
    (tmp_path / "afile").write_text("x")
    refused("--run-dir", str(tmp_path / "afile"), *FAST, needle="is a file; pass a directory")
    refused("--run-dir", str(tmp_path / "afile" / "sub"), *FAST, needle=f"'{tmp_path / 'afile'}' is a file; pass a "
                                                                       "--run-dir that is not inside it")
    refused("--run-dir", str(tmp_path / "empty"), *FAST, "--eval-only", needle="has no checkpoint to validate yet")
    # a finished run asked for fewer steps and another lr trains nothing and records nothing
    rc, out, err = cli("--run-dir", str(run), *FAST, "train.steps=10", "optim.lr=1e-4")
    assert rc == 0 and "this run already finished: step 12" in out, err[-2000:]
    assert _tree(run) == before and os.stat(run).st_mtime_ns == touched  # the run lock came and went


@pytest.mark.slow
def test_profile_trace_and_hlo_dump_for_requested_steps(tmp_path):
    run = tmp_path / "prof"
    rc, _, err = cli("--run-dir", str(run), *FAST, "train.steps=5", "eval.interval=0", "profile.start_step=2",
                     "profile.num_steps=2", "profile.dump_hlo=true")
    assert rc == 0, err
    traces = list((run / "profile").rglob("*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0
    hlo = (run / "hlo" / "stage_0.txt").read_text()
    assert "ENTRY" in hlo and "f8e4m3fn" in hlo
    # delayed FP8 scaling: the fresh run's step 0 ran once with current scaling, compiled on its own
    assert "f8e4m3fn" in (run / "hlo" / "stage_0_fp8_bootstrap.txt").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(r["fp8_nonfinite"] == 0 for r in steps)
    assert all(r["fp8_saturation"] > 0 for r in steps[1:])  # delayed steps


# The command's own helpers (argument parsing, default run directory)


def test_cli_habits_overrides_anywhere_and_a_config_path_without_flag(tmp_path):
    from yxanul_jax.train import parse_args

    args = parse_args(["model.dtype=float32", "--disable-fp8", "train.steps=3", "--run-dir", "x", "eval.interval=0"])
    assert args.overrides == ["model.dtype=float32", "train.steps=3", "eval.interval=0"] and args.disable_fp8
    with pytest.raises(UserError, match="did you mean --config configs/tiny.yaml"):
        load_config(None, ["configs/tiny.yaml"])


def test_an_overridden_model_gets_its_own_default_run_dir(tmp_path, monkeypatch):
    from yxanul_jax.train import default_run_dir

    tiny = "configs/tiny.yaml"
    assert default_run_dir(load_config(tiny), tiny) == "runs/tiny"
    changed = default_run_dir(load_config(tiny, ["model.d_model=256"]), tiny)
    assert changed.startswith("runs/tiny-") and len(changed) == len("runs/tiny-") + 8
    assert default_run_dir(load_config(tiny, ["train.steps=5"]), tiny) == "runs/tiny"
    # what a resume may change of the model is not the model: the OOM advice `model.remat=full` resumes runs/tiny
    # (it started a fresh run in runs/tiny-<hash>) ...
    for resumable in (["model.remat=full"], ["model.scan_unroll=2", "model.attention=xla"]):
        assert default_run_dir(load_config(tiny, resumable), tiny) == "runs/tiny"
        assert default_run_dir(load_config(tiny, ["model.d_model=256", *resumable]), tiny) == changed
    # ... and a run started before that rule, in the folder the old one named, is still found there
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    old = load_config(tiny, ["model.d_model=256", "model.remat=full"])
    assert default_run_dir(old, tiny) == changed
    import hashlib
    import json

    from yxanul_jax.core.coerce import to_dict

    legacy = f"runs/tiny-{hashlib.sha256(json.dumps(to_dict(old.model), sort_keys=True).encode()).hexdigest()[:8]}"
    (tmp_path / legacy).mkdir(parents=True)
    assert legacy != changed and default_run_dir(old, tiny) == legacy
