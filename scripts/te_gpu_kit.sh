#!/usr/bin/env bash
# Transformer Engine for the lent GPU machine (CUDA 13, Python 3.12, no downloads there), packed for calls
# that carry at most 64 MiB each (docs/BENCHMARKS.md, "Transformer Engine on the GPU"). Into the git-ignored .te/:
#
#   .te/part-00 ... part-04  TE 2.20.2's CUDA 13 core wheel (264 MiB) cut into 56 MiB parts: one per call
#   .te/base/                 what the last call carries: the `transformer_engine` wheel (its Python side),
#                             cuDNN frontend headers, the transformer_engine_jax sdist (built there), SHA256SUMS, PARTS
#
#   bash scripts/te_gpu_kit.sh          # then, there: scripts/te_gpu_install.sh
#
# The GPU machine already has nvcc 13.0, pybind11, setuptools, cmake, ninja and NVIDIA's CUDA 13 runtime wheels
# (/work/.library/device/KINDS.md); the sdist's build there needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_machine.sh
TE=2.20.2
SDIST_SHA256=b5d65e6f747de90d98fe9041322b532481e8de2b21b303a7e6f1365c665201ca
PART=${TE_KIT_PART:-56M}
KIT=.te
rm -rf "$KIT" && mkdir -p "$KIT/base" "$KIT/dl"
"${GPU_MACHINE_PIP_DOWNLOAD[@]}" -d "$KIT/dl" \
  "transformer_engine_cu13==$TE" "transformer_engine==$TE" "nvidia-cudnn-frontend==1.32.0"
# The JAX extension comes only as an sdist; `pip download` would try to build its metadata, so fetch the file.
python3 - "$KIT/base" "$TE" "$SDIST_SHA256" <<'PY'
import hashlib, os, re, sys, urllib.request
out, version, want = sys.argv[1:]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = urllib.request.urlopen(f"{index}/transformer-engine-jax/", timeout=120).read().decode()
name = f"transformer_engine_jax-{version}.tar.gz"
url = next(u for u in re.findall(r'href="([^"#]+)', page) if u.endswith(name))
data = urllib.request.urlopen(urllib.request.urljoin(f"{index}/transformer-engine-jax/", url), timeout=300).read()
if hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"error: {name} does not match its pinned sha256; the index served something else")
open(os.path.join(out, name), "wb").write(data)
PY
core=$(ls "$KIT"/dl/transformer_engine_cu13-"$TE"-*.whl)
mv "$KIT"/dl/transformer_engine-"$TE"-*.whl "$KIT"/dl/nvidia_cudnn_frontend-*.whl "$KIT/base/"
(cd "$KIT/dl" && sha256sum "$(basename "$core")") > "$KIT/base/SHA256SUMS"
(cd "$KIT/base" && sha256sum transformer_engine_jax-"$TE".tar.gz) >> "$KIT/base/SHA256SUMS"
split -b "$PART" -d -a 2 "$core" "$KIT/part-"
(cd "$KIT" && ls part-*) > "$KIT/base/PARTS"
rm -rf "$KIT/dl"
for f in "$KIT"/part-* "$KIT/base"; do
  size=$(du -sb "$f" | cut -f1)
  echo "$f: $((size / 1024)) KiB"
  if [ "$size" -gt "$GPU_MACHINE_CALL_LIMIT" ]; then
    echo "error: $f is $((size / 1048576)) MiB; one call carries 64 MiB with the working tree (set TE_KIT_PART smaller)" >&2
    exit 2
  fi
done
echo "TE $TE kit: $(wc -l < "$KIT/base/PARTS") parts + base in $KIT; the calls are in docs/BENCHMARKS.md"
