# The lent GPU machine's facts for the kits that carry wheels to it (sourced by gpu_carry_kit.sh and
# te_gpu_kit.sh): its Python and platform for `pip download`, and what one call may carry.
# shellcheck shell=bash
GPU_MACHINE_PIP_DOWNLOAD=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# One call carries 64 MiB with the working tree; a kit file or folder stays under 60 MiB.
GPU_MACHINE_CALL_LIMIT=$((60 * 1024 * 1024))
