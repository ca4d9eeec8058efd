"""Cluster launch: which process group the environment describes (SLURM, Open MPI, a Kubernetes Indexed Job,
flags), and two processes started with SLURM's variables that train, lose one process, and resume bit-exactly."""
import os
import re
import signal
import subprocess
import sys

import pytest

from yxanul_jax.core.config import MeshConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.training.sharding import process_group

from conftest import REPO
from multihost import RUN, cpu_env, free_port, losses, start, train

_LAUNCHERS = ("SLURM_", "OMPI_", "JAX_", "JOB_COMPLETION_INDEX", "KUBERNETES_")


@pytest.fixture
def env(monkeypatch):
    """A clean launcher environment; `env(**vars)` sets variables in it."""
    for key in list(os.environ):
        if key.startswith(_LAUNCHERS):
            monkeypatch.delenv(key)
    return lambda **kv: [monkeypatch.setenv(k, str(v)) for k, v in kv.items()]


def slurm(job, procid, ntasks=2, nodes=1, nodelist="node[007-008],gpu1"):
    return dict(SLURM_JOB_ID=job, SLURM_STEP_NODELIST=nodelist, SLURM_NTASKS=ntasks, SLURM_PROCID=procid,
                SLURM_LOCALID=procid % max(ntasks // nodes, 1), SLURM_STEP_NUM_NODES=nodes)


def test_slurm_srun_step_is_detected_with_jax_s_coordinator(env):
    env(**slurm(5000, 1))
    g = process_group(MeshConfig())
    # JAX's derivation: the step's first node, port 61440 + job id % 4096 (jax/_src/clusters/slurm_cluster.py)
    assert (g.how, g.coordinator_address, g.num_processes, g.process_id) == ("slurm", "node007:62344", 2, 1)
    assert g.one_device  # two tasks on one node: one GPU each
    assert "SLURM job 5000" in g.describe() and "process 1 of 2" in g.describe()
    env(**slurm(5000, 3, ntasks=4, nodes=4), JAX_COORDINATOR_PORT=1234)
    g = process_group(MeshConfig())
    assert (g.coordinator_address, g.num_processes, g.process_id, g.one_device) == ("node007:1234", 4, 3, False)
    g = process_group(MeshConfig(coordinator_address="head:99"))  # the flag replaces the derived address
    assert g.coordinator_address == "head:99" and g.how == "slurm"


def test_no_launcher_or_a_single_task_is_a_single_process(env):
    assert process_group(MeshConfig()) is None
    env(**slurm(5000, 0, ntasks=1))
    assert process_group(MeshConfig()) is None
    env(JOB_COMPLETION_INDEX=3, KUBERNETES_SERVICE_HOST="10.0.0.1")  # an Indexed Job alone: a sweep, not a group
    assert process_group(MeshConfig()) is None


def test_explicit_flags_and_cluster_none(env):
    env(**slurm(5000, 1))
    g = process_group(MeshConfig(cluster="none", coordinator_address="h:1", num_processes=3, process_id=2))
    assert (g.how, g.coordinator_address, g.num_processes, g.process_id, g.one_device) == ("flags", "h:1", 3, 2, False)
    assert process_group(MeshConfig(cluster="none")) is None  # SLURM's variables ignored
    with pytest.raises(UserError, match="needs the process count"):
        process_group(MeshConfig(cluster="none", coordinator_address="h:1"))


def test_open_mpi_and_kubernetes(env):
    env(OMPI_COMM_WORLD_SIZE=16, OMPI_COMM_WORLD_RANK=9, OMPI_COMM_WORLD_LOCAL_RANK=1, OMPI_COMM_WORLD_LOCAL_SIZE=8,
        OMPI_MCA_orte_hnp_uri="1531576320.0;tcp://10.96.0.1,10.148.0.1:34911", **slurm(5000, 0, ntasks=2))
    g = process_group(MeshConfig())  # mpirun inside a SLURM allocation: Open MPI's ranks, not SLURM's tasks
    assert (g.how, g.coordinator_address, g.num_processes, g.process_id, g.one_device) == \
        ("ompi", f"10.96.0.1:{1531576320 // 4096 % 4096 + 61440}", 16, 9, True)
    os.environ.pop("OMPI_MCA_orte_hnp_uri")  # Open MPI 5 (PRRTE) does not say where its launcher is
    with pytest.raises(UserError, match="mesh.coordinator_address=HOST:PORT"):
        process_group(MeshConfig())
    for key in [k for k in os.environ if k.startswith(("OMPI_", "SLURM_"))]:
        os.environ.pop(key)
    env(JOB_COMPLETION_INDEX=5, JAX_NUM_PROCESSES=8, JAX_COORDINATOR_ADDRESS="train-0.train:1234")
    g = process_group(MeshConfig())
    assert (g.how, g.coordinator_address, g.num_processes, g.process_id, g.one_device) == \
        ("k8s", "train-0.train:1234", 8, 5, False)
    os.environ.pop("JAX_COORDINATOR_ADDRESS")
    with pytest.raises(UserError, match="JAX_COORDINATOR_ADDRESS=<job>-0"):
        process_group(MeshConfig())


@pytest.mark.parametrize("cfg,vars_,message", [
    (MeshConfig(), dict(SLURM_JOB_ID=7, SLURM_NTASKS=2), "not started by srun"),  # python in the batch script
    (MeshConfig(), slurm(7, 2), r"process id 2 is not in \[0, 2\)"),
    (MeshConfig(), {**slurm(7, 0), "SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
    (MeshConfig(num_processes=4), slurm(7, 0), r"\(4\) disagrees with the slurm launcher's 2"),
    (MeshConfig(process_id=1), slurm(7, 0), r"\(1\) disagrees with the slurm launcher's id 0"),
    (MeshConfig(cluster="slurm"), {}, "not a task of a SLURM job step"),
    (MeshConfig(cluster="ompi"), {}, "not started by Open MPI"),
    (MeshConfig(cluster="k8s"), {}, "JOB_COMPLETION_INDEX is not set"),
    (MeshConfig(), dict(OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=0),  # found by auto: no mesh.cluster to blame
     r"Open MPI's variables are set \(OMPI_COMM_WORLD_SIZE=2\) but not all of them \(no OMPI_COMM_WORLD_LOCAL_RANK\)"),
    (MeshConfig(num_processes=2, process_id=1), {}, "2 processes \\(this one id 1\\) but no coordinator to join"),
    (MeshConfig(), dict(JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=1), "but no coordinator to join"),
])
def test_an_inconsistent_environment_is_one_clear_error(env, cfg, vars_, message):
    env(**vars_)
    with pytest.raises(UserError, match=message):
        process_group(cfg)


# ---- two processes with SLURM's variables (no coordinator flags) -------------------------------------------------

STEPS = ["train.steps=12", "curriculum.1.start_step=8", "checkpoint.interval=4", "mesh.heartbeat_timeout_s=10"]
# Process 1 of the interrupted run SIGKILLs itself right after step 6 (the step-4 checkpoint is written): a
# real kill at a known step, not a race with the test's polling.
KILL_AFTER_6 = """
import os, runpy, signal, sys
from yxanul_jax.training import loop
call = loop.Loop.call_hooks
def call_hooks(self, name, *args):
    call(self, name, *args)
    if name == "after_step" and args[-1] == 6:
        os.kill(os.getpid(), signal.SIGKILL)
loop.Loop.call_hooks = call_hooks
sys.argv = ["yxanul_jax.train", *sys.argv[1:]]
runpy.run_module("yxanul_jax.train", run_name="__main__")
"""


def _slurm_env(job, procid):
    # Two tasks of one srun step on this machine: what srun sets, and nothing of JAX's own variables.
    return cpu_env(1, **{k: str(v) for k, v in slurm(job, procid, nodelist="localhost").items()},
                   SLURM_NNODES="1", SLURM_NODEID="0", SLURM_STEP_ID="0")


def _job():
    """A SLURM job id whose derived coordinator port (61440 + id % 4096) is free now."""
    return free_port(61440, 65536) - 61440 + 4096


def _run_pair(run, *args, kill=False):
    job = _job()
    procs = [subprocess.Popen([sys.executable, "-c", KILL_AFTER_6, "--run-dir", run, *args], env=_slurm_env(job, 1),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             if kill and i == 1 else start(_slurm_env(job, i), "--run-dir", run, *args) for i in range(2)]
    return procs, [p.communicate(timeout=600) for p in procs]


@pytest.mark.slow
def test_two_slurm_tasks_lose_one_and_resume_bit_exactly(tmp_path):
    args = [*RUN, *STEPS]
    whole = str(tmp_path / "whole")
    procs, outs = _run_pair(whole, *args)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    for i, (out, _) in enumerate(outs):  # the group came from SLURM's variables, and the batch is split over it
        assert re.search(rf"process group: process {i} of 2 via slurm \(SLURM job \d+", out), out[-2000:]
        assert "mesh data=2 x fsdp=1" in out
    want = losses(whole)
    assert len(want) == 12
    # Data sharding: each process fed its half of every global batch, so one process with both devices sees
    # the same batches and the same losses (up to the reduction order).
    one = str(tmp_path / "one")
    train(cpu_env(2), "--run-dir", one, *args)
    assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(want, losses(one))), (want, losses(one))

    run = str(tmp_path / "killed")
    procs, outs = _run_pair(run, *args, kill=True)
    assert procs[1].returncode == -signal.SIGKILL
    # The survivor does not wait forever: its collective fails or JAX's heartbeat (10 s here) ends it.
    assert procs[0].returncode != 0 and "Terminating process because the JAX distributed service detected fatal " \
        "errors" in outs[0][1], outs[0][1][-3000:]
    assert sorted(int(n) for n in os.listdir(os.path.join(run, "checkpoints")) if n.isdigit())[-1] == 4

    procs, outs = _run_pair(run, *args)  # the same job script again (a new job id, so a new port)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert losses(run)[-12:] == want and len(losses(run)) == 12  # bit-exact, no step lost or logged twice


def test_processes_started_with_different_configs_are_refused_alike(tmp_path):
    """Two processes of one run, one given train.seed=1: each would initialize its own "replicated" model (or, for
    another train.steps, wait in a collective the other never reaches). Both end in the same one line naming the
    key, before the run directory is made. Digests leave out what each process sets for itself."""
    import dataclasses

    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.sharding import config_digests

    cfg = load_config(None, RUN)
    keys, a = config_digests(cfg)
    _, b = config_digests(dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, process_id=1)))
    assert len(keys) == len(set(keys)) and (a == b).all()
    _, c = config_digests(load_config(None, [*RUN, "train.seed=1"]))
    assert [k for k, x, y in zip(keys, a, c) if x != y] == ["train.seed"]

    run, port = tmp_path / "run", free_port()
    procs = [start(cpu_env(1, YXANUL_CACHE=os.environ["YXANUL_CACHE"]), "--run-dir", str(run), *RUN, *extra,
                   f"mesh.coordinator_address=127.0.0.1:{port}", "mesh.num_processes=2", f"mesh.process_id={i}")
             for i, extra in enumerate([[], ["train.seed=1"]])]
    for p in procs:
        out, err = p.communicate(timeout=600)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert p.returncode == 2 and errors == [
            "error: the processes were started with different configs: 'train.seed' differs between process 0 and "
            "process 1; start every process with the same --config and overrides"], err[-3000:]
    assert not run.exists()
