#!/usr/bin/env bash
# Add Transformer Engine JAX to the sm_90 compile-check environment, so that `fp8.backend=te` compiles for an
# H100/H200 on a machine without a GPU or driver (what CI proves; numerics and speed need a GPU):
#
#   bash scripts/te_check_env.sh [VENV]             # default .venv-gpu-check (built first when missing)
#   .venv-gpu-check/bin/python -m yxanul_jax.analyze --config configs/tiny.yaml fp8.backend=te --target h100
#
# Pinned, matching versions: TE 2.20.2 (its CUDA 12 core wheel, ~0.7 GB download, and its JAX extension built
# from the sdist with plain g++, ~2 min on 2 cores, cached as a wheel in ~/.cache/yxanul_jax/wheels) for the
# jaxlib of this Python (0.10.x). CUDA 12.9 headers come from NVIDIA's wheels (NVTE_BUILD_USE_NVIDIA_WHEELS).
#
# Without a driver TE needs three things to import and lower, all confined to compile checks
# (`yxanul_jax.analysis.te_compile`, used by `analyze --target` and the tests; nothing of it runs on a GPU):
#   1. `nvidia/cudart` -> the runtime wheel's `cuda_runtime` folder (TE looks there for libcudart),
#   2. a stub `libcuda.so.1` whose functions return CUDA_ERROR_NO_DEVICE (cuDNN's runtime-compiled engines
#      link against the driver library), built here into VENV/te-stub,
#   3. the compute capability (90) answered instead of a device query (done in Python at import).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-gpu-check}
TE=2.20.2
[ -x "$VENV/bin/python" ] || bash scripts/gpu_check_env.sh "$VENV"
PY="$VENV/bin/python"
WHEELS=$("$PY" -c "from yxanul_jax.core.rundir import cache_root; print(cache_root() / 'wheels')")  # the project's cache
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

# 1. TE's core library and the build/runtime headers (CUDA 12.9, matching jaxlib 0.10's CUDA 12 plugin).
"${PIP[@]}" "transformer_engine_cu12==$TE" "pybind11[global]" "setuptools>=61" wheel \
  "nvidia-cuda-runtime-cu12==12.9.*" nvidia-nccl-cu12 "nvidia-cuda-cccl-cu12==12.9.*" \
  "nvidia-cuda-nvcc-cu12==12.9.*" "nvidia-nvtx-cu12==12.9.*" "nvidia-curand-cu12==10.3.*"
# Headers only; --no-deps skips cutlass-dsl (~0.5 GB) that the frontend's Python side would pull in.
"${PIP[@]}" --no-deps nvidia-cudnn-frontend "transformer_engine==$TE"

# 2. TE's JAX extension: built once from the sdist, then installed from the cached wheel.
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/transformer_engine_jax-"$TE"-*.whl >/dev/null 2>&1; then
  echo "building transformer_engine_jax $TE from its sdist (about 2 minutes on 2 cores) ..."
  # its sources compiled one per core (scripts/parallel_build: TE's setup.py alone compiles them one after another)
  PYTHONPATH="$PWD/scripts/parallel_build" NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_FRAMEWORK=jax \
    "$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
    --no-binary transformer_engine_jax -w "$WHEELS" "transformer_engine_jax==$TE"
fi
"${PIP[@]}" --no-deps "$WHEELS"/transformer_engine_jax-"$TE"-*.whl

# 3. The no-driver pieces: the cudart folder TE looks for, and the stub driver library.
SP=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
ln -sfn cuda_runtime "$SP/nvidia/cudart"
mkdir -p "$VENV/te-stub"
cat > "$VENV/te-stub/cuda_stub.c" <<'EOF'
/* The CUDA driver API symbols cuDNN and TE resolve at load time; each answers CUDA_ERROR_NO_DEVICE (100). */
#define STUB(name) int name(void) { return 100; }
STUB(cuGetErrorString) STUB(cuModuleGetFunction) STUB(cuModuleLoadData) STUB(cuModuleUnload)
STUB(cuTensorMapEncodeIm2col) STUB(cuTensorMapEncodeTiled) STUB(cuInit) STUB(cuDriverGetVersion)
STUB(cuDeviceGetCount) STUB(cuDeviceGet) STUB(cuDeviceGetAttribute) STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2) STUB(cuGetErrorName)
EOF
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$VENV/te-stub/libcuda.so.1" "$VENV/te-stub/cuda_stub.c"

"$PY" -m yxanul_jax.analysis.te_compile
