"""Device mesh, logical-axis sharding rules, and multi-host start-up: one code path from 1 CPU to many GPUs.

The mesh has two axes, `data` and `fsdp`. Parameters (and the Adam moments that mirror them) are
sharded over `fsdp` by their logical axis names; the batch is sharded over both axes; FP8 state,
the step counter and the RNG are replicated. XLA's SPMD partitioner inserts the all-gathers of
weights and reduce-scatters of gradients that FSDP needs.
"""
from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from yxanul_jax.core import console
from yxanul_jax.core.config import Config, MeshConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model.transformer import STACKED, Yxanul
from yxanul_jax.training.optim import make_optimizer
from yxanul_jax.training.steps import TrainState, abstract_train_state

BATCH_AXES = ("data", "fsdp")
# Each logical axis maps to the first mesh axis not yet used by the same array (flax's rule):
# a d x vocab head shards `embed` over fsdp and keeps `vocab` whole, a vocab x r table shards `vocab`.
LOGICAL_RULES = (
    ("embed", "fsdp"),
    ("vocab", "fsdp"),
    ("mlp", "fsdp"),
    ("heads", "fsdp"),
    ("kv_heads", None),
    ("embed_rank", None),
    (STACKED, None),
)


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """How this process joins a multi-process run: what `jax.distributed.initialize` is given, and whence."""

    how: str  # "slurm" | "ompi" | "k8s" | "flags"
    coordinator_address: str
    num_processes: int
    process_id: int
    one_device: bool  # several processes share a node: JAX binds each to the GPU of its node-local rank
    source: str  # where the values came from, for the log line

    def describe(self) -> str:
        devices = "one GPU per process (its node-local rank)" if self.one_device else "all local devices"
        return (f"process {self.process_id} of {self.num_processes} via {self.how} ({self.source}); coordinator "
                f"{self.coordinator_address}; {devices}")


_FLAGS = "mesh.coordinator_address / mesh.num_processes / mesh.process_id (or JAX_COORDINATOR_ADDRESS / " \
         "JAX_NUM_PROCESSES / JAX_PROCESS_ID)"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise UserError(f"environment variable {name}={value!r} is not an integer; the cluster's launcher sets it, "
                        "so unset it or fix the job script") from None


def _flags(cfg: MeshConfig) -> tuple[str, int | None, int | None]:
    """(coordinator address, process count, process id) given by the config, else by the JAX_* variables."""
    address = cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    num = cfg.num_processes or _env_int("JAX_NUM_PROCESSES")
    pid = cfg.process_id if cfg.process_id >= 0 else _env_int("JAX_PROCESS_ID")
    return address, num, pid


def _detect(cfg: MeshConfig) -> str:
    """`mesh.cluster: auto`: the launcher that started several processes, innermost first (an `mpirun` inside a
    SLURM allocation is Open MPI's), else "none"."""
    if (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
        return "ompi"
    if "SLURM_JOB_ID" in os.environ and (_env_int("SLURM_NTASKS") or 1) > 1:
        return "slurm"
    address, num, _ = _flags(cfg)
    if "JOB_COMPLETION_INDEX" in os.environ and (address or num):  # an Indexed Job alone may be a sweep
        return "k8s"
    return "none"


def _jax_address(name: str) -> str:
    """The coordinator address JAX's own detection derives for cluster `name` (jax/_src/clusters: SLURM's first
    node of the step and a port from the job id, Open MPI's launcher address), honouring JAX_COORDINATOR_PORT."""
    from jax._src import clusters

    env = next(c for c in clusters.ClusterEnv._cluster_types if c.name == name)
    try:
        return env.get_coordinator_address(timeout_secs=None,
                                           override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT"))
    except (RuntimeError, ValueError, KeyError) as e:
        raise UserError(f"cannot derive the coordinator address from the {name} environment ({e}); set "
                        "mesh.coordinator_address=HOST:PORT of process 0 (or JAX_COORDINATOR_ADDRESS)") from None


def _cluster_values(method: str, chosen: str) -> tuple[int, int, bool, str]:
    """(process count, process id, one device per process, what said so) from the `method` cluster's variables."""
    if method == "slurm":
        needed = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
        missing = [v for v in needed if v not in os.environ]
        if missing and chosen == "auto":
            raise UserError(f"SLURM job {os.environ.get('SLURM_JOB_ID')} has SLURM_NTASKS={os.environ['SLURM_NTASKS']} "
                            f"tasks but this process was not started by srun (no {', '.join(missing)}): launch the "
                            "trainer with `srun python -m yxanul_jax.train ...` (docs/CLUSTER.md), or set "
                            "mesh.cluster=none to train as one process")
        if missing:
            raise UserError(f"mesh.cluster=slurm but this process is not a task of a SLURM job step (no "
                            f"{', '.join(missing)}): launch it with srun inside an sbatch/salloc allocation, or set "
                            "mesh.cluster=auto")
        n, pid = _env_int("SLURM_NTASKS"), _env_int("SLURM_PROCID")
        nodes = _env_int("SLURM_STEP_NUM_NODES") or _env_int("SLURM_NNODES") or n
        return n, pid, n > nodes, f"SLURM job {os.environ['SLURM_JOB_ID']}: SLURM_PROCID of SLURM_NTASKS"
    if method == "ompi":
        missing = [v for v in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
                   if v not in os.environ]
        if missing and chosen == "auto":
            size = os.environ.get("OMPI_COMM_WORLD_SIZE")
            raise UserError(f"Open MPI's variables are set (OMPI_COMM_WORLD_SIZE={size}) but not all of them (no "
                            f"{', '.join(missing)}): launch the trainer with `mpirun ... python -m yxanul_jax.train` "
                            "(docs/CLUSTER.md), or set mesh.cluster=none to train as one process")
        if missing:
            raise UserError(f"mesh.cluster=ompi but this process was not started by Open MPI's mpirun (no "
                            f"{', '.join(missing)}): launch it with mpirun, or set mesh.cluster=auto")
        local = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE") or 1
        return (_env_int("OMPI_COMM_WORLD_SIZE"), _env_int("OMPI_COMM_WORLD_RANK"), local > 1,
                "Open MPI: OMPI_COMM_WORLD_RANK of OMPI_COMM_WORLD_SIZE")
    # k8s: the pod knows its index; the count and the coordinator come from the pod spec (no API access needed)
    index = _env_int("JOB_COMPLETION_INDEX")
    if index is None:
        raise UserError("mesh.cluster=k8s but JOB_COMPLETION_INDEX is not set: run the pods as a Kubernetes "
                        "Indexed Job (completionMode: Indexed, docs/CLUSTER.md), or set mesh.cluster=auto")
    return 0, index, False, "Kubernetes Indexed Job: JOB_COMPLETION_INDEX"


def process_group(cfg: MeshConfig) -> ProcessGroup | None:
    """How this process joins a multi-process run (`mesh.cluster`, read from the environment), or None for a
    single process. Raises UserError naming the variable or flag when the environment is inconsistent."""
    method = _detect(cfg) if cfg.cluster == "auto" else cfg.cluster
    address, num, pid = _flags(cfg)
    if method == "none":
        if not address and ((num or 0) > 1 or (pid or 0) > 0):  # a multi-process run asked for, with nowhere to meet
            raise UserError(f"{num or '?'} processes (this one id {pid if pid is not None and pid >= 0 else '?'}) "
                            "but no coordinator to join: set mesh.coordinator_address=HOST:PORT of process 0 (or "
                            "JAX_COORDINATOR_ADDRESS), or drop mesh.num_processes / mesh.process_id "
                            "(JAX_NUM_PROCESSES / JAX_PROCESS_ID) to train as one process")
        if not address:
            return None
        if not num or pid is None or pid < 0:
            raise UserError(f"multi-host start at '{address}' needs the process count and this process's id: set "
                            "mesh.num_processes and mesh.process_id (or JAX_NUM_PROCESSES and JAX_PROCESS_ID)")
        if not 0 <= pid < num:
            raise UserError(f"process id {pid} is not in [0, {num}): give each of the {num} processes its own id "
                            "(mesh.process_id or JAX_PROCESS_ID)")
        return ProcessGroup("flags", address, num, pid, False, _FLAGS)
    n, index, one_device, source = _cluster_values(method, cfg.cluster)
    if method == "k8s":
        if not num or not address:
            raise UserError(f"a Kubernetes Indexed Job pod (JOB_COMPLETION_INDEX={index}) needs the process count "
                            "and the coordinator address: set JAX_NUM_PROCESSES=<parallelism> and "
                            "JAX_COORDINATOR_ADDRESS=<job>-0.<headless service>:<port> in the pod's env "
                            "(docs/CLUSTER.md), or mesh.cluster=none for one process")
        n = num
    if num and num != n:
        raise UserError(f"mesh.num_processes / JAX_NUM_PROCESSES ({num}) disagrees with the {method} launcher's "
                        f"{n} processes: drop it (the launcher says how many there are), or set mesh.cluster=none to "
                        "use only the flags")
    if pid is not None and pid >= 0 and pid != index:
        raise UserError(f"mesh.process_id / JAX_PROCESS_ID ({pid}) disagrees with the {method} launcher's id {index} "
                        "for this process: drop it, or set mesh.cluster=none to use only the flags")
    if not 0 <= index < n:
        raise UserError(f"inconsistent {method} environment: process id {index} is not in [0, {n}) ({source}); "
                        "start the processes with the cluster's launcher, not by hand")
    if address:
        source += ", coordinator from mesh.coordinator_address / JAX_COORDINATOR_ADDRESS"
    elif method == "slurm":
        source += (", coordinator: first node of SLURM_STEP_NODELIST, port "
                   + ("JAX_COORDINATOR_PORT" if os.environ.get("JAX_COORDINATOR_PORT") else
                      "61440 + SLURM_JOB_ID % 4096"))
    return ProcessGroup(method, address or _jax_address(method), n, index, one_device, source)


def maybe_initialize_distributed(cfg: MeshConfig) -> ProcessGroup | None:
    """Join the multi-process run the environment or the config describes (`process_group`), logging how the
    group was formed; a single process does nothing, nor does a process that joined already (a command that had to
    join before it could read its config: `train --eval-only --checkpoint`). Call it before anything touches a
    device."""
    group = process_group(cfg)
    if group is None or jax.distributed.is_initialized():
        return group
    console.info(f"process group: {group.describe()}; waiting up to {cfg.init_timeout_s} s for all "
                 f"{group.num_processes} processes at {group.coordinator_address} (mesh.init_timeout_s)")
    # JAX's own detection of the same cluster binds a process to its node-local GPU; elsewhere it is kept out
    # (the values are already settled, and each process sees all its devices: one process per node).
    jax.distributed.initialize(coordinator_address=group.coordinator_address, num_processes=group.num_processes,
                               process_id=group.process_id, heartbeat_timeout_seconds=cfg.heartbeat_timeout_s,
                               initialization_timeout=cfg.init_timeout_s,
                               cluster_detection_method=group.how if group.one_device else "deactivate")
    return group


def join_processes(cfg: Config) -> ProcessGroup | None:
    """`maybe_initialize_distributed`, then `check_same_config`: what every multi-process command starts with."""
    group = maybe_initialize_distributed(cfg.mesh)
    check_same_config(cfg)
    return group


PER_PROCESS_KEYS = ("mesh.process_id", "mesh.coordinator_address", "mesh.num_processes", "mesh.cluster",
                    "mesh.heartbeat_timeout_s", "mesh.init_timeout_s")
"""Config keys the processes of one run may set differently: how each joined the group (its own id; a count, an
address or a launcher given as a flag by one and by the environment by another, which JAX's join reconciles)."""


def config_digests(cfg: Config) -> tuple[list[str], np.ndarray]:
    """(keys, a uint32 digest of each key's value) of `cfg`: every field of every section, the curriculum whole,
    so that processes of the same code hold lists of one length and order. PER_PROCESS_KEYS digest as equal."""
    import hashlib
    import json

    from yxanul_jax.core.coerce import to_dict

    keys, values = [], []
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        fields = dataclasses.fields(part) if dataclasses.is_dataclass(part) else [None]
        for f in fields:
            key = section.name if f is None else f"{section.name}.{f.name}"
            value = part if f is None else getattr(part, f.name)
            if key in PER_PROCESS_KEYS:
                value = None
            elif dataclasses.is_dataclass(value) or isinstance(value, tuple):
                value = to_dict(value)
            keys.append(key)
            values.append(value)
    digest = [int.from_bytes(hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).digest()[:4],
                             "little") for v in values]
    return keys, np.asarray(digest, np.uint32)


def check_same_config(cfg: Config) -> None:
    """UserError, on every process alike, when the processes of a run were started with configs that differ (a
    seed, a step count): each would train its own model, or wait in a collective the others never reach. One
    all-gather; nothing with one process."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    keys, mine = config_digests(cfg)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, keys]
    for i, key in enumerate(keys):
        other = next((p for p in range(1, every.shape[0]) if every[p, i] != every[0, i]), None)
        if other is not None:
            raise UserError(f"the processes were started with different configs: '{key}' differs between process "
                            f"0 and process {other}; start every process with the same --config and overrides")


def lead_says(flag: bool) -> bool:
    """Process 0's `flag` on every process: a decision only the lead process can make (it alone reads the run
    directory's files) that every process must act on alike (a validation is a collective). One collective
    when there are several processes."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def mesh_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, int]:
    """(data, fsdp) sizes, resolving the one -1 to all remaining devices."""
    data, fsdp = cfg.data, cfg.fsdp
    if data == -1:
        data = n_devices // fsdp if fsdp and n_devices % fsdp == 0 else -1
    if fsdp == -1:
        fsdp = n_devices // data if data and n_devices % data == 0 else -1
    if data < 1 or fsdp < 1 or data * fsdp != n_devices:
        raise UserError(f"mesh data={cfg.data} x fsdp={cfg.fsdp} does not fit {n_devices} devices; make the "
                        "product equal the device count or set one of them to -1")
    return data, fsdp


def mesh_layout(mesh: Mesh) -> dict:
    """What a checkpoint records of the mesh it was saved from: {"data", "fsdp", "processes"}."""
    return {"data": int(mesh.shape["data"]), "fsdp": int(mesh.shape["fsdp"]), "processes": jax.process_count()}


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    data, fsdp = mesh_shape(cfg, len(devices))
    return Mesh(np.asarray(devices).reshape(data, fsdp), ("data", "fsdp"))


def check_divisible(cfg: Config, mesh: Mesh) -> None:
    """Every stage's batch must split evenly over the mesh (and over processes), and each device's rows in the
    pieces of train.micro_split."""
    n, k = mesh.devices.size, cfg.train.micro_split
    for i, s in enumerate(cfg.curriculum):
        if s.batch_size % n:
            raise UserError(f"config key 'curriculum.{i}.batch_size' ({s.batch_size}) must be a multiple of the "
                            f"{n} devices of the mesh")
        if s.batch_size % (n * k):
            raise UserError(f"config key 'train.micro_split' ({k}) must divide each device's rows, but curriculum.{i} "
                            f"gives {s.batch_size // n} to each of {n} devices; set train.micro_split=1 (on a mesh "
                            "remat: auto does not split)")


def param_shardings(cfg: Config, mesh: Mesh):
    """NamedSharding of every parameter, from its logical axis names."""
    boxed = jax.eval_shape(Yxanul(cfg.model, cfg.fp8).init, jax.random.key(0),
                           jax.ShapeDtypeStruct((1, 8), np.int32))
    specs = nn.get_partition_spec(boxed)["params"]
    return nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)


def state_shardings(cfg: Config, mesh: Mesh, abstract_state: TrainState) -> TrainState:
    """Shardings of the whole train state: params and their moments over fsdp, the rest replicated."""
    replicated = NamedSharding(mesh, P())
    params = param_shardings(cfg, mesh)
    # Under `optax.partition` (optim.name: muon) each group's state holds MaskedNode where the other
    # group's parameters are: a leaf to keep as it is (it has no array to place).
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    opt = optax.tree_map_params(make_optimizer(cfg), lambda p, s: p if masked(p) else s, abstract_state.opt_state,
                                params, transform_non_params=lambda x: x if masked(x) else replicated, is_leaf=masked)
    rep = lambda tree: jax.tree_util.tree_map(lambda _: replicated, tree)  # noqa: E731
    return TrainState(step=replicated, params=params, opt_state=opt, fp8=rep(abstract_state.fp8))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[A, B, L] batches: B split over data x fsdp."""
    return NamedSharding(mesh, P(None, BATCH_AXES, None))


def eval_batch_sharding(mesh: Mesh) -> NamedSharding:
    """[B, L] batches: B split over data x fsdp."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def global_batch(local: dict, sharding: NamedSharding) -> dict:
    """Assemble each process's rows into one global array per key."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def padded_rows(local: dict, multiple: int) -> dict:
    """`local`'s [B, ...] arrays with zero rows appended up to a multiple of `multiple` (this process's devices):
    a validation batch of any size splits over them, and a zero row's mask adds no token and no loss."""
    extra = -len(next(iter(local.values()))) % multiple
    if not extra:
        return local
    return {k: np.pad(np.asarray(v), [(0, extra)] + [(0, 0)] * (np.ndim(v) - 1)) for k, v in local.items()}


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs carrying their target sharding (for AOT compiles and checkpoint restores)."""
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  abstract, shardings)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """The train state's layout on a mesh, derived once per run and shared by the stage compiler,
    the restore and eval-only (tracing the model's init and building the optimizer once)."""

    mesh: Mesh
    abstract: TrainState  # ShapeDtypeStructs carrying their shardings
    shardings: TrainState
    batch: NamedSharding  # [A, B, L] train batches

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())


def state_layout(cfg: Config, mesh: Mesh) -> StateLayout:
    """The `StateLayout` of `cfg`'s train state on `mesh`."""
    abstract, shardings = sharded_abstract_state(cfg, mesh, abstract_train_state(cfg))
    return StateLayout(mesh, abstract, shardings, batch_sharding(mesh))


def sharded_abstract_state(cfg: Config, mesh: Mesh, abstract_state: TrainState) -> tuple[TrainState, TrainState]:
    """(abstract state carrying its shardings, the shardings) for restores, inits and AOT compiles."""
    shardings = state_shardings(cfg, mesh, abstract_state)
    return with_shardings(abstract_state, shardings), shardings
