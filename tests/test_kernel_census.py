"""The SASS census of our Pallas kernels (analysis/kernel_census.py) on hand-written SASS in nvdisasm's form, and
the performance model's rate for the kernels (perf.fused_ce_efficiency: measured, the census only for a kernel
no GPU timed). The census of the real kernels, compiled for sm_90, is tests/test_gpu_target.py's."""
import json

import pytest

from yxanul_jax.analysis import kernel_census as kc
from yxanul_jax.analysis import perf

from conftest import REPO


def _sass(lines: list[str]) -> str:
    """A loop of `lines` in nvdisasm's form (addresses every 0x10, a label, a branch back), between two
    instructions outside it."""
    out = ["        .text.k:", "        /*0000*/                   MOV R1, c[0x0][0x28] ;", ".L_x_0:"]
    for i, text in enumerate(lines + ["@P0 BRA `(.L_x_0)"], start=1):
        out.append(f"        /*{16 * i:04x}*/                   {text} ;")
    out.append(f"        /*{16 * (len(lines) + 2):04x}*/                   EXIT ;")
    return "\n".join(out)


G1 = "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT, gsb0"  # logits: A from shared memory, 128 clocks at 8 warps
EXPS = [f"MUFU.EX2 R{40 + i}, R{24 + i}" for i in range(4)]  # 4 x 16 clocks of the special-function units
WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x0"


def test_a_gemm_that_reads_the_exps_waits_for_them():
    # softmax @ w: the exps packed to BF16 and read as the wgmma's A operand (R60..R63), so no overlap:
    # per iteration G1 (128) + the exps (4 x 16) + G2 (128) + 4 issue clocks between them
    body = ["WARPGROUP.ARRIVE", G1, WAIT, *EXPS, "F2FP.BF16.F32.PACK_AB R60, R41, R40", "WARPGROUP.ARRIVE",
            "HGMMA.64x128x16.F32.BF16 R88, R60, gdesc[UR16].tnspB, R88, gsb0", WAIT]
    loop = kc.inner_loop(_sass(body))
    assert loop.instructions == len(body) + 1 and loop.count("MUFU") == 4 and loop.count("HGMMA") == 2
    c = kc.tile_cycles(loop, warps=8)
    assert (c["tensor"], c["issue"], c["mufu"]) == (256, 2 * (len(body) + 1), 64)
    assert c["total"] == 328
    # the tensor cores idle 72 clocks an iteration: 2 before G1 (its arrive), 66 between (the exps, then the pack
    # and arrive), 4 after G2 (the wait and the branch)
    assert (c["idle_before"], c["idle_between"], c["idle_after"]) == (2, 66, 4)


def test_exps_issued_under_another_gemm_overlap_it():
    # the second GEMM reads other registers (another half's tile): the exps run while it does
    body = ["WARPGROUP.ARRIVE", G1, WAIT, "WARPGROUP.ARRIVE",
            "HGMMA.64x128x16.F32.BF16 R88, R100, gdesc[UR16].tnspB, R88, gsb0", *EXPS, WAIT]
    c = kc.tile_cycles(kc.inner_loop(_sass(body)), warps=8)
    assert c["tensor"] == 256 and c["total"] == 266  # the 64 clocks of exps hidden under the 128 of the GEMM
    assert c["idle_before"] + c["idle_between"] + c["idle_after"] == c["total"] - c["tensor"]
    assert c["idle_between"] == 4  # the wait's and the arrive's issue between the two GEMMs


def test_a_wait_that_allows_one_group_lets_the_older_gemm_run_on():
    # DEPBAR.LE gsb0, 0x1 waits for all but the newest committed group
    body = ["WARPGROUP.ARRIVE", G1, "WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], R88, gsb0",
            "WARPGROUP.DEPBAR.LE gsb0, 0x1", *EXPS, WAIT]
    c = kc.tile_cycles(kc.inner_loop(_sass(body)), warps=8)
    # the walk waits at 0x1 for G1 (done at 130) while the second runs to 258, the exps in its shadow
    assert c["total"] == 262


def _consumer(exps: int) -> list[str]:
    """One consumer warpgroup's iteration of a warp-specialized kernel: its logits GEMM, waited for, `exps` exps,
    the softmax packed and read by its second GEMM, waited for."""
    return ["WARPGROUP.ARRIVE", G1, WAIT, *[f"MUFU.EX2 R{40 + i}, R{24 + i}" for i in range(exps)],
            "F2FP.BF16.F32.PACK_AB R60, R41, R40", "WARPGROUP.ARRIVE",
            "HGMMA.64x128x16.F32.BF16 R88, R60, gdesc[UR16].tnspB, R88, gsb0", WAIT]


def test_consumers_taking_turns_at_the_tensor_cores():
    # one consumer (4 warps) alone: G1 64 clocks from clock 1, 4 exps (8 clocks each) after its wait, G2 from the
    # exps' end (98) to 162, its wait and the branch: 164 clocks, 1 idle before, 33 between, 2 after
    loop = kc.inner_loop(_sass(_consumer(4)))
    one = kc.tile_cycles(loop, warps=4)
    assert (one["tensor"], one["total"], one["idle_before"], one["idle_between"], one["idle_after"]) == (
        128, 164, 1, 33, 2)
    # two consumers: each one's turn (its GEMMs and the 3 clocks around them) in a row, the exps under the other's
    c = kc.pingpong_cycles(loop, consumers=2)
    assert (c["tensor"], c["total"], c["issue"], c["mufu"]) == (256, 262, 24, 64)
    assert (c["idle_before"], c["idle_between"], c["idle_after"]) == (2, 0, 4)
    assert kc.pingpong_cycles(loop, consumers=3)["total"] == 393
    # one consumer's own walk bounds the iteration where its exps outlast the other's turn (20 exps: 292 > 262)
    # and the shared special-function units where both consumers' exps outlast that (2 x 160 = 320 > 292)
    long = kc.inner_loop(_sass(_consumer(20)))
    assert kc.tile_cycles(long, warps=4)["total"] == 292
    assert kc.pingpong_cycles(long, consumers=2)["total"] == 320
    assert kc.pingpong_cycles(long, consumers=1)["total"] == 292


def test_loads_and_registers_read_from_sass():
    body = ["LDGSTS.E.BYPASS.128 [R5], desc[UR20][R12.64]", "@!P0 LDGSTS.E [R29], desc[UR20][R2.64]",
            "WARPGROUP.ARRIVE", G1, WAIT, *EXPS]
    loop = kc.inner_loop(_sass(body))
    assert kc.load_bytes(loop, warps=8) == (16 + 4) * 256  # a size-less LDGSTS.E copies 4 bytes a thread
    assert kc._registers("F2FP.BF16.F32.PACK_AB R120, R167, R164") == ("R120", {"R164", "R167"})
    assert kc._registers("HGMMA.64x128x16.F32.BF16 R24, R120, gdesc[UR8].tnspB, R24") == (
        None, {"R120", "R121", "R122", "R123"})
    assert kc._registers("STSM.16.M88.4 [R190+0x20000], R56") == (None, {"R190", "R56", "R57", "R58", "R59"})
    assert kc._registers("@!P0 MUFU.EX2 R86, R85") == ("R86", {"R85"})


def test_shared_memory_bytes_read_from_sass():
    # wgmma: B (k x n) always from shared memory, A (m x k) only as a descriptor (SS), per warpgroup; stores and loads
    # per lane at the opcode's width; matrix stores 128 bytes per 8 x 8 matrix and warp; cp.async and TMA copies
    body = ["WARPGROUP.ARRIVE", G1,  # SS: (64 x 16 + 16 x 128) x 2 bytes per warpgroup
            "HGMMA.64x128x16.F32.BF16 R88, R120, gdesc[UR12].tnspB, R88, gsb0",  # RS: B alone, 16 x 128 x 2
            "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24",  # FP8: a byte an element, (64 x 32 + 32 x 128)
            "HGMMA.64x8x16.F16 R2, gdesc[UR4], R2",  # one type field (F16 in and out): (64 x 16 + 16 x 8) x 2
            "IGMMA.64x64x32.S32.S8.S8 R8, gdesc[UR8], R8",  # int8: (64 x 32 + 32 x 64)
            "HGMMA.64x64x8.F32.TF32 R8, gdesc[UR8], R8",  # TF32: 4 bytes an element, (64 x 8 + 8 x 64) x 4
            WAIT, *EXPS, "STS [R153+0x800], R166", "STS.128 [R5], R8", "STS.U8 [R6], R9", "LDS.U.64 R22, [R21+0x18000]",
            "LDS.S16 R23, [R21]", "STSM.16.M88.4 [R190+0x20000], R56", "LDSM.16.MT88.2 R40, [R7]",
            "@!P0 LDGSTS.E.BYPASS.128 [R5], desc[UR20][R12.64]"]
    got = kc.smem_bytes(kc.inner_loop(_sass(body)), warps=8, copied=1000)
    wgmma = 2 * ((64 * 16 + 16 * 128) * 2 + 16 * 128 * 2 + (64 * 32 + 32 * 128) + (64 * 16 + 16 * 8) * 2
                 + (64 * 32 + 32 * 64) + (64 * 8 + 8 * 64) * 4)
    stores, loads, copies = (4 + 16 + 1) * 32 * 8 + 4 * 128 * 8, (8 + 2) * 32 * 8 + 2 * 128 * 8, 16 * 32 * 8 + 1000
    assert (got["wgmma"], got["stores"], got["loads"], got["copies"]) == (wgmma, stores, loads, copies)
    assert got["total"] == wgmma + stores + loads + copies


def test_an_mma_sync_counts_as_tensor_work():
    # Triton's fallback for a GEMM of fewer than 64 rows a warpgroup: m16n8k16 per warp, 8 warps
    body = ["WARPGROUP.ARRIVE", G1, WAIT, "HMMA.16816.F32.BF16 R120, R28, R96, R120", *EXPS]
    assert kc.tile_cycles(kc.inner_loop(_sass(body)), warps=8)["tensor"] == 128 + 2 * 16 * 8 * 16 * 8 / 4096


def test_sass_without_a_gemm_and_exp_loop_is_refused():
    with pytest.raises(ValueError, match="no loop with both HGMMA and MUFU"):
        kc.inner_loop(_sass(["FADD R1, R2, R3"]))


def test_the_model_charges_each_fused_kernel_at_its_measured_rate():
    # every kernel of today's code has a measured rate (an H200's timing of it): the census predicted the training
    # kernels ~2x too fast, so it is no longer the rate of a kernel a GPU has timed
    from yxanul_jax.model.fused_ce import KERNELS, TENSOR_SHARE

    assert set(TENSOR_SHARE) == set(KERNELS) == set(perf.FUSED_CE_MEASURED)
    for name in KERNELS:
        assert perf.fused_ce_efficiency(name) == perf.FUSED_CE_MEASURED[name]
    # the rates are the measurement's (fwd: one GEMM of 2 T K V; fwd+bwd: four), within its rounding
    record = json.loads((REPO / "docs/bench/h200_2026-11-28_fourteenth/fused_ce.json").read_text())
    of_peak = {(r["tiles"], r["mode"]): r["of_peak"] for r in record["timing"] if r["kernel"] == "fused"}
    mosaic = "dx=128x128s2:mosaic,dw=128x128s2:mosaic"
    assert perf.FUSED_CE_MEASURED["fused_ce_fwd"] == pytest.approx(of_peak[("default", "fwd")], abs=5e-4)
    for name, spec in (("fused_ce_fwd_dx", "default"), ("fused_ce_dw", "default"), ("fused_ce_fwd_dx_ws", mosaic),
                       ("fused_ce_dw_ws", mosaic)):  # that file's `default` ran the Triton training kernels
        assert perf.FUSED_CE_MEASURED[name] == pytest.approx(of_peak[(spec, "fwd+bwd")], abs=5e-4), name
    # a kernel no GPU timed (an older one, re-read from a stored HLO) is charged by its census share
    assert perf.fused_ce_efficiency("fused_ce_dx") == perf.FUSED_CE_EFFICIENCY
    assert perf.fused_ce_efficiency(None) == perf.FUSED_CE_EFFICIENCY
