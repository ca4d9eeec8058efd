"""Compile for an NVIDIA Hopper GPU on a machine without one: a compile-only CUDA device (deviceless AOT).

With `jax_platforms=cpu`, `jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=<GpuTargetConfigProto text>, topology="1x1x1")` returns a device that exists only for
compilation; `jax.jit(f).lower(<ShapeDtypeStructs placed on it>).compile()` then runs XLA's real
GPU pipeline for that target (every HLO pass, buffer assignment, LLVM -> PTX -> cubin; the log
says "Performing a deviceless compilation"). No GPU, driver or libcuda is needed, only the CUDA
PJRT plugin of jaxlib's version and cuDNN's library (jax asks cuDNN its version when it lowers
cuDNN attention): the `gpu-check` extra.

What it proves: the GEMM kinds XLA's rewriters choose (FP8 cuBLASLt, Triton fusion, BF16), cuDNN
attention, XLA's GPU memory analysis, and that the step compiles for sm_90 at all. What only a GPU
shows: autotuning (Triton tiles and Triton-vs-cuBLAS for each fusion; deviceless keeps the default
config), cuDNN workspace sizes (u8[0] here), numerics, speed and the allocator's real peak.

The target specs are XLA's `h100_sxm.txtpb` (xla/backends/gpu/target_config/specs) minus
`collective_memory_granularity`, which jaxlib 0.10's proto does not know, with the CUDA and cuDNN
versions of the installed wheels; `h100-pcie` and `h200` are the same chip with their SM count, memory
size and bandwidth (from `analysis.gpus`, the one table of GPU numbers).
"""
from __future__ import annotations

import contextlib
import os
import re

from yxanul_jax.analysis.gpus import GPUS, GpuSpec, of_device_kind
from yxanul_jax.core.config import Config
from yxanul_jax.core.errors import UserError, one_line

INSTALL_HINT = "bash scripts/gpu_check_env.sh (a venv with the gpu-check extra) and run it with .venv-gpu-check/bin/python"

_H100_SXM = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {cores}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 feature_extension: ACCELERATED_FEATURES }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  scalar_unit_description {
    rate_infos { key: 4 value { clock_rate_ghz: 1.98 units_per_core: 64 ops_per_clock: 1 } }
    rate_infos { key: 8 value { clock_rate_ghz: 1.98 units_per_core: 64 ops_per_clock: 1 } }
    rate_infos { key: 10 value { clock_rate_ghz: 1.98 units_per_core: 128 ops_per_clock: 2 } }
    rate_infos { key: 11 value { clock_rate_ghz: 1.98 units_per_core: 128 ops_per_clock: 1 } }
    rate_infos { key: 12 value { clock_rate_ghz: 1.98 units_per_core: 64 ops_per_clock: 1 } }
    rate_infos { key: 16 value { clock_rate_ghz: 1.98 units_per_core: 128 ops_per_clock: 2 } }
  }
  matrix_unit_description {
    rate_infos { key: 2 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 6 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 10 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 512 } }
    rate_infos { key: 11 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 256 } }
    rate_infos { key: 12 value { clock_rate_ghz: 1.98 units_per_core: 4 ops_per_clock: 32 } }
    rate_infos { key: 16 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 512 } }
    rate_infos { key: 19 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 20 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 23 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 24 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 25 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 28 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 29 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 33 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 35 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
    rate_infos { key: 36 value { clock_rate_ghz: 1.8295201 units_per_core: 4 ops_per_clock: 1024 } }
  }
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  device_vendor: "NVIDIA Corporation"
  platform_version: "Compute Capability 9.0a"
  model_str: "sm_9.0a with {memory}B RAM, 132 cores, 1980000KHz clock, 2619000KHz mem clock, 52428800B L2$"
  device_address_bits: 64
  pcie_bandwidth: 34359738368
  ecc_enabled: true
  name: "{name}"
  driver_version: "{runtime}"
  runtime_version: "{runtime}"
  compile_time_toolkit_version: "{runtime}"
  dnn_version: "{dnn_major}.{dnn_minor}.{dnn_patch}"
  device_interconnect_info { active_links: 18 }
}
platform_name: "CUDA"
dnn_version_info { major: {dnn_major} minor: {dnn_minor} patch: {dnn_patch} }
device_description_str: "{name}"
"""

# name (a key of `analysis.gpus.GPUS`: bandwidth and SM count come from there) -> (device name, memory
# bytes as XLA's spec files give them). All are sm_90 chips.
TARGETS = {
    "h100": ("NVIDIA H100 80GB HBM3", 84_942_979_072),
    "h100-pcie": ("NVIDIA H100 PCIe", 85_031_714_816),
    "h200": ("NVIDIA H200", 150_754_820_096),
}


def _cudnn_triplet(v: int) -> tuple[int, int, int]:
    """cuDNN's integer version -> (major, minor, patch): 9.28.0 is 92800 (cuDNN >= 9), 8.9.6 is 8906."""
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return major, rest // 100, rest % 100


def _installed_versions() -> tuple[tuple[int, int, int], str]:
    """(cuDNN version, CUDA runtime version) the plugin reports, or jaxlib 0.10's defaults."""
    dnn, runtime = (9, 10, 0), "12.9.0"
    with contextlib.suppress(Exception):
        from jax._src.lib import cuda_versions
        dnn = _cudnn_triplet(int(cuda_versions.cudnn_get_version()))
    with contextlib.suppress(Exception):
        from jax._src.lib import cuda_versions
        cuda = int(cuda_versions.cuda_runtime_get_version())
        runtime = f"{cuda // 1000}.{(cuda % 1000) // 10}.0"
    return dnn, runtime


def target_spec(target: str) -> str:
    """GpuTargetConfigProto text of `h100`, `h200`, or the contents of a spec file path."""
    if target in TARGETS:
        name, memory = TARGETS[target]
        gpu = GPUS[target]
        dnn, runtime = _installed_versions()
        text = _H100_SXM
        for key, value in (("name", name), ("memory", memory), ("bandwidth", int(gpu.hbm_bytes_per_s)),
                           ("cores", gpu.sms), ("runtime", runtime),
                           ("dnn_major", dnn[0]), ("dnn_minor", dnn[1]), ("dnn_patch", dnn[2])):
            text = text.replace("{" + key + "}", str(value))
        return text
    if os.path.isfile(target):
        with open(target, encoding="utf-8") as fh:
            return fh.read()
    raise UserError(f"--target '{target}' is neither a known GPU ({', '.join(TARGETS)}) nor a "
                    "GpuTargetConfigProto text file; pass h100, h200 or a spec file path")


def target_gpu(target: str) -> GpuSpec | None:
    """The `analysis.gpus` entry a target compiles for (its rates drive the performance model): the table's
    own for a named target, the one whose device_kind matches a spec file's `name`, or None."""
    if target in TARGETS:
        return GPUS[target]
    m = re.search(r'\bname:\s*"([^"]+)"', target_spec(target))
    return of_device_kind(m.group(1)) if m else None


def compile_device(target: str = "h100"):
    """A compile-only CUDA device for `target` (no GPU needed). UserError without the CUDA plugin.

    Call it before anything initializes JAX's backends (`jax.devices()`, a first computation): it
    sets `jax_platforms=cpu` so that the CUDA plugin is registered for compiling only."""
    import jax
    from jax.experimental import topologies

    spec = target_spec(target)
    jax.config.update("jax_platforms", "cpu")  # never try to open a real CUDA backend here
    try:
        import jax_plugins.xla_cuda12  # noqa: F401  (the plugin that owns XLA's GPU compiler)
    except ImportError:
        raise UserError(f"--target {target} needs the CUDA compiler plugin of jaxlib {jax.__version__} "
                        f"(no GPU needed); install it with {INSTALL_HINT}")
    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=spec, topology="1x1x1")
    except NotImplementedError as e:  # the plugin is not of this jaxlib, or backends started without it
        raise UserError(f"--target {target}: {one_line(e)} (the CUDA plugin must match jaxlib "
                        f"{jax.__version__}, and the compile device must be made before JAX starts its backends); "
                        f"install it with {INSTALL_HINT}")
    except Exception as e:  # a spec file this jaxlib cannot parse
        raise UserError(f"--target {target}: XLA rejected the GPU target spec ({one_line(e)[:200]}); "
                        "pass h100, h200 or a GpuTargetConfigProto text file this jaxlib can parse")
    device = topo.devices[0]
    from yxanul_jax.model.fused_ce import set_compile_target

    set_compile_target(getattr(device, "compute_capability", None))  # the default tiles' kernels follow the target
    return device


def gpu_config(cfg: Config, seq_len: int | None = None) -> Config:
    """`cfg` with `model.attention: auto`, `train.loss_kernel: auto` and `fp8.gemm_form: auto` resolved as on a GPU
    (`transformer.attention_implementation` for `seq_len`: `short`, XLA's or cuDNN's; the fused head + loss
    kernels; FP8 GEMMs in the `dequant` form), for compiling one stage on a compile-only device while JAX's own
    backend is the CPU. `model.remat: auto` is resolved later, for the compile's device (`memory.with_stage_remat`)."""
    import dataclasses

    from yxanul_jax.model import fp8 as fp8_lib
    from yxanul_jax.model.loss import loss_kernel
    from yxanul_jax.model.transformer import attention_implementation

    attention = attention_implementation(cfg.model, "gpu", seq_len)
    kernel = loss_kernel(cfg.train.loss_kernel, cfg.model, cfg.fp8, "gpu")
    form = fp8_lib.gemm_form(cfg.fp8, cfg.train.xla_options, "gpu")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention=attention),
                               train=dataclasses.replace(cfg.train, loss_kernel=kernel),
                               fp8=dataclasses.replace(cfg.fp8, gemm_form=form))


def cudnn_available() -> bool:
    """Whether cuDNN's library is importable (jax needs it to lower cuDNN attention for a GPU target)."""
    try:
        import nvidia.cudnn  # noqa: F401
    except ImportError:
        return False
    return True
