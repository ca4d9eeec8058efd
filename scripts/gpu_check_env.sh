#!/usr/bin/env bash
# Build the environment that compiles yxanul-jax for an H100/H200 on a machine without a GPU:
# a venv that sees this Python's packages (jax, flax, the project) and adds only the CUDA compiler
# plugin of the installed jaxlib, cuDNN's library and nvdisasm (the `gpu-check` extra, ~3 GB, no GPU needed;
# nvdisasm prints the fused loss kernels' SASS for analysis/kernel_census.py).
#
#   bash scripts/gpu_check_env.sh [VENV]            # default .venv-gpu-check in the repository root
#   .venv-gpu-check/bin/python -m yxanul_jax.analyze --config configs/tiny.yaml --target h100
#
# Why a separate venv: once the CUDA plugin is importable, every `import jax` on a machine without
# a driver prints three "Could not find cuda drivers" log lines from the plugin's library, which
# would stand in front of every one-line error of every command. Kept apart, the main environment
# stays quiet and the check still runs the real XLA GPU compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-gpu-check}
PY=${PYTHON:-python3}
JAXLIB=$("$PY" -c "import jaxlib; print(jaxlib.__version__)")
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  "jax-cuda12-plugin==$JAXLIB" "jax-cuda12-pjrt==$JAXLIB" "nvidia-cudnn-cu12>=9.8,<10" "nvidia-cuda-nvdisasm>=13,<14"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("gpu-check environment ready: jaxlib", md.version("jaxlib"), "+ jax-cuda12-plugin", md.version("jax-cuda12-plugin"),
      "+ cuDNN", md.version("nvidia-cudnn-cu12"), "+ nvdisasm", md.version("nvidia-cuda-nvdisasm"))
PY
