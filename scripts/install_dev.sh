#!/usr/bin/env bash
# The development install (the README's test command and CI run this): the CPU build of torch, then the
# package with its `dev` extra (pytest, transformers, ...).
#
#   bash scripts/install_dev.sh && python -m pytest -q
#
# Why torch first: the tests need torch only on the CPU (the Hugging Face parity tests load our export with
# `transformers`), but on Linux the registry's torch is a CUDA build of several GB (a 6.5 GB environment and
# minutes of downloads), and `pip install -e ".[dev]"` alone would take it. PyTorch's CPU index has the same
# release as `2.13.0+cpu`, which pip prefers to the registry's `2.13.0`; where that index cannot be reached, pip
# still takes a `+cpu` file from its find-links or cache. A torch already installed (a GPU machine's, say) is
# kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
if ! "$PY" -c "import torch" 2>/dev/null; then
  # --retries 1: where the CPU index is unreachable, pip would otherwise retry it five times per package
  "$PY" -m pip install --quiet --retries 1 "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install --quiet -e ".[dev]"
"$PY" -c "import torch; print('dev install ready: torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU build)')"
