"""Tests for yxanul_jax.training.monitor: run directory, metrics.jsonl + real TensorBoard files, header, progress, FLOPs."""
from __future__ import annotations

import io
import json
import os
import re
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from tensorboardX.proto import event_pb2

from yxanul_jax.analysis.accounting import flops_per_token
from yxanul_jax.core.coerce import from_dict, to_yaml
from yxanul_jax.core.config import Config, ModelConfig, load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import prepare_run_dir
from yxanul_jax.training.monitor import MetricsWriter, Progress, mfu, peak_flops_per_device, run_header


def _cfg(*overrides: str) -> Config:
    return load_config(None, ["model.d_model=64", "curriculum.0.seq_len=64", *overrides])


def _tb_scalars(tb_dir: str) -> dict[tuple[str, int], float]:
    """(tag, step) -> value from every TFRecord event file in `tb_dir` (length, crc, data, crc)."""
    out = {}
    for name in sorted(os.listdir(tb_dir)):
        with open(os.path.join(tb_dir, name), "rb") as fh:
            data = fh.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out[(value.tag, event.step)] = value.simple_value
    return out


# --------------------------------------------------------------------------------------------
# Run directory


def test_config_yaml_round_trips(tmp_path):
    cfg = _cfg("eval.domains={web: /data/web, code: /data/code}")
    run_dir = tmp_path / "run"
    ckpt_dir = prepare_run_dir(str(run_dir), cfg)
    assert ckpt_dir == str(run_dir / "checkpoints")
    assert sorted(os.listdir(run_dir)) == ["config.yaml"]  # no temp file left behind
    back = from_dict(Config, yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert back == cfg
    assert prepare_run_dir(str(run_dir), cfg) == ckpt_dir  # same config again: accepted (resume)


def test_config_guard_refuses_model_and_data_changes_and_takes_resumable_ones(tmp_path, capsys):
    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), _cfg())
    layers, batch = Config().model.n_layers, Config().curriculum[0].batch_size
    # nothing trained yet (a failed start): the corrected command is taken, and recorded
    prepare_run_dir(str(run_dir), _cfg(f"model.n_layers={layers + 1}"))
    history = [json.loads(x) for x in (run_dir / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changes"] == {"model.n_layers": [layers, layers + 1]}
    (run_dir / "checkpoints" / "100").mkdir(parents=True)
    original = (run_dir / "config.yaml").read_text()
    with pytest.raises(UserError, match=rf"'model\.n_layers' is {layers + 1}, not {layers}, which a resume cannot "
                                        rf"change; pass model\.n_layers={layers + 1} to resume it as it was, a new "
                                        "--run-dir, or --overwrite to start over$"):
        prepare_run_dir(str(run_dir), _cfg())  # the weights' shape changes: none to start from
    with pytest.raises(UserError, match=rf"'curriculum\.0\.batch_size' is {batch}, not {batch + 1}.*with "
                                        "init.from_checkpoint=.*checkpoints to start from its weights"):
        prepare_run_dir(str(run_dir), _cfg(f"model.n_layers={layers + 1}", f"curriculum.0.batch_size={batch + 1}"))
    assert (run_dir / "config.yaml").read_text() == original
    # settings a resume may change: more steps, logging, eval, checkpointing, the peak lr
    resumed = _cfg(f"model.n_layers={layers + 1}", "train.steps=900", "train.log_every=5", "optim.lr=1e-4",
                   "eval.interval=50", "checkpoint.interval=25")
    capsys.readouterr()
    prepare_run_dir(str(run_dir), resumed)
    said = capsys.readouterr().err  # each change named, not only recorded
    assert "5 setting(s) differ from the run's config.yaml and are taken from here on: " in said, said
    assert "optim.lr 0.012 -> 0.0001" in said and "train.steps 1000 -> 900" in said, said
    assert "(recorded in config_history.jsonl)" in said, said
    assert from_dict(Config, yaml.safe_load((run_dir / "config.yaml").read_text())) == resumed
    last = json.loads((run_dir / "config_history.jsonl").read_text().splitlines()[-1])["changes"]
    assert set(last) == {"train.steps", "train.log_every", "optim.lr", "eval.interval", "checkpoint.interval"}

    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    new = _cfg(f"model.n_layers={layers + 2}")
    prepare_run_dir(str(run_dir), new, overwrite=True)
    assert from_dict(Config, yaml.safe_load((run_dir / "config.yaml").read_text())) == new
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
    (aside,) = [p for p in run_dir.iterdir() if p.name.startswith("replaced-")]
    assert (aside / "checkpoints" / "100").is_dir()  # moved, not deleted


@pytest.mark.parametrize("value", ["adamw", "yes", "null", "1e-3", "a b", "3"])
def test_a_refusal_names_an_override_that_gives_the_saved_value_back(value):
    import shlex

    from yxanul_jax.core.coerce import apply_overrides
    from yxanul_jax.core.rundir import _override

    (as_typed,) = shlex.split(_override("data.train", value))  # what the shell hands the command
    assert apply_overrides(Config(), [as_typed]).data.train == value


def test_run_lock_refuses_a_live_holder_and_takes_over_a_dead_ones(tmp_path):
    import subprocess
    import sys

    from yxanul_jax.core.rundir import LOCK_FILE, RunLock

    with RunLock(str(tmp_path)):
        with pytest.raises(UserError, match=r"in use by another train process \(PID \d+\)"):
            RunLock(str(tmp_path)).acquire()
    assert not (tmp_path / LOCK_FILE).exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with RunLock(str(tmp_path)) as lock:  # a stale lock of a process that is gone
        assert lock.held and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    for foreign in ("1", "[]", '"x"', "{"):  # JSON, but not a lock this wrote (a bare number was a traceback)
        (tmp_path / LOCK_FILE).write_text(foreign)
        with RunLock(str(tmp_path)) as lock:
            assert lock.held and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_folder_with_a_runs_files_but_no_config_is_refused_not_written_over(tmp_path):
    """Training into a folder that holds what a run writes, without a config.yaml: one line, nothing changed; with
    --overwrite its files are moved aside, as a run's are."""
    run_dir = tmp_path / "notes"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"my": "data"}\n')
    (run_dir / "tokenizer.json").write_text("{}")
    (run_dir / "README.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(UserError, match=r"holds tokenizer.json, metrics.jsonl but no config.yaml.*--overwrite"):
        prepare_run_dir(str(run_dir), _cfg())
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    prepare_run_dir(str(tmp_path / "empty"), _cfg())  # a new or empty folder is a new run
    prepare_run_dir(str(tmp_path / "empty"), _cfg())  # ... and then a run: the same config is kept
    copied = tmp_path / "copied"  # checkpoints alone are a run: the config saved with them stands for config.yaml
    (copied / "checkpoints" / "100").mkdir(parents=True)
    (copied / "metrics.jsonl").write_text("")
    saved = yaml.safe_load(to_yaml(_cfg()))
    with pytest.raises(UserError, match=r"holds a run whose 'data.shuffle_seed' is 0, not 5, which a resume cannot change"):
        prepare_run_dir(str(copied), _cfg("data.shuffle_seed=5"), checkpoint_config=saved)
    assert sorted(p.name for p in copied.iterdir()) == ["checkpoints", "metrics.jsonl"]  # refused before writing
    moved = _cfg("train.log_every=3", "data.train=/elsewhere/prepared")  # a resumable change and data moved: taken
    prepare_run_dir(str(copied), moved, checkpoint_config=saved)  # (the stream's restore checks the data by content)
    assert not (copied / "config.yaml").exists()  # ... and recorded only once the run has resumed: the next call
    prepare_run_dir(str(copied), moved)
    assert from_dict(Config, yaml.safe_load((copied / "config.yaml").read_text())).train.log_every == 3
    prepare_run_dir(str(run_dir), _cfg(), overwrite=True)
    (aside,) = [p for p in run_dir.iterdir() if p.name.startswith("replaced-")]
    assert (aside / "metrics.jsonl").read_text() == '{"my": "data"}\n' and (run_dir / "README.txt").exists()


def test_an_emptied_run_config_is_refused_not_read_as_the_defaults(tmp_path):
    """An empty config.yaml read as the defaults gave advice that contradicted itself (train: "pass model.d_model=64",
    then "the run's model.d_model is 128"; generate: a missing FP8 key); every reader of a run's config refuses it."""
    from yxanul_jax.core.config import load_config
    from yxanul_jax.inference.trained import load_trained

    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), _cfg())
    (run_dir / "config.yaml").write_text("")
    with pytest.raises(UserError, match=r"config.yaml' is empty, so the run's model and data are unknown; restore it"):
        prepare_run_dir(str(run_dir), _cfg())
    with pytest.raises(UserError, match=r"run config '.*config.yaml' is empty"):
        load_trained(run_dir=str(run_dir))
    assert load_config(str(run_dir / "config.yaml")) == load_config()  # a user's empty --config file: the defaults


def test_a_head_width_spelled_out_is_the_automatic_one(tmp_path):
    # init.from_hf wrote model.head_dim out (d_model // n_heads) before it kept 0: such a run still resumes
    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), _cfg())
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["model"]["head_dim"] = saved["model"]["d_model"] // saved["model"]["n_heads"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    (run_dir / "checkpoints" / "5").mkdir(parents=True)
    prepare_run_dir(str(run_dir), _cfg())  # the same model
    with pytest.raises(UserError, match="'model.head_dim' is 32, not 0"):  # another width is another model
        saved["model"]["head_dim"] = 32
        (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
        prepare_run_dir(str(run_dir), _cfg())


def test_fresh_start_refuses_existing_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), _cfg())
    (run_dir / "checkpoints" / "300").mkdir(parents=True)
    with pytest.raises(UserError, match="already holds checkpoints \\(latest step 300\\)"):
        prepare_run_dir(str(run_dir), _cfg(), resume=False)
    # a setting a resume may change, refused with the rest: nothing written on the way (no history, same config)
    before = (run_dir / "config.yaml").read_text()
    with pytest.raises(UserError, match="already holds checkpoints \\(latest step 300\\)"):
        prepare_run_dir(str(run_dir), _cfg("train.steps=900"), resume=False)
    assert not (run_dir / "config_history.jsonl").exists() and (run_dir / "config.yaml").read_text() == before
    prepare_run_dir(str(run_dir), _cfg(), resume=True)


# --------------------------------------------------------------------------------------------
# Metrics


def test_metrics_jsonl_and_tensorboard(tmp_path):
    run_dir = str(tmp_path)
    with MetricsWriter(run_dir) as writer:
        writer.write({"step": 10, "stage": 0, "seq_len": 128, "loss": jnp.float32(3.5), "lr": 1e-3,
                      "grad_norm": np.float32(0.75), "tokens": 20480, "tokens_per_sec": 1234.5, "mfu": None})
        writer.write({"step": 20, "val/web/loss": 2.0, "val/web/ppl": float(np.exp(2.0)), "note": "eval"})
        writer.write({"step": 30, "loss": float("nan")})
        with pytest.raises(ValueError, match="without 'step'"):
            writer.write({"loss": 1.0})
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert rows[0]["loss"] == 3.5 and rows[0]["grad_norm"] == 0.75 and rows[0]["tokens"] == 20480
    assert rows[0]["mfu"] is None and rows[1]["note"] == "eval" and rows[2]["loss"] is None
    scalars = _tb_scalars(os.path.join(run_dir, "tb"))
    assert scalars[("loss", 10)] == 3.5
    assert scalars[("tokens", 10)] == 20480.0
    assert scalars[("val/web/ppl", 20)] == pytest.approx(np.exp(2.0), rel=1e-6)
    assert np.isnan(scalars[("loss", 30)])
    assert ("stage", 10) in scalars and ("note", 20) not in scalars


def test_metrics_resume_drops_rows_after_the_checkpoint(tmp_path):
    run_dir = str(tmp_path)
    with MetricsWriter(run_dir) as writer:
        for step in (10, 20, 30):
            writer.write({"step": step, "loss": 1.0 / step})
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as fh:
        fh.write('{"step": 40, "lo')  # torn by a crash
    with MetricsWriter(run_dir, resume_step=20) as writer:
        writer.write({"step": 30, "loss": 0.5})
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [(r["step"], r["loss"]) for r in rows] == [(10, 0.1), (20, 0.05), (30, 0.5)]


# --------------------------------------------------------------------------------------------
# Header and progress


def test_run_header_has_versions_devices_commit_and_config():
    cfg = _cfg()
    header = run_header(cfg)
    for dist, version in (("jax", jax.__version__), ("jaxlib", jax.lib.__version__)):
        assert f"{dist} {version}" in header
    for dist in ("yxanul-jax", "flax", "optax", "orbax-checkpoint", "grain"):
        assert re.search(rf"\b{dist} \d+\.\d+", header), dist
    assert f"{jax.device_count()} x {jax.devices()[0].device_kind}" in header
    assert re.search(r"git commit: ([0-9a-f]{40}(\+dirty)?|unknown)\n", header)
    config_text = header.split("config:\n", 1)[1]
    assert from_dict(Config, yaml.safe_load(config_text)) == cfg


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_and_eta():
    times = iter([100.0, 110.0, 130.0])
    out = io.StringIO()
    progress = Progress(100, stream=out, clock=lambda: next(times))
    first = progress.update(10, 0, 128, 4.0, 12345.0, None)
    assert first.endswith("MFU n/a | ETA --")
    line = progress.update(20, 1, 512, 2.5, 12345.0, 0.41)
    assert line == "step 20/100 | stage 1 seq 512 | loss 2.5000 | 12.35k tok/s | MFU 41.0% | ETA 1m20s"
    progress.update(40, 1, 512, 2.4, 2.5e6, 0.4)  # 30 steps in 30 s over the window: 60 s left
    assert out.getvalue().splitlines()[-1].endswith("2.50M tok/s | MFU 40.0% | ETA 1m00s")
    assert out.getvalue().count("\n") == 3 and "\r" not in out.getvalue()

    term = _Terminal()
    progress = Progress(10, stream=term, clock=iter([0.0, 1.0]).__next__)
    progress.update(1, 0, 64, 1.0, 10.0, None)
    progress.update(2, 0, 64, 1.0, 10.0, None)
    assert term.getvalue().count("\r") == 2 and "\n" not in term.getvalue()
    progress.close()
    assert term.getvalue().endswith("\n")


def test_progress_off_a_terminal_prints_every_log_every_steps_and_the_last():
    out = io.StringIO()
    progress = Progress(10, every=4, stream=out, clock=iter(range(100)).__next__)
    lines = [progress.update(step, 0, 64, 1.0, 10.0, None) for step in range(1, 11)]
    assert all(line.startswith(f"step {i}/10 ") for i, line in enumerate(lines, 1))  # each step recorded
    assert [line.split(" |")[0] for line in out.getvalue().splitlines()] == ["step 4/10", "step 8/10", "step 10/10"]
    assert out.getvalue().splitlines()[1].endswith("ETA 0m02s")  # the rate counts every step, printed or not

    term = _Terminal()  # a terminal: one live line, rewritten at every step whatever `every` is
    progress = Progress(10, every=4, stream=term, clock=iter(range(100)).__next__)
    for step in range(1, 11):
        progress.update(step, 0, 64, 1.0, 10.0, None)
    assert term.getvalue().count("\r") == 10 and "\n" not in term.getvalue()
    with pytest.raises(ValueError, match="every"):
        Progress(10, every=0)


def test_run_header_says_how_to_open_the_profile():
    assert "profile" not in run_header(_cfg(), with_config=False)  # no trace, no word of it
    cfg = _cfg("profile.start_step=3", "profile.num_steps=2")
    header = run_header(cfg, with_config=False, run_dir="runs/my run")
    assert ("profile: the 2 steps after step 3 traced into runs/my run/profile; open it with\n"
            "  xprof --logdir 'runs/my run/profile' --port 8791  (pip install xprof; then open http://localhost:8791)\n"
            "  tensorboard --logdir 'runs/my run/profile'  (pip install tensorboard tensorboard-plugin-profile; "
            "then open http://localhost:6006/#profile)\n") in header
    assert "traced into <run dir>/profile" in run_header(cfg, with_config=False)  # no run directory given


@pytest.fixture(scope="module")
def profiled_runs(tmp_path_factory, shared_caches):
    """Two real runs of the session's tiny model with `profile.*` set (the steps compiled for conftest's trained
    run): a trace of steps 3-4 of 6, and one cut short by the end of the run (5 steps asked after step 4). Each
    gives (run directory, stdout, stderr)."""
    import contextlib

    from conftest import TRAINED_RUN
    from yxanul_jax.training.loop import fit

    runs = {}
    for name, overrides in (("full", ["profile.start_step=2", "profile.num_steps=2", "train.log_every=2"]),
                            ("cut", ["profile.start_step=4", "profile.num_steps=5"])):
        run_dir = str(tmp_path_factory.mktemp("profiled") / name)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            fit(load_config(None, [*TRAINED_RUN, *overrides]), run_dir)
        runs[name] = (run_dir, out.getvalue(), err.getvalue())
    return runs


def _traces(run_dir: str) -> list[str]:
    import glob

    return glob.glob(os.path.join(run_dir, "profile", "plugins", "profile", "*", "*.xplane.pb"))


def test_a_profiled_run_says_where_its_trace_is_and_how_to_open_it(profiled_runs):
    run_dir, out, err = profiled_runs["full"]
    trace_dir = os.path.join(run_dir, "profile")
    viewers = [f"  xprof --logdir {trace_dir} --port 8791  (pip install xprof; then open http://localhost:8791)",
               f"  tensorboard --logdir {trace_dir}  (pip install tensorboard tensorboard-plugin-profile; then open "
               "http://localhost:6006/#profile)"]
    assert "\n".join([f"profile: the 2 steps after step 2 traced into {trace_dir}; open it with", *viewers]) in out
    assert "\n".join([f"profile of the 2 steps after step 2 written to {trace_dir}; open it with", *viewers]) in out
    assert len(_traces(run_dir)) == 1 and os.path.getsize(_traces(run_dir)[0]) > 0  # where both tools look
    # stderr is not a terminal here: one progress line every train.log_every=2 steps
    assert [line.split(" |")[0] for line in err.splitlines() if line.startswith("step ")] == [
        "step 2/6", "step 4/6", "step 6/6"]

    run_dir, out, _ = profiled_runs["cut"]
    assert f"profile of the steps after step 4 written to {os.path.join(run_dir, 'profile')}; open it with" in out
    assert len(_traces(run_dir)) == 1  # the run ended inside the trace: what it holds is kept


def test_the_printed_xprof_command_opens_the_trace(profiled_runs):
    """The header's xprof command, as printed (on a free port), serves the run's trace; skipped where xprof is
    not installed (`pip install xprof`: an optional viewer, not a dependency)."""
    import gzip
    import shlex
    import shutil
    import socket
    import subprocess
    import time
    import urllib.request

    if shutil.which("xprof") is None:
        pytest.skip("xprof is not installed (pip install xprof)")
    run_dir, out, _ = profiled_runs["full"]
    line = next(x for x in out.splitlines() if x.strip().startswith("xprof --logdir"))
    argv = shlex.split(line.split("(pip install")[0])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv[argv.index("--port") + 1] = str(port)
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, runs = time.time() + 120, None
        while runs is None and time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/profile/runs", timeout=5) as r:
                    body = r.read()
                    runs = json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)
            except OSError:
                time.sleep(1)
        assert runs == [os.path.basename(os.path.dirname(_traces(run_dir)[0]))], runs
    finally:
        server.terminate()
        server.wait(timeout=30)


# --------------------------------------------------------------------------------------------
# FLOPs and MFU


def test_flops_per_token_matches_hand_count():
    m = ModelConfig(vocab_size=100, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=0,
                    ffn_dim=16, embed_rank=4, head="tied")
    # head_dim 4. Per layer: q 8*8=64, k 8*4=32, v 32, o 64 -> 192; SwiGLU 3*8*16=384 -> 576; x2 = 1152.
    # Embedding r->d projection 4*8=32; tied factorized head d->r->vocab 8*4+4*100=432. N = 1616.
    # Attention: 12 * 2 layers * 2 heads * 4 * seq 16 = 3072.
    assert flops_per_token(m, 16) == 6 * 1616 + 3072
    untied = ModelConfig(**{**m.__dict__, "head": "untied"})  # head d*vocab=800: N = 1152+32+800
    assert flops_per_token(untied, 16) == 6 * 1984 + 3072
    full_table = ModelConfig(**{**m.__dict__, "embed_rank": 0})  # no projection, head 800: N = 1952
    assert flops_per_token(full_table, 0) == 6 * 1952


def test_peak_flops_and_mfu(monkeypatch):
    monkeypatch.delenv("YXANUL_PEAK_TFLOPS", raising=False)
    assert peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops_per_device("NVIDIA H100 PCIe") == 756.5e12
    assert peak_flops_per_device("NVIDIA H200") == 989.4e12
    assert peak_flops_per_device("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_per_device("NVIDIA GeForce RTX 4090") == 165.2e12
    assert peak_flops_per_device("NVIDIA GeForce RTX 5090") == 209.5e12
    assert peak_flops_per_device("NVIDIA L4") == 121e12
    assert peak_flops_per_device("NVIDIA L40S") is None
    assert peak_flops_per_device(jax.devices("cpu")[0]) is None
    monkeypatch.setenv("YXANUL_PEAK_TFLOPS", "100")
    assert peak_flops_per_device(jax.devices("cpu")[0]) == 100e12
    monkeypatch.setenv("YXANUL_PEAK_TFLOPS", "fast")
    with pytest.raises(UserError, match="YXANUL_PEAK_TFLOPS"):
        peak_flops_per_device("NVIDIA H100 80GB HBM3")
    assert mfu(1000.0, 1e9, 2, 1e12) == 0.5
    assert mfu(1000.0, 1e9, 2, None) is None
