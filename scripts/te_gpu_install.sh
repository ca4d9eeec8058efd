#!/usr/bin/env bash
# There, on the lent GPU machine, from the repository root: Transformer Engine put back together from the calls
# of scripts/te_gpu_kit.sh's kit, installed into a venv over the machine's own packages, its JAX extension built
# from the sdist with --no-build-isolation (docs/BENCHMARKS.md, "Transformer Engine on the GPU").
#
#   bash scripts/te_gpu_install.sh stash      # in each call that carries one .te/part-NN: keep it in $TE_PARTS
#   bash scripts/te_gpu_install.sh assemble   # the core wheel back together and checked (also done by install)
#   bash scripts/te_gpu_install.sh install    # the last call (carries .te/base): assemble, venv, install, build, import
#
# The parts live in /tmp/te-parts ($TE_PARTS) only while the machine stays up (30 s idle): make the calls back
# to back. The venv is /tmp/te-venv ($TE_VENV); run the checks with its python.
set -euo pipefail
PARTS=${TE_PARTS:-/tmp/te-parts}
VENV=${TE_VENV:-/tmp/te-venv}
BUILD=${TE_BUILD:-/tmp/te-build}
fail() { echo "error: $*" >&2; exit 2; }
core_wheel() { awk '/transformer_engine_cu13/ {print $2}' .te/base/SHA256SUMS; }  # its name, from the kit

stash() {
  ls .te/part-* >/dev/null 2>&1 || fail "this call carries no .te/part-NN; name one in carry (e.g. carry: [\".te/part-00\"])"
  mkdir -p "$PARTS"
  cp .te/part-* "$PARTS/"
  echo "stashed in $PARTS: $(cd "$PARTS" && ls part-* | tr '\n' ' ')"
}

assemble() {
  [ -f .te/base/SHA256SUMS ] && [ -f .te/base/PARTS ] || \
    fail "this call carries no .te/base (SHA256SUMS, PARTS); name it in carry: [\".te/base\"]"
  local missing=()
  while read -r part; do [ -f "$PARTS/$part" ] || missing+=("$part"); done < .te/base/PARTS
  [ ${#missing[@]} -eq 0 ] || fail "${missing[*]} not in $PARTS (the machine went back between calls, or a part \
was never stashed); stash every part again, the calls back to back, then install"
  local wheel
  wheel=$(core_wheel)
  mkdir -p "$BUILD"
  (cd "$PARTS" && cat $(cat "$OLDPWD/.te/base/PARTS")) > "$BUILD/$wheel"
  (cd "$BUILD" && grep " $wheel\$" "$OLDPWD/.te/base/SHA256SUMS" | sha256sum --quiet -c -) || \
    fail "$wheel put back together does not match its sha256 (a part is damaged); build the kit and stash again"
  (cd .te/base && grep -v transformer_engine_cu13 SHA256SUMS | sha256sum --quiet -c -) || \
    fail ".te/base does not match its SHA256SUMS; build the kit again (scripts/te_gpu_kit.sh)"
  echo "assembled $BUILD/$wheel ($(du -m "$BUILD/$wheel" | cut -f1) MiB), sha256 ok"
}

install() {
  assemble
  local py
  python3 -m venv --system-site-packages --without-pip "$VENV"
  py="$VENV/bin/python"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$BUILD/$(core_wheel)" \
    .te/base/transformer_engine-*.whl .te/base/nvidia_cudnn_frontend-*.whl
  # The JAX extension: compiled here against this machine's jaxlib, CUDA 13 toolkit and Python, one source per core
  # (scripts/parallel_build)
  CUDNN_PATH=${CUDNN_PATH:-$("$py" -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null || true)} \
  NVTE_FRAMEWORK=jax MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONPATH="$PWD/scripts/parallel_build" \
    "$py" -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$BUILD" .te/base/transformer_engine_jax-*.tar.gz
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$BUILD"/transformer_engine_jax-*.whl
  "$py" - <<'PY'
import importlib.metadata as m
import jax
import transformer_engine.jax  # noqa: F401  (the extension loads against this jaxlib and driver)
print("TE ready:", {d: m.version(d) for d in ("transformer_engine", "transformer_engine_jax", "jax", "jaxlib")},
      jax.devices()[0].device_kind)
PY
}

case "${1:-}" in
  stash) stash ;;
  assemble) assemble ;;
  install) install ;;
  *) fail "usage: bash scripts/te_gpu_install.sh stash|assemble|install (see its first lines)" ;;
esac
