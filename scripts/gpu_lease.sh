#!/usr/bin/env bash
# One call on a lent GPU (docs/BENCHMARKS.md, "A short lease"): the checks and measurements issue 25 needs,
# most valuable first, each under its own time limit and all under one deadline, so that a lease of
# 15 minutes in all gets the most out of one call. Run there with `carry: [".whl"]`
# (bash scripts/gpu_carry_kit.sh here first):
#
#   bash scripts/gpu_lease.sh [SECONDS] [PLAN]   # deadline (default 540), plan bench | mosaic | ab | tiles | short | proj | split | calibrate | fp8 | wgrad;
#                                                # results under $OUT (else ./lease)
#
# Plan bench (the first call): the machine's facts; the fused head + loss kernels against float32 and timed beside the chunked
# loss (scripts/fused_ce_check.py); yxanul-197m stage 9 FP8 (the config's: FP8 weight gradients) profiled
# against the prediction, stage 9 BF16, stage 9 FP8 with BF16 weight gradients (fp8.wgrad=bf16), stage 0 FP8
# profiled, then stage 9 BF16 beside PyTorch with the time left (scripts/gpu_bench.py). Plan calibrate (a second call): profiles without command buffers,
# so that every kernel is matched to its prediction: stage 9 FP8 (its compiled HLO and the predicted kernels
# the trace never showed kept), stage 0 FP8, stage 9 BF16, then stage 2 FP8 (XLA's attention: its own data for
# the 'attention, XLA kernels' ratio, measured so far at stage 0 alone). Plan fp8 (FP8 weight gradients throughout, as when
# it ran on 2026-11-26): the ways of writing an FP8 GEMM for XLA (`fp8.gemm_form`) under XLA options, one
# projection at a time (scripts/fp8_gemm_probe.py), then stage 9 FP8 in the `dequant` form without Triton
# GEMMs profiled (its HLO kept), in the `f32` form with XLA's default options, and stage 0 in `dequant`. Plan wgrad: stages 9 and 0 in FP8 with the weight gradient in FP8 and in
# BF16 (`fp8.wgrad`). Plan ab (the fourth session's changes, each against what it replaced in the same call):
# the fused head + loss kernels, stage 9 FP8 (remat auto: cuDNN's output kept) and with remat full,
# stage 0 FP8 (short_attention) and with XLA's attention, stage 9 BF16 (remat auto, then full), stage 8
# FP8 with the time left. Plan tiles: the fused head + loss kernels' tiles swept at stage 9's 131,072 tokens (one
# kernel changed at a time, then each kernel's fastest together; every set checked against float32), then stage 9
# FP8 with the default tiles and with the fastest set (train.fused_ce_tiles), and stage 0 likewise. Plan short (the sixth
# session's changes): stages 0, 2 and 1 FP8 with `short_attention` as batched GEMMs (auto) and with XLA's attention,
# stage 0 profiled (the new kernels' own calibration), then yxanul-270m stage 5 FP8 and BF16 in one micro-batch of 32
# rows (the layout `plan --gpu h100` prints), the 197m cells with a loop over the layers (model.scan_unroll=1, as then).
# Plan proj (the seventh session's changes, each against what it replaced in the same call): stages 0 and 9 FP8 as
# configured (no loop over the layers; remat auto then saves everything at stage 0) and with the loop, then, with
# the loop, stage 9 BF16 with gate and up fused (model.fuse_mlp) and in two GEMMs, stage 9 FP8 with o in FP8.
# Plan split (the eighth session's changes): the fused head + loss kernels (one forward walk of the logits forms lse and
# the input gradient together; since the thirteenth session also the warp-specialized Mosaic GPU training kernels,
# $MOSAIC, model/fused_ce_ws.py) checked against float32 and timed, then stage 9 FP8 as configured, and with
# those kernels (train.fused_ce_tiles), then as configured (remat auto: `none` with each
# micro-batch in 2 on an H100, train.micro_split; since the ninth session FP8 weight gradients and one FP8 cast for
# gate and up) against BF16 weight gradients (fp8.wgrad=bf16, the eighth session's config) and against the whole
# micro-batch with `attention` (the seventh session's choice), then stage 1 likewise against `full`.
# Plan mosaic (first Muon's Newton-Schulz update at the 197m config's shapes, its GEMMs writing BF16 against float32
# products rounded after, compared element by element and timed, and float32 iterations timed:
# scripts/muon_rounding_check.py; then the fifteenth session's changes: the default training kernels of the fused
# loss are the Mosaic GPU ones, core/tiles.py `auto`; their RS form, $RS, takes every GEMM's left operand from registers): the fused loss
# checked against float32 and timed with the default tiles, with $TRITON (the Triton kernels the default ran before),
# with $RS and with $RS3,
# then the config as shipped (its layers unrolled: the step compiles for minutes on a cold machine, hence limits of
# 200-260 s) at stage 9 FP8, stage 9 FP8 with $RS (where its kernels were timed faster), stage 0 FP8 and stage 9
# BF16.
# A step that would not finish before the deadline is skipped and says so.
# Back under $OUT: lease.log (everything printed), results.tgz (every JSON, table and cell log) and
# traces.tgz (the Perfetto traces, when under 15 MiB).
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=${1:-540}
PLAN=${2:-bench}
PY=${PYTHON:-python3}  # the Python that runs every step (python3 on the GPU machine)
case "$PLAN" in bench | mosaic | ab | tiles | short | proj | split | calibrate | fp8 | wgrad) ;; *) echo "error: unknown plan '$PLAN' (bench | mosaic | ab | tiles | short | proj | split | calibrate | fp8 | wgrad)" >&2; exit 2 ;; esac
case "$DEADLINE" in '' | *[!0-9]*) echo "error: the deadline '$DEADLINE' is not a number of seconds" >&2; exit 2 ;; esac
DEADLINE=$((10#$DEADLINE))  # "0540" is 540, not octal
OUT=${OUT:-$PWD/lease}
RES=$(mktemp -d /tmp/lease.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/lease.log") 2>&1

step() {  # step NAME MAX_S MIN_S CMD...: run CMD under min(MAX_S, time left); skip below MIN_S
  local name=$1 max=$2 min=$3; shift 3
  local left=$((DEADLINE - SECONDS - 15))  # 15 s kept for the kill grace (5 s) and the packing
  if [ "$left" -lt "$min" ]; then
    echo "== $name: skipped, ${left}s left of the deadline (needs ${min}s)"; return 0
  fi
  local limit=$((left < max ? left : max)) t0=$SECONDS
  echo "== $name (limit ${limit}s, at ${SECONDS}s)"
  timeout -k 5 "$limit" "$@"
  echo "== $name: exit $? after $((SECONDS - t0))s"
}

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || echo "no nvidia-smi: not a GPU machine"
"$PY" - <<'PY'
import importlib.metadata as md, sys
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "missing"
names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "triton", "torch", "numpy")
print("python", sys.version.split()[0], " ".join(f"{n} {v(n)}" for n in names))
import jax
print(jax.devices())
PY
if "$PY" -c "import grain, tensorboardX" 2>/dev/null; then
  export PYTHONPATH=$PWD
elif ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  echo "no .whl/ carried: Grain and tensorboardX missing (bash scripts/gpu_carry_kit.sh here, carry [\".whl\"])"
  export PYTHONPATH=$PWD
fi
"$PY" -c "import yxanul_jax.training.stages, yxanul_jax.model.fused_ce" || { echo "import failed: stop"; exit 1; }

BENCH=("$PY" scripts/gpu_bench.py --baseline '' --steps 10 --warmup 3)
# the fused loss's training kernels at the default's blocks (core/tiles.py: training_form), in each form: MOSAIC
# warp-specialized (model/fused_ce_ws.py), TRITON (the default's until 2026-11-28), RS the Mosaic GPU kernels with the
# GEMMs' left operands in registers (the softmax, the block each consumer holds), RS3 that and a third ring slot
read -r MOSAIC TRITON RS RS3 < <("$PY" -c "from yxanul_jax.core.tiles import training_form as f
print(f('mosaic'), f('triton'), f('mosaic-rs'), f('mosaic-rs', 3))")
[ -n "$RS3" ] || { echo "core.tiles.training_form failed: stop"; exit 1; }
LOOP="model.scan_unroll=1"  # the 197m config's layers with a loop: the layout every plan but bench and proj was written for
case "$PLAN" in ab | tiles | short | calibrate | fp8 | wgrad) BENCH+=("$LOOP") ;; esac  # their limits fit its compile
case "$PLAN" in
  bench)  # the config as shipped: its layers unrolled compile for a minute or so (model.scan_unroll), hence the limits
    step fused_ce 100 45 "$PY" scripts/fused_ce_check.py --check-tokens 8000 --time-tokens 16384 131072 \
      --json-out "$RES/fused_ce.json"
    step s9_fp8 170 80 "${BENCH[@]}" --stages 9 --precisions fp8-xla --profile --no-torch --out "$RES/s9_fp8"
    step s9_bf16 130 60 "${BENCH[@]}" --stages 9 --precisions bf16 --no-torch --out "$RES/s9_bf16"
    step s9_fp8_wgrad_bf16 130 60 "${BENCH[@]}" fp8.wgrad=bf16 --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_wgrad_bf16"
    step s0_fp8 130 60 "${BENCH[@]}" --stages 0 --precisions fp8-xla --profile --no-torch --out "$RES/s0_fp8"
    XLA_PYTHON_CLIENT_PREALLOCATE=false step s9_bf16_torch 240 90 "${BENCH[@]}" --cell-timeout 220 --stages 9 \
      --precisions bf16 --torch --out "$RES/s9_bf16_torch"
    ;;
  mosaic)  # the default tiles (Mosaic GPU training kernels) against the Triton ones and the RS form; the unrolled
          # config's stages; first Muon's BF16-writing Newton-Schulz GEMMs against float32 products (seconds)
    step muon_rounding 60 20 "$PY" scripts/muon_rounding_check.py --json-out "$RES/muon_rounding.json"
    step fused_ce 210 80 "$PY" scripts/fused_ce_check.py --check-tokens 8000 --time-tokens 131072 --iters 5 \
      --tiles default "$TRITON" "$RS" "$RS3" --json-out "$RES/fused_ce.json"
    step s9_fp8 260 150 "${BENCH[@]}" --stages 9 --precisions fp8-xla --no-torch --out "$RES/s9_fp8"
    # the step with the faster RS set, only where its kernels were timed faster than the default's
    if FAST=$("$PY" -c 'import json, sys; t = {r["tiles"]: r["ms"] for r in json.load(open(sys.argv[1]))["timing"]
if r["kernel"] == "fused" and r["mode"] == "fwd+bwd" and "ms" in r}; best = min(sys.argv[2:], key=lambda s: t.get(s, 1e9))
sys.exit(1) if not t.get(best, 1e9) < t["default"] else print(best)' "$RES/fused_ce.json" "$RS" "$RS3" 2>/dev/null); then
      step s9_fp8_rs 260 150 "${BENCH[@]}" "train.fused_ce_tiles=$FAST" --stages 9 --precisions fp8-xla --no-torch \
        --out "$RES/s9_fp8_rs"
    else
      echo "== s9_fp8_rs: skipped, no RS set's kernels were timed faster than the default's"
    fi
    step s0_fp8 200 110 "${BENCH[@]}" --stages 0 --precisions fp8-xla --no-torch --out "$RES/s0_fp8"
    step s9_bf16 200 110 "${BENCH[@]}" --stages 9 --precisions bf16 --no-torch --out "$RES/s9_bf16"
    ;;
  ab)  # remat auto against full at stage 9, short_attention against XLA's at stage 0, the reworked fused loss;
        # no cell profiled: a profile turns command buffers off, and both sides of a comparison keep them
    step fused_ce 100 45 "$PY" scripts/fused_ce_check.py --check-tokens 8000 --time-tokens 131072 \
      --json-out "$RES/fused_ce.json"
    step s9_fp8 70 35 "${BENCH[@]}" --stages 9 --precisions fp8-xla --no-torch --out "$RES/s9_fp8"
    step s9_fp8_remat_full 70 35 "${BENCH[@]}" model.remat=full --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_remat_full"
    step s0_fp8 60 30 "${BENCH[@]}" --stages 0 --precisions fp8-xla --no-torch --out "$RES/s0_fp8"
    step s0_fp8_xla_attention 60 30 "${BENCH[@]}" model.attention=xla --stages 0 --precisions fp8-xla --no-torch \
      --out "$RES/s0_fp8_xla_attention"
    step s9_bf16 70 30 "${BENCH[@]}" --stages 9 --precisions bf16 --no-torch --out "$RES/s9_bf16"
    step s9_bf16_remat_full 60 30 "${BENCH[@]}" model.remat=full --stages 9 --precisions bf16 --no-torch \
      --out "$RES/s9_bf16_remat_full"
    step s8_fp8 80 40 "${BENCH[@]}" --stages 8 --precisions fp8-xla --no-torch --out "$RES/s8_fp8"
    ;;
  tiles)  # the fused head + loss kernels' blocks, warps and stages: which run fastest on this GPU, and in the step
    SETS=(default)
    for k in fwd dx dw; do
      # around each kernel's default (core/tiles.py: fwd 128x64s3, dx and dw 128x128s2): halve and double each
      # block, then four warps and one more stage
      if [ "$k" = fwd ]; then bt=128 bv=64 st=4; else bt=128 bv=128 st=3; fi
      SETS+=("$k=$((bt / 2))x$bv" "$k=$((bt * 2))x$bv" "$k=${bt}x$((bv / 2))" "$k=${bt}x$((bv * 2))"
             "$k=${bt}x${bv}w4" "$k=${bt}x${bv}s$st")
    done
    SETS+=("dx=128x128s2:mosaic" "dx=128x64s4:mosaic" "dw=128x128s2:mosaic" "dw=64x128s4:mosaic" "$MOSAIC")  # Mosaic
    step tiles_sweep 240 90 "$PY" scripts/fused_ce_check.py --check-tokens 0 --time-tokens 131072 --iters 5 \
      --tiles "${SETS[@]}" --json-out "$RES/fused_ce_tiles.json"
    # the fastest set in the canonical form (`KernelTiles.spec`): `default` when it is today's default tiles
    BEST=$("$PY" -c 'import json, sys; from yxanul_jax.core.tiles import parse_tiles
print(parse_tiles(json.load(open(sys.argv[1]))["fastest_tiles"]["131072"]).spec())' \
      "$RES/fused_ce_tiles.json" 2>/dev/null || echo default)
    echo "== fastest tiles: $BEST"
    step s9_fp8 70 35 "${BENCH[@]}" --stages 9 --precisions fp8-xla --no-torch --out "$RES/s9_fp8"
    if [ "$BEST" != default ]; then
      step s9_fp8_tiles 70 35 "${BENCH[@]}" "train.fused_ce_tiles=$BEST" --stages 9 --precisions fp8-xla --no-torch \
        --out "$RES/s9_fp8_tiles"
      step s0_fp8 60 30 "${BENCH[@]}" --stages 0 --precisions fp8-xla --no-torch --out "$RES/s0_fp8"
      step s0_fp8_tiles 60 30 "${BENCH[@]}" "train.fused_ce_tiles=$BEST" --stages 0 --precisions fp8-xla --no-torch \
        --out "$RES/s0_fp8_tiles"
    fi
    ;;
  proj)  # the layers without a loop against with one; o in BF16 against FP8; gate and up in one BF16 GEMM against two
    O_FP8="fp8.targets=[q,k,v,o,gate,up,down]"
    for stage in 0 9; do  # the config's unrolled layers compile for a minute or so: longer limits
      step "s${stage}_fp8" 150 60 "${BENCH[@]}" --stages "$stage" --precisions fp8-xla --no-torch --out "$RES/s${stage}_fp8"
      step "s${stage}_fp8_loop" 70 30 "${BENCH[@]}" "$LOOP" --stages "$stage" --precisions fp8-xla --no-torch \
        --out "$RES/s${stage}_fp8_loop"
    done
    step s9_bf16_loop 70 30 "${BENCH[@]}" "$LOOP" --stages 9 --precisions bf16 --no-torch --out "$RES/s9_bf16_loop"
    step s9_bf16_loop_unfused 70 30 "${BENCH[@]}" "$LOOP" model.fuse_mlp=false --stages 9 --precisions bf16 --no-torch \
      --out "$RES/s9_bf16_loop_unfused"
    step s9_fp8_loop_o_fp8 70 30 "${BENCH[@]}" "$LOOP" "$O_FP8" --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_loop_o_fp8"
    ;;
  split)  # remat auto's split micro-batches against the whole ones with the policy it took before
    step fused_ce 120 60 "$PY" scripts/fused_ce_check.py --check-tokens 8000 --time-tokens 131072 \
      --tiles default "$MOSAIC" --json-out "$RES/fused_ce.json"
    step s9_fp8 140 60 "${BENCH[@]}" --stages 9 --precisions fp8-xla --no-torch --out "$RES/s9_fp8"
    step s9_fp8_mosaic 140 60 "${BENCH[@]}" "train.fused_ce_tiles=$MOSAIC" --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_mosaic"
    step s9_fp8_wgrad_bf16 140 60 "${BENCH[@]}" fp8.wgrad=bf16 --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_wgrad_bf16"
    step s9_fp8_attention 140 60 "${BENCH[@]}" model.remat=attention --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_attention"
    step s1_fp8 120 60 "${BENCH[@]}" --stages 1 --precisions fp8-xla --no-torch --out "$RES/s1_fp8"
    step s1_fp8_full 120 60 "${BENCH[@]}" model.remat=full --stages 1 --precisions fp8-xla --no-torch \
      --out "$RES/s1_fp8_full"
    ;;
  short)  # short_attention as batched GEMMs (auto, up to 32 tokens) against XLA's attention; 270m in one micro-batch
    for stage in 0 2 1; do
      step "s${stage}_fp8" 60 25 "${BENCH[@]}" --stages "$stage" --precisions fp8-xla --no-torch --out "$RES/s${stage}_fp8"
      step "s${stage}_fp8_xla_attention" 60 25 "${BENCH[@]}" model.attention=xla --stages "$stage" --precisions fp8-xla \
        --no-torch --out "$RES/s${stage}_fp8_xla_attention"
    done
    step s0_fp8_prof 80 40 "${BENCH[@]}" --stages 0 --precisions fp8-xla --profile --no-torch --out "$RES/s0_fp8p"
    for p in fp8-xla bf16; do
      step "r270_s5_$p" 70 35 "${BENCH[@]}" --config configs/yxanul_270m.yaml curriculum.5.batch_size=32 \
        curriculum.5.grad_accum_steps=1 --stages 5 --precisions "$p" --no-torch --out "$RES/r270_s5_$p"
    done
    ;;
  calibrate)  # profiles without command buffers, every kernel matched to the prediction
    step s9_fp8_prof 160 110 "${BENCH[@]}" --stages 9 --precisions fp8-xla --profile --no-torch --out "$RES/s9_fp8p"
    step s0_fp8_prof 80 40 "${BENCH[@]}" --stages 0 --precisions fp8-xla --profile --no-torch --out "$RES/s0_fp8p"
    step s9_bf16_prof 70 35 "${BENCH[@]}" --stages 9 --precisions bf16 --profile --no-torch --out "$RES/s9_bf16p"
    step s2_fp8_prof 80 40 "${BENCH[@]}" --stages 2 --precisions fp8-xla --profile --no-torch --out "$RES/s2_fp8p"
    ;;
  fp8)  # the FP8 GEMM's form and XLA's Triton GEMMs: which one leaves no cast kernel behind
    DEQUANT=(fp8.wgrad=fp8 fp8.gemm_form=dequant train.xla_options.xla_gpu_enable_triton_gemm=false)
    step gemm_probe 120 60 "$PY" scripts/fp8_gemm_probe.py --iters 20 --options default no_triton_gemm \
      --json-out "$RES/fp8_gemm_probe.json"
    step s9_fp8_dequant_prof 130 70 "${BENCH[@]}" "${DEQUANT[@]}" --stages 9 --precisions fp8-xla --profile --no-torch \
      --out "$RES/s9_fp8_dequant"
    step s9_fp8_f32 115 100 "${BENCH[@]}" fp8.wgrad=fp8 fp8.gemm_form=f32 --stages 9 --precisions fp8-xla --no-torch \
      --out "$RES/s9_fp8_f32"
    step s0_fp8_dequant 60 35 "${BENCH[@]}" "${DEQUANT[@]}" --stages 0 --precisions fp8-xla --no-torch \
      --out "$RES/s0_fp8_dequant"
    ;;
  wgrad)  # fp8.wgrad: the weight gradient's GEMM in FP8 or BF16, stages 9 and 0, command buffers as in training
    for stage in 9 0; do
      for w in fp8 bf16; do
        step "s${stage}_fp8_wgrad_$w" 50 20 "${BENCH[@]}" "fp8.wgrad=$w" --stages "$stage" --precisions fp8-xla \
          --no-torch --out "$RES/s${stage}_fp8_wgrad_$w"
      done
    done
    ;;
esac

echo "== results at ${SECONDS}s"
cat "$RES"/*/bench.md 2>/dev/null
(cd "$RES" && find . -name '*.json' -o -name '*.md' -o -name '*.log' -o -name 'step.hlo.gz' | tar czf "$OUT/results.tgz" -T -)
(cd "$RES" && find . -name 'perfetto_trace.json.gz' | tar czf /tmp/traces.tgz -T -)
if [ "$(stat -c %s /tmp/traces.tgz)" -lt $((15 * 1024 * 1024)) ]; then cp /tmp/traces.tgz "$OUT/"; else
  echo "traces.tgz is $(($(stat -c %s /tmp/traces.tgz) / 1048576)) MiB: left behind"; fi
sleep 1  # let tee finish lease.log
