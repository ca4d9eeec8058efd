"""The performance model (`analysis.perf`) on small hand-written HLO: trip counts, FLOPs, bytes, rates,
categories; then the GPU table it shares with `plan`. The sm_90 compile of a real step is in
tests/test_gpu_target.py (the tiny stage's H100 compile, predicted beside BF16)."""
import json
import math

import pytest

from conftest import REPO
from yxanul_jax.analysis import gpus, perf

H100 = gpus.GPUS["h100"]

# A 1024 x 768 @ 768 x 2048 GEMM (a Triton GEMM fusion) inside a loop of 28, inside a loop of 3.
NESTED = """
HloModule m, is_scheduled=true

%gemm (a: bf16[1024,768], b: bf16[768,2048]) -> bf16[1024,2048] {
  %a = bf16[1024,768]{1,0} parameter(0)
  %b = bf16[768,2048]{1,0} parameter(1)
  ROOT %d = bf16[1024,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%inner_body (t: (s32[], bf16[1024,768], bf16[768,2048])) -> (s32[], bf16[1024,768], bf16[768,2048]) {
  %t = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[1024,768]{1,0} get-tuple-element(%t), index=1
  %w = bf16[768,2048]{1,0} get-tuple-element(%t), index=2
  %y = bf16[1024,2048]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm, metadata={op_name="jit(f)/layers/mlp/up/gemm/dot_general"}, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  ROOT %r = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) tuple(%i, %x, %w)
}

%inner_cond (t: (s32[], bf16[1024,768], bf16[768,2048])) -> pred[] {
  %t = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(28)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%outer_body (t: (s32[], bf16[1024,768], bf16[768,2048])) -> (s32[], bf16[1024,768], bf16[768,2048]) {
  %t = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) parameter(0)
  ROOT %w = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) while(%t), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"28"}}
}

%outer_cond (t: (s32[], bf16[1024,768], bf16[768,2048])) -> pred[] {
  %t = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (t: (s32[], bf16[1024,768], bf16[768,2048])) -> (s32[], bf16[1024,768], bf16[768,2048]) {
  %t = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) parameter(0)
  ROOT %w = (s32[], bf16[1024,768]{1,0}, bf16[768,2048]{1,0}) while(%t), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
}
"""

GEMM_FLOPS = 2 * 1024 * 768 * 2048


def _by_name(text):
    return {k.name: k for k in perf.kernels(text)}


def test_a_dot_in_a_loop_of_28_counts_28_times_and_nested_loops_multiply():
    ks = _by_name(NESTED)
    y = ks["y"]
    assert y.runs == 3 * 28 and y.flops == GEMM_FLOPS and y.precision == "bf16" and y.category == "GEMM bf16"
    assert perf.hlo_flops(NESTED) == 3 * 28 * GEMM_FLOPS  # the loop bodies' compares are no GEMMs
    single = NESTED.replace('"n":"3"', '"n":"1"')
    assert perf.hlo_flops(single) == 28 * GEMM_FLOPS


def test_fp8_gemm_runs_at_twice_the_bf16_rate():
    big = NESTED.replace("1024", "4096").replace("768", "4096").replace("2048", "4096")  # compute-bound in FP8 too
    fp8 = big.replace("bf16[4096,4096]{1,0} parameter", "f8e4m3fn[4096,4096]{1,0} parameter")
    kbf, kf8 = _by_name(big)["y"], _by_name(fp8)["y"]
    assert kf8.precision == "fp8" and kbf.precision == "bf16" and kf8.flops == kbf.flops == 2 * 4096 ** 3
    (tb, bound), (tf, bound8) = perf.kernel_time(kbf, H100), perf.kernel_time(kf8, H100)
    assert bound == bound8 == "compute"
    waves = 1024 / (8 * 132)  # 32 x 32 output tiles of 128 x 128 on 132 SMs: 8 waves, the last one partly idle
    assert perf.wave_efficiency(kbf, H100) == pytest.approx(waves)
    assert tb == pytest.approx(kbf.flops / (H100.rate("bf16") * perf.GEMM_EFFICIENCY * waves) + perf.LAUNCH_S)
    assert (tf - perf.LAUNCH_S) == pytest.approx((tb - perf.LAUNCH_S) / 2, rel=1e-4)  # 1978.9 vs 989.4 TFLOP/s
    k32 = _by_name(big.replace("bf16", "f32"))["y"]  # float32 operands: TF32 tensor cores (XLA's default precision)
    assert k32.precision == "tf32" and (perf.kernel_time(k32, H100)[0] - perf.LAUNCH_S) == pytest.approx(
        2 * (tb - perf.LAUNCH_S))


# An elementwise fusion over a [64, 2048, 768] bf16 tensor (read one, write one) and a dynamic slice of
# one layer out of a loop-carried [28, 64, 2048, 768] stack, and an in-place update of one layer.
STACK = """
HloModule m, is_scheduled=true

%add (a: bf16[64,2048,768], b: bf16[64,2048,768]) -> bf16[64,2048,768] {
  %a = bf16[64,2048,768]{2,1,0} parameter(0)
  %b = bf16[64,2048,768]{2,1,0} parameter(1)
  %s = bf16[64,2048,768]{2,1,0} add(%a, %a)
  ROOT %m = bf16[64,2048,768]{2,1,0} multiply(%s, %b)
}

%slice_layer (stack: bf16[28,64,2048,768], i: s32[]) -> bf16[64,2048,768] {
  %stack = bf16[28,64,2048,768]{3,2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,64,2048,768]{3,2,1,0} dynamic-slice(%stack, %i, %z, %z, %z), dynamic_slice_sizes={1,64,2048,768}
  ROOT %r = bf16[64,2048,768]{2,1,0} bitcast(%ds)
}

%put_layer (stack: bf16[28,64,2048,768], x: bf16[64,2048,768], i: s32[]) -> bf16[28,64,2048,768] {
  %stack = bf16[28,64,2048,768]{3,2,1,0} parameter(0)
  %x = bf16[64,2048,768]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %x1 = bf16[1,64,2048,768]{3,2,1,0} bitcast(%x)
  ROOT %u = bf16[28,64,2048,768]{3,2,1,0} dynamic-update-slice(%stack, %x1, %i, %z, %z, %z)
}

ENTRY %main (stack: bf16[28,64,2048,768], x: bf16[64,2048,768], i: s32[]) -> bf16[28,64,2048,768] {
  %stack = bf16[28,64,2048,768]{3,2,1,0} parameter(0)
  %x = bf16[64,2048,768]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %layer = bf16[64,2048,768]{2,1,0} fusion(%stack, %i), kind=kLoop, calls=%slice_layer
  %e = bf16[64,2048,768]{2,1,0} fusion(%layer, %x), kind=kLoop, calls=%add, metadata={op_name="jit(f)/layers/mlp/mul"}
  ROOT %new = bf16[28,64,2048,768]{3,2,1,0} fusion(%stack, %e, %i), kind=kLoop, calls=%put_layer
}
"""

LAYER = 64 * 2048 * 768 * 2  # bytes of one bf16 layer activation


def test_bandwidth_bound_fusion_is_charged_by_its_bytes():
    e = _by_name(STACK)["e"]
    assert e.flops == 0 and e.bytes == 3 * LAYER and e.category == "norms + elementwise"
    t, bound = perf.kernel_time(e, H100)
    assert bound == "memory" and t == pytest.approx(3 * LAYER / (H100.hbm_bytes_per_s * perf.HBM_EFFICIENCY) + perf.LAUNCH_S)


def test_a_slice_of_a_loop_carried_buffer_is_charged_the_slice():
    ks = _by_name(STACK)
    assert ks["layer"].bytes == 2 * LAYER + 4  # one layer read, one written (and the index), not 28
    assert ks["new"].bytes == 2 * LAYER + 4  # updated in place: the update is read and written
    assert ks["layer"].category == ks["new"].category == "copies"


# The chunked loss's target logit: a gather out of the BF16 logits, converted to float32 first, in a fusion that
# sums the tokens' losses: the fusion reads the 4 gathered logits, not the [4 x 50,000] tile (a reduce over the whole
# tile, the other fusion, reads all of it).
GATHER = """
HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%pick (logits: bf16[4,50000], idx: s32[4,2]) -> f32[] {
  %logits = bf16[4,50000]{1,0} parameter(0)
  %idx = s32[4,2]{1,0} parameter(1)
  %f = f32[4,50000]{1,0} convert(%logits)
  %g = f32[4]{0} gather(%f, %idx), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%g, %z), dimensions={0}, to_apply=%add
}

%whole (logits: bf16[4,50000]) -> f32[4] {
  %logits = bf16[4,50000]{1,0} parameter(0)
  %f = f32[4,50000]{1,0} convert(%logits)
  %z = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%f, %z), dimensions={1}, to_apply=%add
}

ENTRY %main (logits: bf16[4,50000], idx: s32[4,2]) -> (f32[], f32[4]) {
  %logits = bf16[4,50000]{1,0} parameter(0)
  %idx = s32[4,2]{1,0} parameter(1)
  %picked = f32[] fusion(%logits, %idx), kind=kInput, calls=%pick
  %sums = f32[4]{0} fusion(%logits), kind=kInput, calls=%whole
  ROOT %t = (f32[], f32[4]) tuple(%picked, %sums)
}
"""


def test_a_gather_through_a_conversion_is_charged_the_gathered_elements():
    ks = _by_name(GATHER)
    assert ks["picked"].bytes == 4 * 2 + 4 * 2 * 4 + 4  # 4 BF16 logits (read as such), the [4, 2] indices, the sum
    assert ks["sums"].bytes == 4 * 50000 * 2 + 4 * 4  # a reduction reads the whole tile


# The same update as XLA of jax 0.11 schedules it: an asynchronous fusion, one kernel from start to done.
ASYNC_STACK = STACK.replace(
    "  ROOT %new = bf16[28,64,2048,768]{3,2,1,0} fusion(%stack, %e, %i), kind=kLoop, calls=%put_layer",
    "  %new = ((bf16[28,64,2048,768]{3,2,1,0}, bf16[64,2048,768]{2,1,0}, s32[]), bf16[28,64,2048,768]{3,2,1,0}, "
    "u32[]) fusion-start(%stack, %e, %i), kind=kLoop, calls=%put_layer\n"
    "  ROOT %done = bf16[28,64,2048,768]{3,2,1,0} fusion-done(%new)")


def test_an_asynchronous_fusion_is_one_kernel_charged_at_its_start():
    ks = _by_name(ASYNC_STACK)
    assert "done" not in ks  # fusion-done launches nothing
    assert ks["new"].bytes == 2 * LAYER + 4 and ks["new"].category == "copies"  # in place, as the plain fusion


# XLA's dynamic-slice fusion (jax 0.11): a cuBLAS GEMM reading a layer of a stacked buffer and writing its
# weight gradient into a stack in place, launched (and traced) as the GEMM.
SLICED_GEMM = """
HloModule m, is_scheduled=true

%dsf (p0: bf16[28,2048,768], p1: s32[], p2: bf16[2048,1024], p3: f32[28,768,1024]) -> (f32[28,768,1024], s8[33554432]) {
  %p0 = bf16[28,2048,768]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,2048,768]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,2048,768}
  %x = bf16[2048,768]{1,0} bitcast(%ds)
  %p2 = bf16[2048,1024]{1,0} parameter(2)
  %gemm = (f32[768,1024]{1,0}, s8[33554432]{0}) custom-call(%x, %p2), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(f)/transpose(jvp(f))/layers/mlp/up/gemm/bf16_wgrad/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["0"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %w = f32[768,1024]{1,0} get-tuple-element(%gemm), index=0
  %w1 = f32[1,768,1024]{2,1,0} bitcast(%w)
  %p3 = f32[28,768,1024]{2,1,0} parameter(3)
  %u = f32[28,768,1024]{2,1,0} dynamic-update-slice(%p3, %w1, %p1, %z, %z)
  %ws = s8[33554432]{0} get-tuple-element(%gemm), index=1
  ROOT %t = (f32[28,768,1024]{2,1,0}, s8[33554432]{0}) tuple(%u, %ws)
}

ENTRY %main (x: bf16[28,2048,768], i: s32[], g: bf16[2048,1024], dw: f32[28,768,1024]) -> (f32[28,768,1024], s8[33554432]) {
  %x = bf16[28,2048,768]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %g = bf16[2048,1024]{1,0} parameter(2)
  %dw = f32[28,768,1024]{2,1,0} parameter(3)
  ROOT %dynamic_slice_fusion = (f32[28,768,1024]{2,1,0}, s8[33554432]{0}) fusion(%x, %i, %g, %dw), kind=kCustom, calls=%dsf, backend_config={"fusion_backend_config":{"custom_fusion_config":{"kernel_index":0,"name":"dynamic_slice_fusion"},"kind":"__custom_fusion"}}
}
"""


def test_a_dynamic_slice_fusion_is_its_cublas_gemm():
    (k,) = perf.kernels(SLICED_GEMM)
    assert k.name == "gemm"  # the name its kernel carries in a trace
    assert k.flops == 2 * 768 * 1024 * 2048 and k.precision == "bf16" and k.category == "GEMM bf16"
    # one layer's slice and the gradient read, the layer's weight gradient written in place; no workspace
    assert k.bytes == 2 * 2048 * 768 + 4 + 2 * 2048 * 1024 + 4 * 768 * 1024


# A conditional of two branches, as `lax.platform_dependent` leaves it when XLA does not fold it: the
# taken branch is a small elementwise kernel, the other a large one.
BRANCHES = """
HloModule m, is_scheduled=true

%small (a: bf16[1024,768]) -> bf16[1024,768] {
  %a = bf16[1024,768]{1,0} parameter(0)
  ROOT %m = bf16[1024,768]{1,0} multiply(%a, %a)
}

%large (a: bf16[1024,768]) -> bf16[1024,768] {
  %a = bf16[1024,768]{1,0} parameter(0)
  %b = bf16[64,1024,768]{2,1,0} broadcast(%a), dimensions={1,2}
  ROOT %r = bf16[1024,768]{1,0} slice(%b), slice={[0:1], [0:1024], [0:768]}
}

%branch_0 (a: bf16[1024,768]) -> bf16[1024,768] {
  %a = bf16[1024,768]{1,0} parameter(0)
  ROOT %taken = bf16[1024,768]{1,0} fusion(%a), kind=kLoop, calls=%small
}

%branch_1 (a: bf16[1024,768]) -> bf16[1024,768] {
  %a = bf16[1024,768]{1,0} parameter(0)
  ROOT %other = bf16[1024,768]{1,0} fusion(%a), kind=kLoop, calls=%large
}

ENTRY %main (a: bf16[1024,768]) -> bf16[1024,768] {
  %a = bf16[1024,768]{1,0} parameter(0)
  %index = s32[] constant(0)
  ROOT %c = bf16[1024,768]{1,0} conditional(%index, %a, %a), branch_computations={%branch_0, %branch_1}
}
"""


LARGE_BRANCH = """  ROOT %other = bf16[1024,768]{1,0} fusion(%a), kind=kLoop, calls=%large
}"""
LOOPED_BRANCH = """  %t = (bf16[1024,768]{1,0}) tuple(%a)
  %w = (bf16[1024,768]{1,0}) while(%t), condition=%large_cond, body=%large_body, backend_config={"known_trip_count":{"n":"28"}}
  ROOT %g = bf16[1024,768]{1,0} get-tuple-element(%w), index=0
}

%large_body (t: (bf16[1024,768])) -> (bf16[1024,768]) {
  %t = (bf16[1024,768]{1,0}) parameter(0)
  %a = bf16[1024,768]{1,0} get-tuple-element(%t), index=0
  %other = bf16[1024,768]{1,0} fusion(%a), kind=kLoop, calls=%large
  ROOT %r = (bf16[1024,768]{1,0}) tuple(%other)
}

%large_cond (t: (bf16[1024,768])) -> pred[] {
  %t = (bf16[1024,768]{1,0}) parameter(0)
  ROOT %p = pred[] constant(false)
}"""


def test_a_constant_conditional_charges_only_the_branch_it_takes():
    ks = _by_name(BRANCHES)
    assert ks["taken"].runs == 1 and "other" not in ks
    for index, kept in (("1", "other"), ("7", "other")):  # an index out of range takes the last branch
        assert set(_by_name(BRANCHES.replace("constant(0)", f"constant({index})"))) == {kept}
    unknown = BRANCHES.replace("%index = s32[] constant(0)", "%index = s32[] parameter(1)").replace(
        "ENTRY %main (a: bf16[1024,768])", "ENTRY %main (a: bf16[1024,768], i: s32[])")
    assert set(_by_name(unknown)) == {"taken", "other"}  # an index known only at run time: both may run
    # a loop inside the branch not taken runs 0 times too; a branch named twice is taken by either index
    looped = BRANCHES.replace(LARGE_BRANCH, LOOPED_BRANCH)
    assert "other" not in _by_name(looped)
    assert _by_name(looped.replace("constant(0)", "constant(1)"))["other"].runs == 28
    twice = BRANCHES.replace("branch_computations={%branch_0, %branch_1}",
                             "branch_computations={%branch_1, %branch_0, %branch_0}")
    assert set(_by_name(twice.replace("constant(0)", "constant(2)"))) == {"taken"}
    unknown_twice = twice.replace("%index = s32[] constant(0)", "%index = s32[] parameter(1)").replace(
        "ENTRY %main (a: bf16[1024,768])", "ENTRY %main (a: bf16[1024,768], i: s32[])")
    assert _by_name(unknown_twice)["taken"].runs == 1  # one conditional runs a branch once, however often listed
    pred = BRANCHES.replace("s32[] constant(0)", "pred[] constant(false)").replace(
        "branch_computations={%branch_0, %branch_1}", "true_computation=%branch_0, false_computation=%branch_1")
    assert set(_by_name(pred)) == {"other"}


# A cuDNN flash-attention forward and backward call (the operands as XLA's sm_90 HLO has them) and a
# cuBLAS GEMM custom call with its workspace.
CALLS = """
HloModule m, is_scheduled=true

ENTRY %main (q: bf16[4,2048,12,64], k: bf16[4,2048,2,64], v: bf16[4,2048,2,64], a: bf16[256,512], b: bf16[512,1024]) -> bf16[4,12,2048,64] {
  %q = bf16[4,2048,12,64]{3,2,1,0} parameter(0)
  %k = bf16[4,2048,2,64]{3,2,1,0} parameter(1)
  %v = bf16[4,2048,2,64]{3,2,1,0} parameter(2)
  %a = bf16[256,512]{1,0} parameter(3)
  %b = bf16[512,1024]{1,0} parameter(4)
  %fwd = (bf16[4,12,2048,64]{3,1,2,0}, f32[4,12,2048]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={bf16[4,2048,12,64]{3,2,1,0}, bf16[4,2048,2,64]{3,2,1,0}, bf16[4,2048,2,64]{3,2,1,0}}, metadata={op_name="jit(f)/layers/attn/attention_core/dot_product_attention_fwd"}, backend_config={"cudnn_fmha_backend_config": {"mask_type": "CAUSAL"}}
  %g = (bf16[256,1024]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %o = bf16[4,12,2048,64]{3,1,2,0} get-tuple-element(%fwd), index=0
}
"""


def test_cudnn_attention_counts_causal_tiles_and_custom_gemms_their_flops():
    ks = _by_name(CALLS)
    fwd = ks["fwd"]
    tiles = 32 * 33 // 2  # 2048 / 64 = 32 query tiles, causal: the lower triangle of 32 x 32 tiles
    assert fwd.category == "attention" and fwd.flops == 2 * 2 * 4 * 12 * tiles * 64 * 64 * 64
    half_square = 2 * 2 * 4 * 12 * 2048 * 2048 * 64 / 2  # QK^T and PV over half of the 2048 x 2048 scores
    assert fwd.flops / half_square == pytest.approx(33 / 32)  # the diagonal tiles are computed whole
    backward = CALLS.replace('"__cudnn$fmhaSoftmax"', '"__cudnn$fmhaSoftmaxBackward"')
    assert _by_name(backward)["fwd"].flops == pytest.approx(2.5 * fwd.flops)
    g = ks["g"]
    assert g.flops == 2 * 256 * 512 * 1024 and g.category == "GEMM bf16" and g.precision == "bf16"
    assert g.bytes == 2 * (256 * 512 + 512 * 1024 + 256 * 1024)  # its workspace (u8, s8 since jax 0.11): scratch
    # 2 x 8 output tiles on 132 SMs: a tenth of the rate, unless split-K fills them (K = 512: no split)
    assert perf.wave_efficiency(g, H100) == pytest.approx(16 / 132)


def _attention_call(B: int, L: int, phase: str) -> "perf.Kernel":
    """One causal cuDNN attention call of yxanul-197m's shape (12 heads, 2 kv heads, head_dim 64)."""
    target = "__cudnn$fmhaSoftmaxBackward" if phase == "backward" else "__cudnn$fmhaSoftmax"
    text = CALLS.replace("4,2048,", f"{B},{L},").replace("4,12,2048,", f"{B},12,{L},").replace(
        "f32[4,12,2048]", f"f32[{B},12,{L}]").replace('"__cudnn$fmhaSoftmax"', f'"{target}"')
    return _by_name(text)["fwd"]


def test_cudnn_attention_has_a_floor_per_work_item_fitted_to_the_h200():
    h200 = gpus.GPUS["h200"]

    def fwd_bwd_ms(B, L):
        fwd, bwd = _attention_call(B, L, "forward"), _attention_call(B, L, "backward")
        assert fwd.tiles == B * 12 and fwd.k == L  # work items: batch x heads x one 64-row query tile
        flops_only = sum(k.flops / (h200.rate("bf16") * perf.ATTENTION_EFFICIENCY[k.phase]) for k in (fwd, bwd))
        return 1e3 * (perf.kernel_time(fwd, h200)[0] + perf.kernel_time(bwd, h200)[0]), 1e3 * flops_only

    # The stage-0 profile's cuDNN kernels (H200, 2026-11-26): 1.78 ms forward + 2.76 backward per call at seq 8
    predicted, flops_only = fwd_bwd_ms(8192, 8)
    assert predicted == pytest.approx(1.78 + 2.76, rel=0.03)
    assert predicted > 4 * flops_only  # the floor, not the tile FLOPs, is what short rows cost
    # scripts/attention_check.py's wall times at seq 16-64, on the profile's scale (6.09 / 7.85 us at seq 8)
    scale = (1.78 + 2.76) / 5.85
    for B, L, wall in ((8192, 16, 6.45), (4096, 32, 4.18), (2048, 64, 2.89)):
        assert fwd_bwd_ms(B, L)[0] == pytest.approx(scale * wall, rel=0.03)
    # at 2,048 tokens both directions are bound by their tile FLOPs (the floor is a lower bound there)
    for phase in ("forward", "backward"):
        k = _attention_call(64, 2048, phase)
        assert perf.attention_floor_s(k, h200) <= k.flops / (h200.rate("bf16") * perf.ATTENTION_EFFICIENCY[phase]) * 1.05


def test_predict_sums_categories_and_reports_mfu():
    items = perf.kernels(NESTED) + perf.kernels(STACK)
    p = perf.predict(items, H100, model_flops=1e12, tokens=1000)
    assert p["predicted_step_ms"] == pytest.approx(sum(c["ms"] for c in p["categories"].values()))
    assert p["predicted_step_ms"] == pytest.approx(sum(1e3 * perf.kernel_time(k, H100)[0] * k.runs for k in items))
    assert p["predicted_mfu"] == pytest.approx(1e12 / (p["predicted_step_ms"] / 1e3) / H100.peak_bf16)
    assert p["predicted_tokens_per_s"] == pytest.approx(1000 / (p["predicted_step_ms"] / 1e3))
    assert math.isclose(sum(c["share"] for c in p["categories"].values()), 1.0)
    assert p["top_kernels"][0]["name"] == "y" and p["top_kernels"][0]["runs"] == 84
    table = perf.format_prediction(p)
    assert "GEMM bf16" in table and "a prediction, not a measurement" in table
    both = perf.format_prediction(p, perf.predict(perf.kernels(NESTED), H100), ("a", "b"))
    assert "B - A" in both and "copies" in both


def test_attention_in_xla_kernels_is_calibrated_apart_from_cudnn_and_its_gemms_apart_from_its_fusions():
    cudnn = _by_name(CALLS)["fwd"]
    xla = perf.Kernel("s", "fusion", "kInput", 28, 0.0, 1e8, None, "attention", "layers/attn/attention_core/reduce_sum")
    gemm = perf.Kernel("g", "custom-call", "", 28, 6e9, 3e8, "bf16", "attention",
                       "layers/attn/attention_core/dot_general")
    assert perf.calibration_key(cudnn) == "attention" and perf.calibration_key(xla) == perf.ATTENTION_XLA
    assert perf.calibration_key(gemm) == perf.ATTENTION_XLA_GEMM
    calibration = {"ratios": {"attention": 2.0, perf.ATTENTION_XLA: 5.0, perf.ATTENTION_XLA_GEMM: 1.5}}
    for k, ratio in ((cudnn, 2.0), (xla, 5.0), (gemm, 1.5)):
        plain = perf.predict([k], H100)["categories"]["attention"]["ms"]  # all still report as attention
        assert perf.predict([k], H100, calibration=calibration)["categories"]["attention"]["ms"] == pytest.approx(
            ratio * plain)
    ratios = perf.category_ratios([cudnn, xla, gemm], H100, {"fwd": 1.0, "s": 2.0, "g": 3.0})
    assert set(ratios) == {"attention", perf.ATTENTION_XLA, perf.ATTENTION_XLA_GEMM}
    assert ratios[perf.ATTENTION_XLA]["measured_ms"] == 2.0 and ratios[perf.ATTENTION_XLA_GEMM]["measured_ms"] == 3.0


def test_timed_fused_ce_kernels_take_their_own_ratio_not_the_category_ratio_of_the_guessed_rate():
    # The category's ratio was measured against FUSED_CE_EFFICIENCY's guess; a kernel charged at an H200-timed rate
    # must not be multiplied by that guess's error again (it takes FUSED_CE_TIMED: 1.0 where absent).
    timed = perf.Kernel("f", "custom-call", "mosaic_gpu_v2", 2, 6.7e12, 1e9, "fused_ce", "output head + loss",
                        "loss/fused_ce_dw_ws/fused_ce_dw_ws/mpmd_map")
    around = perf.Kernel("t", "fusion", "kLoop", 2, 0.0, 1e8, None, "output head + loss", "loss/gather")
    assert perf.calibration_key(timed) == perf.FUSED_CE_TIMED
    assert perf.calibration_key(around) == "output head + loss"
    plain = {k.name: perf.predict([k], H100)["predicted_step_ms"] for k in (timed, around)}
    old = {"ratios": {"output head + loss": 2.0}}
    assert perf.predict([timed], H100, calibration=old)["predicted_step_ms"] == pytest.approx(plain["f"])
    assert perf.predict([around], H100, calibration=old)["predicted_step_ms"] == pytest.approx(2.0 * plain["t"])
    both = {"ratios": {"output head + loss": 2.0, perf.FUSED_CE_TIMED: 1.5}}
    assert perf.predict([timed], H100, calibration=both)["predicted_step_ms"] == pytest.approx(1.5 * plain["f"])
    # The shipped H100 ratio, while it is the derived one (a profile may measure it later): how much longer the H100
    # took than the H200 over the head + loss kernels of the cells both profiled (its source names the files)
    h100 = perf.load_calibration("h100")
    if "how much longer the H100 took than the H200" in h100["source"]:
        def head_ms(path):
            return json.loads((REPO / path).read_text())["rows"][0]["category_ratios"]["output head + loss"][
                "measured_ms"]
        cells = [f"docs/bench/h100_2026-11-26/call1_s{s}_fp8.json" for s in (9, 0)], [
            f"docs/bench/h200_2026-11-26_night/calibrate/s{s}_fp8p/bench.json" for s in (9, 0)]
        assert h100["ratios"][perf.FUSED_CE_TIMED] == pytest.approx(
            sum(map(head_ms, cells[0])) / sum(map(head_ms, cells[1])))


def test_gpu_table_names_rates_and_device_kinds():
    assert gpus.lookup("4090").key == gpus.lookup("RTX 4090").key == "rtx4090"
    assert gpus.lookup("a100").key == "a100-80" and gpus.lookup("24") is None
    assert gpus.of_device_kind("NVIDIA H100 80GB HBM3").key == "h100"
    assert gpus.of_device_kind("NVIDIA H100 PCIe").key == "h100-pcie"
    assert gpus.of_device_kind("NVIDIA A100-SXM4-40GB").key == "a100-40"
    assert gpus.of_device_kind("NVIDIA A100-SXM4-80GB").key == "a100-80"
    assert gpus.of_device_kind("cpu") is None
    for spec in gpus.GPUS.values():  # every entry has its source, and its rates fall with precision
        assert spec.source and spec.memory_bytes > 0 and spec.hbm_bytes_per_s > 0
        assert spec.rate("fp8") >= spec.rate("bf16") >= spec.rate("tf32") >= spec.rate("f32") > 0
    assert gpus.GPUS["a100-80"].rate("fp8") == gpus.GPUS["a100-80"].rate("bf16")  # no FP8 tensor cores
