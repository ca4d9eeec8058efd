"""Sharding and multi-host: the same run on 1 device, 8 virtual devices (data x fsdp) and 2 processes."""
import json
import os
import re
import subprocess
import sys

import pytest

from yxanul_jax.core.config import MeshConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.training.sharding import mesh_shape

from conftest import REPO
from multihost import RUN, cpu_env, free_port, losses, train

pytestmark = pytest.mark.slow  # subprocesses on 8 CPU devices and several processes: `pytest -m "not slow"` skips it

def test_mesh_shape_resolution_and_errors():
    assert mesh_shape(MeshConfig(data=-1, fsdp=4), 8) == (2, 4)
    assert mesh_shape(MeshConfig(data=2, fsdp=-1), 8) == (2, 4)
    assert mesh_shape(MeshConfig(), 1) == (1, 1)
    with pytest.raises(UserError, match="does not fit 8 devices"):
        mesh_shape(MeshConfig(data=3, fsdp=1), 8)


@pytest.fixture(scope="module")
def cache():
    return os.environ["YXANUL_CACHE"]  # the session's (conftest): the demo corpus is built once


def _env(cache, devices=1):
    return cpu_env(devices, YXANUL_CACHE=cache)


def test_one_device_and_eight_devices_give_the_same_losses(cache, tmp_path, capsys):
    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.loop import fit

    fit(load_config(None, RUN), str(tmp_path / "one"))  # this process: one CPU device
    assert "data=1 x fsdp=1" in capsys.readouterr().out
    eight = train(_env(cache, 8), "--run-dir", str(tmp_path / "eight"), *RUN, "mesh.data=2", "mesh.fsdp=4")
    assert "data=2 x fsdp=4" in eight.stdout
    a, b = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert len(a) == len(b) == 20
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-5 * abs(x), (a, b)


def test_an_fsdp_run_resumes_with_the_losses_of_the_unbroken_run(cache, tmp_path):
    """FSDP over 4 devices, stopped at step 10 and resumed: bit-equal losses. The restore's check that the ~100
    sharded arrays are finite had put one small cross-device reduction per array in flight, and on CPU devices some
    fifty of them deadlocked (the process aborted): no FSDP run could resume."""
    import shutil

    env, run = _env(cache, 4), tmp_path / "fsdp"
    train(env, "--run-dir", str(run), *RUN, "mesh.data=1", "mesh.fsdp=4", "checkpoint.interval=10")
    unbroken = losses(run)
    shutil.rmtree(run / "checkpoints" / "20")  # as if stopped after step 10's checkpoint
    again = train(env, "--run-dir", str(run), *RUN, "mesh.data=1", "mesh.fsdp=4", "checkpoint.interval=10")
    assert "resum" in again.stdout + again.stderr and len(unbroken) == 20
    assert losses(run) == unbroken


def test_validation_batches_the_devices_do_not_divide_count_the_same_tokens(cache, tmp_path):
    """eval.batch_size 6 on 4 devices (the default 16 on 32 GPUs alike) crashed at the first validation, after
    training, leaving the last step unsaved; its batches are now padded with rows that count nothing: the same
    tokens as on one device, and the loss to reduction order."""
    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.loop import fit

    run = [*RUN, "train.steps=4", "eval.batch_size=6", "eval.max_batches=3"]
    fit(load_config(None, run), str(tmp_path / "one"))
    train(_env(cache, 4), "--run-dir", str(tmp_path / "four"), *run, "mesh.data=4")

    def validation(run_dir):
        with open(run_dir / "metrics.jsonl") as fh:
            return [r for r in map(json.loads, fh) if "val/mean/loss" in r][-1]

    one, four = validation(tmp_path / "one"), validation(tmp_path / "four")
    assert one["val/heldout/tokens"] == four["val/heldout/tokens"] == 3 * 6 * 64
    assert abs(one["val/mean/loss"] - four["val/mean/loss"]) <= 1e-5 * one["val/mean/loss"]


def test_a_hand_set_split_must_divide_each_devices_rows(cache, tmp_path):
    # 8 rows on 8 devices: 1 row each, which train.micro_split=2 cannot halve. One line naming the fix, exit 2,
    # nothing written (on a mesh remat: auto never splits, so only a hand-set split meets this)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.train", "--run-dir", str(run), *RUN, "mesh.data=8",
                           "train.micro_split=2"], env=_env(cache, 8), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: config key 'train.micro_split' (2) must divide each device's rows, but curriculum.0 gives 1 to each of "
        "8 devices; set train.micro_split=1 (on a mesh remat: auto does not split)")
    assert not run.exists()


def test_parameters_are_sharded_over_fsdp(cache):
    code = """
import jax
from yxanul_jax.core.config import load_config
from yxanul_jax.training.sharding import make_mesh, state_shardings
from yxanul_jax.training.steps import abstract_train_state

cfg = load_config('configs/yxanul_197m.yaml', ['mesh.data=2', 'mesh.fsdp=4', 'optim.name=adamw'])  # Adam's moments
mesh = make_mesh(cfg.mesh)
s = state_shardings(cfg, mesh, abstract_train_state(cfg))
p = s.params
print(p['layers']['mlp']['up']['kernel'].spec, p['embedding'].spec, s.opt_state[0].mu['layers']['mlp']['up']['kernel'].spec,
      s.fp8['fp8_meta']['layers']['mlp']['up']['gemm']['input']['scale'].spec)
"""
    proc = subprocess.run([sys.executable, "-c", code], env=_env(cache, 8), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip()
    assert out.count("'fsdp'") >= 3, out  # kernel, embedding table and its Adam moment are sharded
    assert out.endswith("P()"), out  # FP8 state replicated


def _two_processes(cache, run: str, *overrides: str) -> list:
    """The train command as processes 0 and 1 of one run (the tiny RUN config plus `overrides`), started."""
    args = [*RUN, *overrides, f"mesh.coordinator_address=127.0.0.1:{free_port()}", "mesh.num_processes=2"]
    return [subprocess.Popen([sys.executable, "-m", "yxanul_jax.train", "--run-dir", run, *args,
                              f"mesh.process_id={i}"], env=_env(cache, 1), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(2)]


def _both_succeed(procs: list) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process once it ends; both must exit 0."""
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    return outs


def test_two_processes_train_together_and_agree(cache, tmp_path):
    run = str(tmp_path / "multi")
    outs = _both_succeed(_two_processes(cache, run, "train.steps=6", "curriculum.1.start_step=3",
                                        "train.sample_tokens=4"))
    assert "data=2 x fsdp=1" in outs[0][0]
    assert "sample (train.sample_prompt" in outs[0][0]  # replicated parameters: process 0 reads them and samples
    got = losses(run)
    assert len(got) == 6 and all(x > 0 for x in got)
    # Both processes computed the same global validation loss from their own halves of the data.
    vals = [json.loads([line for line in out.splitlines() if line.startswith("{")][-1]) for out, _ in outs]
    assert vals[0]["val/mean/loss"] > 0 and vals[0] == vals[1]
    # --eval-only of it as one process: the saved process group (2 processes, a coordinator) is not waited for
    alone = subprocess.run([sys.executable, "-m", "yxanul_jax.train", "--eval-only", "--run-dir", run],
                           env=_env(cache, 1), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert alone.returncode == 0, alone.stderr[-2000:]
    row = json.loads([line for line in alone.stdout.splitlines() if line.startswith("{")][-1])
    assert abs(row["val/mean/loss"] - vals[0]["val/mean/loss"]) <= 1e-5 * vals[0]["val/mean/loss"]
    # and as two processes from --checkpoint alone (no run directory): they join before its config is read
    port = free_port()
    pair = [subprocess.Popen([sys.executable, "-m", "yxanul_jax.train", "--eval-only", "--checkpoint",
                              os.path.join(run, "checkpoints"), "--run-dir", str(tmp_path / "none"),
                              f"mesh.coordinator_address=127.0.0.1:{port}", "mesh.num_processes=2",
                              f"mesh.process_id={i}"], env=_env(cache, 1), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(2)]
    first = json.loads([line for line in _both_succeed(pair)[0][0].splitlines() if line.startswith("{")][-1])
    assert abs(first["val/mean/loss"] - row["val/mean/loss"]) <= 1e-5 * row["val/mean/loss"]  # process 0 reports


def test_a_run_of_two_processes_resumes_as_one_on_another_mesh(cache, tmp_path):
    """Stopped at step 10 of a data-parallel run of two processes, resumed as one process on four devices with
    FSDP: the checkpoint is read resharded, the stream goes on with the same global batches, a note says so, and
    the losses follow the unbroken run's to reduction order."""
    import shutil

    run = tmp_path / "moved"
    _both_succeed(_two_processes(cache, str(run), "checkpoint.interval=10"))
    unbroken = losses(run)
    shutil.rmtree(run / "checkpoints" / "20")
    again = train(_env(cache, 4), "--run-dir", str(run), *RUN, "checkpoint.interval=10", "mesh.data=1", "mesh.fsdp=4")
    assert ("saved on data=2 x fsdp=1 over 2 processes, resumed on data=1 x fsdp=4 over 1 process: the same state, "
            "resharded") in again.stderr, again.stderr[-2000:]
    got = losses(run)
    assert len(got) == len(unbroken) == 20 and got[:10] == unbroken[:10]
    for x, y in zip(got[10:], unbroken[10:]):
        assert abs(x - y) <= 1e-5 * abs(y), (got, unbroken)


def test_parameters_sharded_across_processes_skip_the_end_of_run_sample_with_a_note(cache, tmp_path):
    # process 0 alone cannot read parameters that span processes: the sample is skipped, the run still succeeds
    run = str(tmp_path / "fsdp")
    outs = _both_succeed(_two_processes(cache, run, "train.steps=2", "mesh.data=1", "mesh.fsdp=2",
                                        "train.sample_tokens=4"))
    assert "data=1 x fsdp=2" in outs[0][0]
    assert "end-of-run sample skipped: the parameters are sharded across processes" in outs[0][1], outs[0][1][-2000:]


def test_a_sigterm_on_one_process_stops_both_at_the_same_step(cache, tmp_path):
    import signal
    import time

    run = str(tmp_path / "multi-stop")
    procs = _two_processes(cache, run, "train.steps=400", "curriculum.1.start_step=300", "eval.interval=0",
                           "checkpoint.interval=0")
    deadline = time.time() + 600
    metrics = os.path.join(run, "metrics.jsonl")
    while time.time() < deadline and not (os.path.exists(metrics) and len(open(metrics).read().splitlines()) >= 3):
        time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)  # only the second process is told
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-3000:]  # saved, not finished
    stopped = [int(re.search(r"stopped by .* at step (\d+)", out).group(1)) for out, _ in outs]
    assert stopped[0] == stopped[1] < 400 and stopped[0] % 5 == 0
    assert sorted(int(n) for n in os.listdir(os.path.join(run, "checkpoints")) if n.isdigit()) == [stopped[0]]
