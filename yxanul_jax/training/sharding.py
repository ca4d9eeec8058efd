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

from yxanul_jax.core.config import Config, MeshConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model.transformer import Yxanul
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
    ("layers", None),
)


def maybe_initialize_distributed(cfg: MeshConfig) -> None:
    """`jax.distributed.initialize` from the config, else from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID; a single process needs neither."""
    address = cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    if not address:
        return
    num = cfg.num_processes or int(os.environ.get("JAX_NUM_PROCESSES", "0") or 0)
    pid = cfg.process_id if cfg.process_id >= 0 else int(os.environ.get("JAX_PROCESS_ID", "-1") or -1)
    if not num or pid < 0:
        raise UserError(f"multi-host start at '{address}' needs the process count and this process's id: set "
                        "mesh.num_processes and mesh.process_id (or JAX_NUM_PROCESSES and JAX_PROCESS_ID)")
    jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)


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


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    data, fsdp = mesh_shape(cfg, len(devices))
    return Mesh(np.asarray(devices).reshape(data, fsdp), ("data", "fsdp"))


def check_divisible(cfg: Config, mesh: Mesh) -> None:
    """Every stage's batch must split evenly over the mesh (and over processes)."""
    n = mesh.devices.size
    for i, s in enumerate(cfg.curriculum):
        if s.batch_size % n:
            raise UserError(f"config key 'curriculum.{i}.batch_size' ({s.batch_size}) must be a multiple of the "
                            f"{n} devices of the mesh")


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
