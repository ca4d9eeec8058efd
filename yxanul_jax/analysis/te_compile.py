"""Transformer Engine on a machine without a GPU or driver, for sm_90 compile checks only (never on a run path).

TE's JAX extension imports and lowers without a GPU once three things are in place
(`scripts/te_check_env.sh` builds the environment; `prepare()` does the rest, in this process):

  1. its CUDA runtime folder (`nvidia/cudart`, a link the script makes);
  2. a driver library: cuDNN's runtime-compiled engines and TE link against `libcuda.so.1`; the script
     builds a stub whose every function answers CUDA_ERROR_NO_DEVICE into `<venv>/te-stub`, which
     `prepare()` loads first (with NCCL's library, which TE's extension needs), so the loader resolves
     both to them;
  3. the compute capability: TE asks the device (`get_device_compute_capability`), and without one says
     FP8 is unsupported; `prepare()` answers 90 (Hopper) in every TE module that holds that function;
  4. the fused RMSNorm's workspace size, which TE computes from the device's SM count: without a device
     the query fails, and `prepare()` answers an empty workspace (as XLA's deviceless compile does for
     cuDNN's), so the compiled memory misses those few bytes.

Only `analyze --target` (with `fp8.backend=te`) and the tests call `prepare()`; on a real GPU none of this
runs and TE sees the real device. Numerics and speed of TE still need a GPU.

    python -m yxanul_jax.analysis.te_compile      # check the environment: versions, a one-line JSON
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

from yxanul_jax.core.args import cli_entry
from yxanul_jax.core.errors import UserError

INSTALL_HINT = "bash scripts/te_check_env.sh (adds TE 2.20.2 to .venv-gpu-check) and run it with .venv-gpu-check/bin/python"
COMPUTE_CAPABILITY = 90  # sm_90: H100 / H200
STUB_DIR = "te-stub"
_PREPARED = False


def stub_library() -> Path:
    """The stub driver library `scripts/te_check_env.sh` built into this venv."""
    return Path(sys.prefix) / STUB_DIR / "libcuda.so.1"


def _nccl_library() -> Path | None:
    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libnccl.so.2"
    return path if path.is_file() else None


def prepare() -> None:
    """Make Transformer Engine importable and lowerable for sm_90 here; UserError when the environment lacks it.

    Idempotent. Call before anything imports TE (`fp8.import_te`)."""
    global _PREPARED
    if _PREPARED:
        return
    try:
        importlib.metadata.version("transformer_engine_jax")  # its extension lives in transformer_engine/wheel_lib
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"fp8.backend=te with --target needs Transformer Engine's JAX extension in this Python "
                        f"({sys.prefix}); build it with {INSTALL_HINT}")
    stub, nccl = stub_library(), _nccl_library()
    if not stub.is_file() or nccl is None:
        raise UserError(f"the TE compile environment is incomplete (no {stub if not stub.is_file() else 'libnccl.so.2'}); "
                        f"rebuild it with {INSTALL_HINT}")
    for lib in (stub, nccl):  # loaded by path first: later dlopen("libcuda.so.1") by soname finds them
        ctypes.CDLL(os.fspath(lib), mode=ctypes.RTLD_GLOBAL)
    import warnings

    from yxanul_jax.model import fp8 as fp8_lib

    with warnings.catch_warnings():  # TE's note that its PyTorch extension is absent: it is not used here
        warnings.filterwarnings("ignore", message=".*PyTorch.*", category=RuntimeWarning)
        fp8_lib.import_te()
    import transformer_engine_jax as tej

    original = tej.get_device_compute_capability
    answer = lambda gpu_id=0: COMPUTE_CAPABILITY  # noqa: E731
    for name, module in list(sys.modules.items()):
        if name.startswith("transformer_engine") and getattr(module, "get_device_compute_capability", None) is original:
            module.get_device_compute_capability = answer
    for name in NORM_WORKSPACE_QUERIES:
        setattr(tej, name, _without_device(getattr(tej, name), empty=(((0,), tej.DType.kByte),)))
    _PREPARED = True


NORM_WORKSPACE_QUERIES = ("get_norm_fwd_workspace_sizes", "get_norm_bwd_workspace_sizes")


def _without_device(query, empty):
    """The workspace query, answering `empty` (no bytes) where it needs a device and has none."""
    def answer(*args, **kwargs):
        try:
            return query(*args, **kwargs)
        except RuntimeError as e:
            if "CUDA" not in str(e):
                raise
            return empty

    return answer


def versions() -> dict:
    import jax

    md = importlib.metadata
    return {"transformer_engine": md.version("transformer_engine"), "transformer_engine_jax": md.version("transformer_engine_jax"),
            "jax": jax.__version__, "jaxlib": md.version("jaxlib"), "cuda_plugin": md.version("jax-cuda12-plugin"),
            "compute_capability": COMPUTE_CAPABILITY}


@cli_entry
def main(argv=None) -> int:
    prepare()
    print("Transformer Engine compile environment ready: " + json.dumps(versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
