#!/usr/bin/env bash
# The carry kit: wheels the lent GPU machine lacks (Python 3.12, manylinux x86-64), into .whl/
# (git-ignored), for `run(carry=[".whl"])`. That machine has JAX 0.11 (CUDA 13), Flax, Optax, Orbax,
# PyTorch, tokenizers, pyarrow, absl, etils, protobuf, cloudpickle, numpy (docs/BENCHMARKS.md);
# it lacks Grain (and its array-record and portpicker) and tensorboardX. Pinned to the versions CI
# installs. Fails when the kit would not fit in one call's 64 MiB.
#
#   bash scripts/gpu_carry_kit.sh            # then, there: see docs/BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_machine.sh
KIT=.whl
PACKAGES=(grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 tensorboardX==2.6.5)
rm -rf "$KIT" && mkdir -p "$KIT"
"${GPU_MACHINE_PIP_DOWNLOAD[@]}" -d "$KIT" "${PACKAGES[@]}"
bytes=$(du -sb "$KIT" | cut -f1)
ls -1 "$KIT"
echo "carry kit: $(ls "$KIT" | wc -l) wheels, $((bytes / 1024)) KiB in $KIT"
if [ "$bytes" -gt "$GPU_MACHINE_CALL_LIMIT" ]; then
  echo "error: the kit is $((bytes / 1048576)) MiB; one call carries 64 MiB with the working tree" >&2
  exit 2
fi
