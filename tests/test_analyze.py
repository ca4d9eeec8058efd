"""`python -m yxanul_jax.analyze`: the HLO dot classifier on hand-written HLO, then the real command on
a compiled micro model with FP8 on and off."""
import dataclasses
import json

import pytest

from yxanul_jax import analyze as insp
from yxanul_jax.core.coerce import to_yaml
from yxanul_jax.core.config import FP8Config

from conftest import micro_config

# The xla FP8 recipe as XLA CPU leaves it: quantized operands are converted back and scaled, then a dot.
FP8_DEQUANT = """
HloModule m

ENTRY %main (x: bf16[4,8], w: f32[8,16], s: f32[]) -> bf16[4,16] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = f32[8,16]{1,0} parameter(1)
  %s = f32[] parameter(2)
  %xq = f8e4m3fn[4,8]{1,0} convert(%x)
  %xd = bf16[4,8]{1,0} convert(%xq)
  %sb = bf16[] convert(%s)
  %bs = bf16[4,8]{1,0} broadcast(%sb), dimensions={}
  %xs = bf16[4,8]{1,0} multiply(%xd, %bs)
  %wb = bf16[8,16]{1,0} convert(%w)
  ROOT %y = bf16[4,16]{1,0} dot(%xs, %wb), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

PLAIN_BF16 = """
ENTRY %main (x: bf16[4,8], w: bf16[8,16]) -> f32[4,16] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,16]{1,0} parameter(1)
  %t = bf16[16,8]{1,0} transpose(%w), dimensions={1,0}
  %wt = bf16[8,16]{1,0} transpose(%t), dimensions={1,0}
  ROOT %y = f32[4,16]{1,0} dot(%x, %wt), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

# Across fusion boundaries (out of %gemm, into %scale's root, out of %scale to the convert of the FP8
# loop value), inside a loop that runs 28 times (a scanned layer).
FUSED_LOOP = """
HloModule m, is_scheduled=true

%scale (p0: f32[4,8], p1: f32[]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[] parameter(1)
  %b = f32[4,8]{1,0} broadcast(%p1), dimensions={}
  ROOT %m = f32[4,8]{1,0} multiply(%p0, %b)
}

%gemm (a: f32[4,8], b: f32[8,16]) -> f32[4,16] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,16]{1,0} parameter(1)
  ROOT %d = f32[4,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (t: (s32[], f8e5m2[4,8], f32[], f32[8,16], f32[4,8])) -> (s32[], f8e5m2[4,8], f32[], f32[8,16], f32[4,8]) {
  %t = (s32[], f8e5m2[4,8]{1,0}, f32[], f32[8,16]{1,0}, f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %q = f8e5m2[4,8]{1,0} get-tuple-element(%t), index=1
  %s = f32[] get-tuple-element(%t), index=2
  %w = f32[8,16]{1,0} get-tuple-element(%t), index=3
  %h = f32[4,8]{1,0} get-tuple-element(%t), index=4
  %c8 = f32[4,8]{1,0} convert(%q)
  %dq = f32[4,8]{1,0} fusion(/*index=0*/%c8, %s), kind=kLoop, calls=%scale
  %y8 = f32[4,16]{1,0} fusion(%dq, %w), kind=kOutput, calls=%gemm
  %y32 = f32[4,16]{1,0} fusion(%h, %w), kind=kOutput, calls=%gemm.1
  ROOT %r = (s32[], f8e5m2[4,8]{1,0}, f32[], f32[8,16]{1,0}, f32[4,8]{1,0}) tuple(%i, %q, %s, %w, %h)
}

%gemm.1 (a.1: f32[4,8], b.1: f32[8,16]) -> f32[4,16] {
  %a.1 = f32[4,8]{1,0} parameter(0)
  %b.1 = f32[8,16]{1,0} parameter(1)
  ROOT %d.1 = f32[4,16]{1,0} dot(%a.1, %b.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cond (c: (s32[], f8e5m2[4,8], f32[], f32[8,16], f32[4,8])) -> pred[] {
  %c = (s32[], f8e5m2[4,8]{1,0}, f32[], f32[8,16]{1,0}, f32[4,8]{1,0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %main (init: (s32[], f8e5m2[4,8], f32[], f32[8,16], f32[4,8])) -> (s32[], f8e5m2[4,8], f32[], f32[8,16], f32[4,8]) {
  %init = (s32[], f8e5m2[4,8]{1,0}, f32[], f32[8,16]{1,0}, f32[4,8]{1,0}) parameter(0)
  ROOT %w = (s32[], f8e5m2[4,8]{1,0}, f32[], f32[8,16]{1,0}, f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"28"}}
}
"""

# What XLA's GPU GEMM rewriter leaves: cuBLASLt custom calls.
GPU_GEMMS = """
ENTRY %main (a: f8e4m3fn[16,32], b: f8e4m3fn[32,16], sa: f32[], sb: f32[], c: bf16[16,32], d: bf16[32,16]) -> bf16[16,16] {
  %a = f8e4m3fn[16,32]{1,0} parameter(0)
  %b = f8e4m3fn[32,16]{0,1} parameter(1)
  %sa = f32[] parameter(2)
  %sb = f32[] parameter(3)
  %c = bf16[16,32]{1,0} parameter(4)
  %d = bf16[32,16]{1,0} parameter(5)
  %g8 = (bf16[16,16]{1,0}, s8[33554432]{0}) custom-call(%a, %b, %sa, %sb), custom_call_target="__cublas$lt$matmul$f8", backend_config={"gemm_backend_config":{"alpha_real":1}}
  %g16 = (bf16[16,16]{1,0}, s8[4194304]{0}) custom-call(%c, %d), custom_call_target="__cublas$gemm"
  %attn = (bf16[16,16]{1,0}, u8[0]{0}) custom-call(%c, %d), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %o = bf16[16,16]{1,0} get-tuple-element(%g8), index=0
}
"""


# JAX 0.11's XLA runs some fusions asynchronously: `fusion-start` (typed ((operands), result, context)) and
# `fusion-done`. Here the FP8 operand is dequantized inside one.
ASYNC_DEQUANT = """
%fused_dequant (p0: f8e4m3fn[16,32]) -> bf16[16,32] {
  %p0 = f8e4m3fn[16,32]{1,0} parameter(0)
  ROOT %c = bf16[16,32]{1,0} convert(%p0)
}

ENTRY %main (a: f8e4m3fn[16,32], d: bf16[32,16]) -> bf16[16,16] {
  %a = f8e4m3fn[16,32]{1,0} parameter(0)
  %d = bf16[32,16]{1,0} parameter(1)
  %start = ((f8e4m3fn[16,32]{1,0}), bf16[16,32]{1,0}, u32[]) fusion-start(%a), kind=kLoop, calls=%fused_dequant
  %done = bf16[16,32]{1,0} fusion-done(%start)
  ROOT %g = bf16[16,16]{1,0} dot(%done, %d), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_an_fp8_operand_dequantized_in_an_asynchronous_fusion_makes_an_fp8_dot():
    d = insp.count_dots(ASYNC_DEQUANT)
    assert (d["fp8"], d["total"]) == (1, 1)
    d = insp.count_dots(ASYNC_DEQUANT.replace("f8e4m3fn", "bf16"))  # the same graph without FP8
    assert (d["fp8"], d["bf16"], d["total"]) == (0, 1, 1)


def test_dequantized_fp8_operand_makes_an_fp8_dot():
    d = insp.count_dots(FP8_DEQUANT)
    assert (d["fp8"], d["total"]) == (1, 1)


def test_bf16_dot_is_not_fp8():
    d = insp.count_dots(PLAIN_BF16)
    assert (d["fp8"], d["bf16"], d["total"]) == (0, 1, 1)


def test_fusion_boundaries_and_loop_trip_counts():
    d = insp.count_dots(FUSED_LOOP)
    assert (d["fp8"], d["f32"], d["total"]) == (1, 1, 2)
    assert d["executed"] == {"fp8": 28, "f32": 28, "total": 56}


def test_cublaslt_fp8_custom_calls_count_as_fp8_and_attention_is_not_a_gemm():
    d = insp.count_dots(GPU_GEMMS)
    assert (d["fp8"], d["fp8_custom_calls"], d["bf16"], d["total"]) == (1, 1, 1, 2)


def _run(capsys, tmp_path, fp8: FP8Config, *extra):
    cfg = dataclasses.replace(micro_config(), fp8=fp8)
    path = tmp_path / "micro.yaml"
    path.write_text(to_yaml(cfg))
    assert insp.main(["--config", str(path), "curriculum.0.seq_len=16", "curriculum.0.batch_size=2", "--json",
                      *extra]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), out[:-1]


def test_analyze_counts_fp8_dots_on_and_none_off(capsys, tmp_path):
    hlo = tmp_path / "new" / "folders" / "step.hlo.txt"  # its missing folders are made
    on, table = _run(capsys, tmp_path, FP8Config(), "--hlo-out", str(hlo), "optim.name=muon")
    # micro model: 2 layers x 7 FP8 projections x 3 GEMMs (forward, dx, dw)
    assert on["dots"]["fp8"] == 2 * 7 * 3 and on["dots"]["total"] > on["dots"]["fp8"]
    assert on["memory"]["peak_bytes"] > on["memory"]["temp_bytes"] > 0
    # Trip-counted HLO FLOPs against the model's formula (6 N + attention; XLA on CPU computes the whole
    # score square, as the formula counts it): equal but for the 15 padded vocabulary rows the head's
    # rank-16 GEMM computes (forward, input and weight gradient) for each of the 32 tokens, and the optimizer's
    # Newton-Schulz iterations under Muon (accounting.newton_schulz_flops: 14.6 M here)
    f = on["flops"]
    assert f["hlo_per_step"] == on["hlo_flops"] and f["model_per_step"] == on["model_flops"]
    assert f["newton_schulz_per_step"] == 14_581_760 and any("Newton-Schulz" in line for line in table)
    assert f["hlo_per_step"] == f["model_per_step"] + 6 * 16 * (112 - 97) * 32 + f["newton_schulz_per_step"]
    adamw, adamw_table = _run(capsys, tmp_path, FP8Config(), "optim.name=adamw")
    assert adamw["flops"]["newton_schulz_per_step"] == 0 and not any("Newton-Schulz" in x for x in adamw_table)
    assert adamw["flops"]["hlo_per_step"] == f["model_per_step"] + 6 * 16 * (112 - 97) * 32
    assert insp.count_dots(hlo.read_text()) == on["dots"]  # --hlo-out wrote the HLO that was analyzed
    assert any(line.startswith("fp8") for line in table)
    off, _ = _run(capsys, tmp_path, FP8Config(enabled=False))
    assert off["dots"]["fp8"] == 0 and off["dots"]["total"] == on["dots"]["total"]


def test_analyze_user_errors(capsys):
    assert insp.main(["--stage", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --stage 5 is out of range") and len(err.splitlines()) == 1
    assert insp.main(["model.attention=cudnn"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("bad,needle", [("kept.hlo", "already exists"), ("folder", "already exists"),
                                        ("kept.hlo/x.hlo", "is a file")])
def test_hlo_out_that_exists_or_cannot_be_written_is_one_line_and_left_alone(capsys, tmp_path, bad, needle):
    cfg = dataclasses.replace(micro_config(), fp8=FP8Config(enabled=False))
    path = tmp_path / "micro.yaml"
    path.write_text(to_yaml(cfg))
    (tmp_path / "kept.hlo").write_text("keep me")
    (tmp_path / "folder").mkdir()
    assert insp.main(["--config", str(path), "curriculum.0.seq_len=8", "curriculum.0.batch_size=1",
                      "--hlo-out", str(tmp_path / bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --hlo-out") and needle in err and err.count("\n") == 1, err
    assert (tmp_path / "kept.hlo").read_text() == "keep me"


def test_old_command_name_points_to_the_new_one(capsys):
    from yxanul_jax import cli

    assert cli.main(["inspect", "--config", "configs/tiny.yaml"]) == 2
    assert "'inspect' is now 'analyze'" in capsys.readouterr().err


def test_a_package_file_run_as_a_script_does_not_shadow_the_standard_library():
    import subprocess
    import sys

    from conftest import REPO
    proc = subprocess.run([sys.executable, "yxanul_jax/plan.py", "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]
