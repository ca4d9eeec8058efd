"""Compiling for an H100 on a machine without a GPU: target specs, the missing-plugin error, and the real
sm_90 compile of the train step (FP8 GEMMs where the config says, cuDNN attention, memory).

The sm_90 compiles run in the gpu-check environment (`scripts/gpu_check_env.sh`, which CI builds): a
venv that adds the CUDA compiler plugin to this Python's packages. Without it they skip, saying so.
"""
import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from yxanul_jax import analyze as insp
from yxanul_jax.analysis import gpu_target, perf
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.tiles import training_form

from conftest import LAYER_LOOP, REPO, gpu_env, gpu_python, inspect_h100


pytestmark = pytest.mark.slow  # compiles for sm_90 / runs scripts or subprocesses: `pytest -m "not slow"` skips it

def test_target_specs_and_a_bad_target():
    h100, h200 = gpu_target.target_spec("h100"), gpu_target.target_spec("h200")
    assert 'name: "NVIDIA H100 80GB HBM3"' in h100 and "device_memory_size: 84942979072" in h100
    assert 'name: "NVIDIA H200"' in h200 and "core_count: 132" in h200
    assert "{" + "memory}" not in h200 and "cuda_compute_capability { major: 9" in h200
    with pytest.raises(UserError, match="h100, h100-pcie, h200"):
        gpu_target.target_spec("a100")
    pcie = gpu_target.target_spec("h100-pcie")
    assert "core_count: 114" in pcie and "memory_bandwidth: 2000000000000" in pcie
    assert gpu_target.target_gpu("h200").hbm_bytes_per_s == 4.8e12


def test_missing_plugin_is_one_line_naming_the_fix():
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the CUDA plugin is importable in this environment; the missing-plugin path cannot run")
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.analyze", "--target", "h100"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --target h100 needs the CUDA compiler plugin") and "gpu_check_env" in lines[0]


def test_require_needs_a_target(capsys):
    assert insp.main(["--require", "fp8-expected"]) == 2
    assert "--target" in capsys.readouterr().err


# The start of the micro FP8 checks' subprocess: a compile-only H100, abstract operands `A`, one FP8 state `meta`.
MICRO_FP8_PREAMBLE = r"""
import json, jax, jax.numpy as jnp
from yxanul_jax.analysis import hlo, perf
from yxanul_jax.model import fp8 as F
from yxanul_jax.analysis.gpu_target import compile_device

s = jax.sharding.SingleDeviceSharding(compile_device("h100"))
A = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=s)
meta = {"amax_history": A((16,), jnp.float32), "scale": A((), jnp.float32), "nonfinite": A((), jnp.float32),
        "underflow": A((), jnp.float32)}
"""


def test_micro_fp8_dot_is_three_fp8_gemms_for_sm90_with_and_without_triton():
    # The direct form alone (forward, input gradient, weight gradient of one 4096 x 768 @ 768 x 2048
    # GEMM) under XLA's default flags (Triton GEMM fusions) and with Triton GEMMs off (cuBLASLt).
    code = MICRO_FP8_PREAMBLE + r"""
spec = F.Fp8Spec(jnp.bfloat16)
loss = lambda x, w, a, b, c: jnp.sum(F.fp8_dot(x, w, a, b, c, spec).astype(jnp.float32) ** 2)
lo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(A((8, 512, 768), jnp.bfloat16), A((768, 2048), jnp.float32),
                                                   meta, meta, meta)
out = {}
for name, opts in (("default", {}), ("no-triton", {"xla_gpu_enable_triton_gemm": False})):
    out[name] = hlo.gemm_kinds(hlo.gemms(lo.compile(compiler_options=opts).as_text()))
print(json.dumps(out))
"""
    proc = subprocess.run([gpu_python(), "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=gpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = json.loads(proc.stdout.strip().splitlines()[-1])
    assert kinds["default"] == {"fp8 triton": {"in_hlo": 3, "executed": 3}}, kinds
    assert kinds["no-triton"] == {"fp8 cublaslt": {"in_hlo": 3, "executed": 3}}, kinds


def test_dequant_form_writes_bf16_from_the_fp8_gemm_itself_for_sm90():
    # fp8.gemm_form: the `f32` form under cuBLASLt writes float32 from the forward and input-gradient GEMMs and
    # leaves the cast to BF16 as a kernel of its own (the 53 ms per step the H200 profile showed); `dequant`
    # folds both scales into the GEMM and writes BF16 directly, with no cast kernel after it. Both keep every
    # GEMM in FP8. (Weight gradients write the float32 master kernel's dtype in both.)
    code = MICRO_FP8_PREAMBLE + r"""
out = {}
for form in ("f32", "dequant"):
    spec = F.Fp8Spec(jnp.bfloat16, gemm_form=form)
    loss = lambda x, w, a, b, c: jnp.sum(F.fp8_dot(x, w, a, b, c, spec).astype(jnp.float32) ** 2)
    grad = lambda x, w, a, b, c: jax.grad(loss, argnums=(0, 1))(x, w, a, b, c)
    text = jax.jit(grad).lower(A((8, 512, 768), jnp.bfloat16), A((768, 2048), jnp.float32), meta, meta, meta).compile(
        compiler_options={"xla_gpu_enable_triton_gemm": False}).as_text()
    calls = {i.name: i.shape[1:].split("[")[0] for comp in hlo.parse_hlo(text).values() for i in comp.values()
             if i.op == "custom-call" and '"__cublas$lt$matmul$f8"' in i.attrs}  # by name: parse_hlo lists ENTRY twice
    writes = sorted(calls.values())
    casts = [k.name for k in perf.kernels(text) if k.name.startswith("wrapped_convert")]
    out[form] = {"kinds": hlo.gemm_kinds(hlo.gemms(text)), "writes": writes, "casts": casts}
print(json.dumps(out))
"""
    proc = subprocess.run([gpu_python(), "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=gpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for form in ("f32", "dequant"):
        assert got[form]["kinds"] == {"fp8 cublaslt": {"in_hlo": 3, "executed": 3}}, got
    assert got["f32"]["writes"] == ["f32", "f32", "f32"] and got["f32"]["casts"], got
    assert got["dequant"]["writes"] == ["bf16", "bf16", "f32"] and got["dequant"]["casts"] == [], got


def test_your_own_step_under_fp8_jit_runs_fp8_gemms_for_sm90_and_under_a_plain_jit_none():
    """The README's own training loop (fp8.value_and_grad, optax), in the GEMM form a GPU runs (`dequant`): under a
    plain `jax.jit` XLA's Triton GEMMs take the dequantized operands, and not one cuBLASLt FP8 GEMM is left; under
    `fp8.jit` (the options `required_xla_options` names) every FP8 target's three GEMMs are FP8 (found by a review
    that compiled the README's snippet for sm_90, 2026-11-28)."""
    code = r'''
import dataclasses, json, jax, jax.numpy as jnp, optax
from yxanul_jax.analysis import hlo
from yxanul_jax.analysis.gpu_target import compile_device
s = jax.sharding.SingleDeviceSharding(compile_device("h100"))
from yxanul_jax.core.config import Config
from yxanul_jax.model import fp8
from yxanul_jax.model.transformer import Yxanul, init_variables

cfg = Config()
f8 = dataclasses.replace(cfg.fp8, gemm_form="dequant")  # what `auto` runs on a GPU
model = Yxanul(cfg.model, f8)
params, fp8_state = fp8.split_state(jax.eval_shape(lambda: init_variables(cfg.model, f8, jax.random.key(0))))
optimizer = optax.adamw(1e-3)
opt_state = jax.eval_shape(optimizer.init, params)

def loss_fn(params, fp8_state, tokens_BxL):
    logits_BxLxV = model.apply({"params": params, **fp8_state}, tokens_BxL[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, tokens_BxL[:, 1:]).mean()

grad_fn = fp8.value_and_grad(loss_fn)

def step(params, fp8_state, opt_state, tokens_BxL):
    loss, (grads, fp8_state) = grad_fn(params, fp8_state, tokens_BxL)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), fp8_state, opt_state, loss

on = lambda t: jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), t)
args = (on(params), on(fp8_state), on(opt_state), jax.ShapeDtypeStruct((8, 65), jnp.int32, sharding=s))
out = {}
for name, jitted in (("jax.jit", jax.jit(step)), ("fp8.jit", fp8.jit(step, f8))):
    out[name] = hlo.gemm_kinds(hlo.gemms(jitted.lower(*args).compile().as_text()))
print(json.dumps({"kinds": out, "layers": cfg.model.n_layers, "targets": len(f8.targets)}))
'''
    proc = subprocess.run([gpu_python(), "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=gpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, ours = got["kinds"]["jax.jit"], got["kinds"]["fp8.jit"]
    assert "fp8 cublaslt" not in plain and "bf16 triton" in plain, got
    assert ours["fp8 cublaslt"]["executed"] == 3 * got["layers"] * got["targets"], got
    assert not [k for k in ours if "triton" in k], got


TRITON = training_form("triton")  # both training kernels in Triton, at the default's blocks


@pytest.fixture(scope="module")
def tiny_h100(tmp_path_factory) -> tuple[dict, str]:
    """The tiny config's stage-0 train step compiled for an H100 (FP8, the default loss kernels): `analyze`'s
    report and the optimized HLO, shared by the tests that read that one compile (each is ~10 s of CI), with the
    same step's loss kernels in Triton compiled beside it (`--compare`: the report's "compare")."""
    hlo_path = tmp_path_factory.mktemp("tiny_h100") / "step.hlo"
    report = inspect_h100("--config", "configs/tiny.yaml", "--require", "fp8-expected", "--require", "cudnn-attention",
                          "--hlo-out", str(hlo_path), "--compare", f"train.fused_ce_tiles={TRITON}")
    return report, hlo_path.read_text()


def test_tiny_stage_compiles_to_fp8_gemms_and_cudnn_attention_for_h100_and_is_predicted_beside_bf16(tiny_h100):
    on, hlo_text = tiny_h100
    g = on["gpu"]
    assert on["device_kind"] == "NVIDIA H100 80GB HBM3" and on["attention"] == "cudnn"
    # 4 layers x 7 projections x (forward, input gradient, weight gradient), all FP8, none lost: gate and up share
    # one FP8 cast (fp8.fp8_dots), and XLA's DotMerger, which merged their small GEMMs into a BF16 one, is kept
    # off them; every FP8 GEMM is read as its projection's (gate's and up's run in their `NAME/gemm` scopes)
    assert g["fp8_expected"]["total"] == g["fp8_found"] == 84 and g["fp8_lost"] == []
    from yxanul_jax.analysis import hlo

    gemms = hlo.gemms(hlo_text)
    targets = Counter(x.target for x in gemms if x.precision == "fp8")
    assert targets == {t: 12 for t in ("q", "k", "v", "o", "gate", "up", "down")}, targets
    # Muon's Newton-Schulz (training/muon.py): 3 BF16 GEMMs (optim.muon_ns_dtype) x 5 iterations per distinct kernel
    # shape ([128, 128] q and o, [128, 64] k and v, [128, 384] gate and up, [384, 128] down), batched over its 4
    # layers' kernels: 60, not the 420 of a chain per kernel; no float32 (TF32) GEMM is left in the step
    ns = [x for x in gemms if "/optimizer/" in x.op_name]
    assert len(ns) == 3 * 5 * 4 and all(x.precision == "bf16" and x.runs == 1 for x in ns), Counter(
        x.precision for x in ns)
    assert not [x for x in gemms if x.precision == "f32"]  # a float32 GEMM's operand type (TF32 on the GPU)
    # one GPU holds whole kernels, so each of those GEMMs writes BF16 itself (cuBLASLt rounds in its epilogue; with
    # Triton's GEMMs off a float32 product's rounding was a kernel of its own: muon.products_dtype)
    ns_calls = [line for line in hlo_text.splitlines() if "custom-call(" in line and "/optimizer/" in line
                and "__cublas" in line]
    assert len(ns_calls) == len(ns) and all(re.search(r"= \(bf16\[[0-9,]+\]", line) for line in ns_calls), ns_calls[:2]
    assert g["cudnn_attention"] == {"forward": 4, "backward": 4}
    assert g["fp8_values_in_hlo"] and on["memory"]["peak_bytes"] > 0
    # fp8.gemm_form: auto is `dequant` for a GPU: cuBLASLt FP8 GEMMs, compiled with Triton GEMMs off
    assert on["fp8"]["gemm_form"] == "dequant" and on["xla_options"] == {"xla_gpu_enable_triton_gemm": False}
    assert g["gemm_kinds"]["fp8 cublaslt"]["executed"] == 84
    assert abs(on["planner_bytes"] / on["memory"]["peak_bytes"] - 1) < 0.10  # the `gpu` plan, fitted to sm_90
    # the prediction, and FP8 off (no FP8 GEMM, no FP8 value in its HLO) predicted beside it
    p = on["prediction"]
    assert on["predicted_step_ms"] == p["predicted_step_ms"] > 0 and 0 < on["predicted_mfu"] < 1
    assert on["predicted_tokens_per_s"] == pytest.approx(on["tokens_per_step"] / (on["predicted_step_ms"] / 1e3))
    assert {"GEMM fp8", "attention", "output head + loss", "optimizer"} <= set(on["categories"])
    assert set(on["categories"]) <= set(perf.CATEGORIES)
    # every launch counted: 4 layers x (forward, recompute-free backward) cuDNN calls are 8 attention kernels
    assert on["categories"]["attention"]["launches"] == 8 and p["kernel_launches"] >= p["kernel_sites"]
    assert on["hlo_flops"] == p["hlo_flops"] > 0 and on["model_flops"] > 0
    off = inspect_h100("--config", "configs/tiny.yaml", "--disable-fp8", "--require", "fp8-expected")
    assert off["gpu"]["fp8_found"] == 0 and not off["gpu"]["fp8_values_in_hlo"]
    assert "GEMM fp8" not in off["categories"] and off["predicted_step_ms"] > 0
    # the form whose scales multiply after the GEMM keeps the GEMMs apart too (their FP8 input, not the scale); an
    # XLA option given on the command line reaches the compile (the one compile checks both: it is minutes of CI)
    direct = inspect_h100("--config", "configs/tiny.yaml", "fp8.gemm_form=direct", "--require", "fp8-expected",
                          "--xla-option", "xla_gpu_enable_triton_gemm=false")
    assert direct["gpu"]["fp8_found"] == 84 and direct["gpu"]["gemm_kinds"]["fp8 cublaslt"]["executed"] == 84
    assert direct["xla_options"] == {"xla_gpu_enable_triton_gemm": False}


def test_fp8_head_with_padded_vocabulary_and_accumulation():
    r = inspect_h100("--config", "configs/tiny.yaml", "fp8.targets=[q,k,v,o,gate,up,down,head]", "model.vocab_pad_to=128",
                 "model.remat=full", "model.scan_layers=true", "curriculum.0.grad_accum_steps=2",
                 "--require", "fp8-expected")
    e = r["gpu"]["fp8_expected"]
    # per micro-batch: 4 layers x 7 (+1 head) forward, 4 x 6 (+1) recomputed, the same 29 input and weight grads
    assert (e["forward"], e["recompute"], e["input_grad"], e["weight_grad"]) == (58, 50, 58, 58)
    assert r["gpu"]["fp8_found"] == 224


@pytest.mark.parametrize("config, stage", [("configs/yxanul_197m.yaml", "0"), ("configs/yxanul_197m.yaml", "9")])
def test_yxanul_197m_stages_compile_to_fp8_for_h100(config, stage, tmp_path):
    hlo_path = tmp_path / "step.hlo"
    # Stage 0 (seq 8) runs `short_attention`, stage 9 (seq 2048) cuDNN's (`transformer.SHORT_ATTENTION_MAX_SEQ`)
    cudnn = ("--require", "cudnn-attention") if stage == "9" else ()
    r = inspect_h100("--config", config, "--stage", stage, "--require", "fp8-expected", *cudnn,
                     "--hlo-out", str(hlo_path), LAYER_LOOP)
    assert r["attention"] == ("cudnn" if stage == "9" else "short")
    # `remat: auto` on an H100: cuDNN's output saved at stage 9, so its forward runs once per layer, not twice
    assert r["remat"] == ("attention" if stage == "9" else "full")
    if stage == "0":
        assert r["gpu"]["cudnn_attention"] == {"forward": 0, "backward": 0} and "__cudnn$fmha" not in hlo_path.read_text()
    else:
        assert r["gpu"]["cudnn_attention"] == {"forward": 1, "backward": 1}
    # The head + loss are the fused kernels (issue 25): no [>= 1024 x padded_vocab] buffer anywhere in the step,
    # and the kernels' FLOPs are counted: 4 x 2 T K V, the training forward's logits and softmax @ w, then dw's
    # recomputed logits and gradient GEMM (a fifth, a dx kernel walking the logits again, is gone).
    padded = 200064
    big = [m for m in re.findall(r"\b[a-z0-9]+\[([0-9,]+)\]", hlo_path.read_text())
           if str(padded) in m.split(",") and any(int(d) >= 1024 and int(d) != padded for d in m.split(","))]
    assert not big, big[:5]
    tokens = r["tokens_per_step"]
    head = r["categories"]["output head + loss"]
    assert 4 * 2 * tokens * 128 * padded <= head["flops"] < 5 * 2 * tokens * 128 * padded
    assert r["categories"].get("GEMM f32") is None  # no float32 GEMM where the operands are BF16
    # issue 26: the config's Muon (optim.name: muon) runs its Newton-Schulz GEMMs in the step, and the performance
    # model charges them to the optimizer
    assert r["categories"]["optimizer"]["flops"] > 1e12 and r["predicted_step_ms"] > 0
    g = r["gpu"]
    # 28 scanned layers x (4 forward (q, k, v fused: model.fuse_projections; o is BF16: the config's fp8.targets)
    # + 3 recomputed (remat full or attention; `down` is not) + 4 input gradients + 4 weight gradients (the
    # config's fp8.wgrad: fp8)
    assert g["fp8_found"] == g["fp8_expected"]["total"] == 28 * 15 and g["fp8_lost"] == []
    assert g["fp8_expected"]["weight_grad"] == 28 * 4 and r["fp8"]["gemm_form"] == "dequant"
    assert abs(r["planner_bytes"] / r["memory"]["peak_bytes"] - 1) < 0.10  # what `plan` tells a user, within 10 %
    # The performance model saw the whole step: every scanned layer, every loss chunk (trip counts applied).
    assert 0.9 < r["hlo_flops"] / r["model_flops"] < 1.6 and 0.02 < r["predicted_mfu"] < 0.9
    from yxanul_jax.analysis import perf

    kernels = perf.kernels(hlo_path.read_text())
    pallas = sorted(n for k in kernels if (n := perf._pallas_kernel(k.op_name)))
    # one walk of the logits forward, one for dw: the default tiles' Mosaic GPU kernels at head width 128
    assert pallas == ["fused_ce_dw_ws", "fused_ce_fwd_dx_ws"]
    # The gradient of the fused q/k/v is written whole once (`transformer.materialized_grad`), so its FP8 amax and
    # cast are one kernel reading it; fused into their producers they were two, each re-reading dq, dk and dv.
    qkv_grad_scaling = [k.name for k in kernels
                        if "attn/qkv/fp8_scaling" in k.op_name and "transpose(" in k.op_name
                        and "rematted_computation" not in k.op_name and k.bytes >= tokens * 1024]
    assert len(qkv_grad_scaling) == 1, qkv_grad_scaling
    if stage == "0":
        # `short_attention`'s products are BF16 GEMMs (forward 2, recomputed 2, backward 4) with no float32
        # operand: as broadcast products summed over K they were reductions at 8-16x their bandwidth time (H200)
        gemms = [k.precision for k in kernels if k.category == "attention" and k.flops]
        assert gemms == ["bf16"] * 8, gemms


def test_attention_remat_keeps_cudnns_output_and_statistics_as_the_planner_counts():
    # cuDNN's attention traces only where its library is (the gpu-check venv): what JAX saves per layer and
    # token with remat=attention is full's block input plus cuDNN's output (a H K) and float32 statistics (4 H).
    code = (
        "import sys, json; sys.path.insert(0, 'tests')\n"
        "from test_memory_plan import saved_per_layer_token\n"
        "from yxanul_jax.analysis import memory\n"
        "out = {}\n"
        "for remat in ('attention', 'full'):\n"
        "    cfg, got = saved_per_layer_token([f'model.remat={remat}', 'model.scan_layers=true', 'model.attention=cudnn'])\n"
        "    out[remat] = [got, memory.saved_bytes_per_token(cfg, 32, remat, flash=True)]\n"
        "m = cfg.model\n"
        "out['extra'] = 2 * m.n_heads * m.resolved_head_dim + 4 * m.n_heads\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([gpu_python(), "-c", code], capture_output=True, text=True, cwd=REPO, env=gpu_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["attention"][0] == out["attention"][1] and out["full"][0] == out["full"][1]
    assert out["attention"][0] - out["full"][0] == out["extra"]


@pytest.mark.parametrize("fp8, remat, n", [(True, "auto", 8), (False, "auto", 8), (True, "full", 8)])
def test_unrolled_layers_compile_without_a_loop_and_save_everything_on_an_h100(fp8, remat, n, tmp_path):
    # The 197m config's layers without a loop (model.scan_unroll = n_layers), cut to 8 layers for CI's time:
    # `remat: auto` picks `none` at stage 0 on an H100 (memory.AUTO_REMAT_UNROLLED), no layer runs again, and
    # the planner is within 10 % of XLA's peak (the full 28 layers, 2026-11-27: FP8 41.2 GB planned, 40.8 XLA's;
    # BF16 46.9 and 46.1). `full` still recomputes each layer: without remat's CSE barrier XLA merged the
    # recomputed forward GEMMs into the first ones on sm_90 (stage 9 `attention` took 59 GB). `full` at 8 layers was
    # planned 10.5 % over XLA's 3.50 GB until the planner's refit with 8, 14 and 28 layers (memory.GPU_CALIBRATION,
    # 2026-11-29: +2.1 %; 28 layers -0.2 %, a fit row: docs/bench/fit_plan_sm90_2026-11-29.jsonl)
    hlo_path = tmp_path / "step.hlo"
    r = inspect_h100("--config", "configs/yxanul_197m.yaml", "--stage", "0", f"model.n_layers={n}",
                     f"model.scan_unroll={n}", f"model.remat={remat}",
                     *(("--require", "fp8-expected") if fp8 else ("--disable-fp8",)),
                     "--require", "cudnn-attention", "--hlo-out", str(hlo_path))
    assert r["remat"] == ("none" if remat == "auto" else remat) and " while(" not in hlo_path.read_text()
    g = r["gpu"]
    # seq 8 runs short_attention by design: no cuDNN call, and the requirement holds (it had failed here)
    assert r["attention"] == "short" and g["cudnn_attention"] == {"forward": 0, "backward": 0}
    # n layers x (4 forward + 3 recomputed (not down) with `full` + 4 input gradients + 4 weight gradients)
    recomputed = n * 3 if remat == "full" else 0
    assert g["fp8_expected"]["recompute"] == (recomputed if fp8 else 0)
    assert g["fp8_found"] == g["fp8_expected"]["total"] == (n * 12 + recomputed if fp8 else 0)
    assert abs(r["planner_bytes"] / r["memory"]["peak_bytes"] - 1) < 0.10, (r["planner_bytes"], r["memory"])


def test_a_split_micro_batch_compiles_as_planned_on_an_h100(tmp_path):
    # `remat: auto` runs stage 9 of the full model as none/2 on an H100 (memory.AUTO_SPLITS; 28 layers, 2026-11-27:
    # XLA's peak 39.7 GB, planned 40.3): here an 8-layer cut with the split by hand. The step scans 2 micro-batches
    # of 32 rows, each without recomputation, and the planner plans the pieces within 10 % of XLA's peak.
    hlo_path = tmp_path / "step.hlo"
    r = inspect_h100("--config", "configs/yxanul_197m.yaml", "--stage", "9", "model.n_layers=8", "model.scan_unroll=8",
                     "model.remat=none", "train.micro_split=2", "--require", "fp8-expected", "--hlo-out", str(hlo_path))
    assert (r["remat"], r["micro_split"], r["batch_size"], r["tokens_per_step"]) == ("none", 2, 64, 64 * 2048)
    g = r["gpu"]
    assert g["fp8_found"] == g["fp8_expected"]["total"] == 2 * 8 * 12  # 2 pieces x 8 layers x (4 fwd, dgrad, wgrad)
    assert g["cudnn_attention"] == {"forward": 8, "backward": 8}  # each layer's, once in the scanned micro-batch body
    assert abs(r["planner_bytes"] / r["memory"]["peak_bytes"] - 1) < 0.10, (r["planner_bytes"], r["memory"])


@pytest.mark.parametrize("remat, attention", [("none", "auto"), ("dots", "auto"), ("full", "xla")])
def test_planner_within_10_percent_of_sm90_for_every_remat_policy(remat, attention):
    # `full` is checked above at stage 0 and `attention` (what `auto` picks on an H100) at stage 9; the policies
    # plan offers beside them, at the largest stage (a scanned layer without remat stacks every residual: 112 GB
    # of XLA's peak, issue 25). XLA's attention (a float32 model's on a GPU) at 2,048 tokens: its scores' working set,
    # planned 54 % under XLA's 43.2 GB before the planner's refit of 2026-11-29 (-2.9 % after)
    r = inspect_h100("--config", "configs/yxanul_197m.yaml", "--stage", "9", f"model.remat={remat}",
                     f"model.attention={attention}", LAYER_LOOP)
    assert abs(r["planner_bytes"] / r["memory"]["peak_bytes"] - 1) < 0.10, (r["planner_bytes"], r["memory"])


def test_the_default_training_kernels_compile_as_mosaic_into_the_step_and_are_charged_at_their_rate(tiny_h100):
    # model.fused_ce_ws in the tiny step (head width 128) for sm_90, as the default tiles pick it: Mosaic GPU custom
    # calls (the CUDA plugin builds their PTX; the census test below reads it), the same FLOPs as the Triton
    # kernels, and the model charges them at their measured rate (perf.FUSED_CE_MEASURED): the head + loss take
    # less time than with the Triton kernels
    r, hlo = tiny_h100
    assert hlo.count('custom_call_target="mosaic_gpu_v2"') == 2
    assert sorted(n for k in perf.kernels(hlo) if (n := perf._pallas_kernel(k.op_name))) == [
        "fused_ce_dw_ws", "fused_ce_fwd_dx_ws"]
    # what scripts/fused_ce_check.py records beside a timing as the kernels that ran
    assert perf.fused_ce_calls(hlo) == {"fused_ce_dw_ws": "mosaic_gpu_v2", "fused_ce_fwd_dx_ws": "mosaic_gpu_v2"}
    assert r["compare"]["variant"] == f"train.fused_ce_tiles={TRITON}"
    mine, triton = r["categories"]["output head + loss"], r["compare"]["categories"]["output head + loss"]
    assert mine["flops"] == pytest.approx(triton["flops"], rel=1e-3) and mine["ms"] < triton["ms"]


def test_fused_loss_tiles_beyond_sm90_shared_memory_are_one_line():
    # Triton's limit shows only in the GPU compile (interpret mode on a CPU has none): XLA's error becomes one line
    # naming the key and the fix, in analyze as in train (`stages.compile_stage`)
    proc = subprocess.run([gpu_python(), "-m", "yxanul_jax.analyze", "--target", "h100", "--config", "configs/tiny.yaml",
                           "train.fused_ce_tiles=dw=256x256s4"], capture_output=True, text=True, cwd=REPO,
                          env=gpu_env(), timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("error: train.fused_ce_tiles=dw=256x256s4: a kernel asks more shared memory than this "
                               "GPU has (") and "232,448 there" in lines[0] and "fused_ce_tiles=default" in lines[0]


def test_the_mosaic_kernels_fit_sm90s_shared_memory_at_every_ring_the_tiles_allow():
    # core.tiles.mosaic_max_stages is arithmetic; the sm_90 lowering counts the bytes (and refuses a kernel over
    # 232,448). The largest rings of 128 rows compile in the census test below (the SMEM form's 2, the RS form's 3);
    # here the largest of 64 rows in both forms, both kernels, at K 128
    code = """
import jax, jax.numpy as jnp
from yxanul_jax.analysis.gpu_target import compile_device
from yxanul_jax.core.tiles import parse_tiles
from yxanul_jax.model import fused_ce
from jax.sharding import SingleDeviceSharding
where = SingleDeviceSharding(compile_device("h100"))
for spec in ("dx=128x64s4:mosaic,dw=64x128s4:mosaic", "dx=128x64s6:mosaic-rs,dw=64x128s6:mosaic-rs"):
    tiles = parse_tiles(spec)
    T, V = 8 * tiles.t_multiple, 8 * tiles.v_multiple
    args = [jax.ShapeDtypeStruct(s, d, sharding=where) for s, d in (((T, 128), jnp.bfloat16), ((V, 128), jnp.bfloat16),
                                                                     ((T,), jnp.int32))]
    def loss(x, w, t):
        return jnp.sum(fused_ce.linear_cross_entropy(x, w, t, V - 59, tiles=tiles)[0])
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().as_text()
    assert text.count('custom_call_target="mosaic_gpu_v2"') == 2, spec
    print("fits", spec)
"""
    proc = subprocess.run([gpu_python(), "-c", code], capture_output=True, text=True, cwd=REPO, env=gpu_env(),
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.count("fits ") == 2, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_fused_loss_kernels_sass_census_is_the_recorded_one(tmp_path):
    """The fused head + loss kernels' inner loops in SASS (ptxas + nvdisasm of the sm_90 compile): one ex2 per
    logit with at most 5 float32 instructions around it (libdevice's expf put 8 more around each), no spills,
    and the tensor share recorded for them (`fused_ce.TENSOR_SHARE`) is today's code's. With the default tiles
    (the training kernels warp-specialized, `model.fused_ce_ws`: two consumers taking turns), and the Triton ones."""
    from yxanul_jax.model.fused_ce import KERNELS, TENSOR_SHARE

    out = tmp_path / "sass.json"
    rs = "dx=128x128s3:mosaic-rs,dw=128x128s3:mosaic-rs"  # the RS form with the slot its softmax frees
    proc = subprocess.run([gpu_python(), "scripts/fused_ce_sass.py", "--tiles", "default", TRITON, rs, "--json-out",
                           str(out)], capture_output=True, text=True, cwd=REPO, env=gpu_env(), timeout=600)
    if proc.returncode == 2 and "nvdisasm" in proc.stderr:
        pytest.skip("the gpu-check environment predates nvdisasm: rerun scripts/gpu_check_env.sh")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["kernels"]
    assert sorted({k["kernel"] for k in rows}) == sorted(TENSOR_SHARE)
    # the RS form keeps the softmax and dlogits in registers: no store of them and no fence in its loop
    loop = {(k["tiles"], k["kernel"]): k["instructions"] for k in rows}
    smem = {(k["tiles"], k["kernel"]): k["smem_bytes"] for k in rows}
    for name in ("fused_ce_fwd_dx_ws", "fused_ce_dw_ws"):
        assert loop[(rs, name)] < loop[("default", name)] - 30, (name, loop)
        # ... so its shared memory moves neither that store nor either GEMM's A operand (the softmax or dlogits, and
        # the consumer's own block, held in registers through the walk): 2 consumers x 64 rows x 128 of BF16 each
        # (kernel_census.smem_bytes, from the SASS: wgmma with A in registers)
        ss, regs = smem[("default", name)], smem[(rs, name)]
        assert (ss["stores"], regs["stores"]) == (2 * 64 * 128 * 2, 0), (name, ss, regs)
        assert ss["wgmma"] - regs["wgmma"] == 2 * (2 * 64 * 128 * 2), (name, ss, regs)
    # it keeps the kernels' names, and so the timed form's rate (analysis/perf.py): its census within 1 % of that form's
    clocks = {(k["tiles"], k["kernel"]): k["cycles"]["total"] for k in rows}
    for name in ("fused_ce_fwd_dx_ws", "fused_ce_dw_ws"):
        assert abs(clocks[(rs, name)] / clocks[("default", name)] - 1) < 0.01, (name, clocks)
    for k in rows:
        name = k["kernel"]
        logits = k["bt"] * k["bv"] // (k["warps"] * 32)  # per thread and iteration
        # the evaluation forward's per-row rescale (wgmma's accumulator gives each thread 2 rows of a warp's 16); the
        # training forward's loop shifts by its anchor, without a max (its online-max fallback is another loop)
        # the warp-specialized forward keeps an online max (`model.fused_ce_ws`: no fallback walk): its rescales too
        rescales = k["bt"] // (k["warps"] * 8) if name in ("fused_ce_fwd", "fused_ce_fwd_dx_ws") else 0
        assert k["mufu"] == logits + rescales, (name, k["mufu"], logits)
        assert k["fp32_alu"] <= 5 * logits, (name, k["fp32_alu"], logits)
        assert k["spill_bytes"] == 0, name
        # the wgmma FLOPs the census walks are the kernel's GEMMs (`KERNELS`) over one tile, K = 128
        assert k["cycles"]["tensor"] == KERNELS[name] * 2 * k["bt"] * k["bv"] * 128 / 4096, name
        if k["tiles"] != rs:  # the share recorded is the default tiles' (Triton's for the Triton set)
            assert abs(k["share"] - TENSOR_SHARE[name]) < 0.01, (name, k["share"], TENSOR_SHARE[name])
