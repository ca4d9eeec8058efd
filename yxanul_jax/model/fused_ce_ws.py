"""The fused loss's training forward as a warp-specialized Mosaic GPU kernel (Hopper): lse and softmax @ w with
one warpgroup's GEMMs running under the other's exps.

    lse2_T, a_TxK = forward_dx(x_TxK, w_VxK, v_real)     # on an sm_90 GPU (or interpret=True on a CPU)

The same outputs as `model.fused_ce`'s Triton training forward (`fused_ce_fwd_dx`): lse2 = logsumexp over the first
v_real rows of w of x . w, in base 2 (lse / ln 2), and a = softmax @ w in float32, the input gradient's softmax
part. Chosen by the tile spec `dx=128x128s2:mosaic` (`core.tiles`, `train.fused_ce_tiles`); the CPU keeps the
Triton kernels in interpret mode.

Why: Triton issues a tile's two GEMMs and its exps from one instruction stream. Its census (`analysis.kernel_census`)
leaves the tensor cores ~350 of each tile's 2,400 clocks idle, while the loop stores the carried operands and
waits for the accumulating GEMM. Here, as in FlashAttention-3, each program (128 rows of x) has three warpgroups:
  * a producer (`_producer`, few registers) streams blocks of w through a ring of `stages` shared-memory slots
    with TMA, each slot freed by both consumers (`w_free`);
  * two consumers (`_consumer`, 64 rows of x each) walk the vocabulary with flash attention's online max: the
    logits GEMM x @ w_j^T, the tile's max, exps and sum, then the accumulating GEMM softmax @ w_j from the same
    slot (w is both keys and values, so one load serves both GEMMs).
A schedule barrier (`sched`) makes the two consumers take turns: one's two GEMMs run while the other forms its
exps, so by the census the tensor cores wait only for the few instructions between one consumer's GEMMs
(`kernel_census.pingpong_cycles`).

The online max (not the Triton kernel's anchor) costs a max, a rescale and one more exp per row per tile. Those
run in the exps' turn, under the other consumer's GEMMs. It needs no fallback walk: no sum can overflow.

`interpret=True` runs the kernel in Pallas's GPU interpret mode on a CPU (threads, barriers and TMA simulated):
how the tests check it against float32. That mode cannot transpose a wgmma operand or run `run_state`, so there
the logits come from a plain dot and softmax @ w from a fresh accumulator added to the carried one: the same
arithmetic, in a different order of float32 additions. Everything else (the ring, its barriers, the turns, the
online max and the padded-vocabulary mask) is the code the GPU runs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from yxanul_jax.core.tiles import MOSAIC_WIDTHS

NAME = "fused_ce_fwd_dx_ws"  # the kernel's body: its name in the HLO's op_name and in the PTX the plugin writes
LOG2E = 1.4426950408889634
CONSUMERS = 2  # warpgroups that compute; one more loads
PRODUCER_REGISTERS = 40  # per thread, released to the consumers (`setmaxnreg`)
CONSUMER_REGISTERS = 232


def forward_dx(x_TxK, w_VxK, v_real: int, *, bt: int = 128, bv: int = 128, stages: int = 2,
               interpret: bool = False):
    """(lse2 [T], a [T, K]) in float32 (module docstring). T must be a multiple of bt (= 2 x 64: two consumers
    of 64 rows), V of bv (64 or 128); K in `core.tiles.MOSAIC_WIDTHS`."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    T, K = x_TxK.shape
    V = w_VxK.shape[0]
    rows = bt // CONSUMERS
    if rows != 64 or bv not in (64, 128) or K not in MOSAIC_WIDTHS or T % bt or V % bv or not 0 < v_real <= V:
        raise ValueError(f"fused_ce_ws takes bt 128, bv 64 or 128, K in {MOSAIC_WIDTHS}, T a multiple of bt and V of bv; "
                         f"got bt {bt}, bv {bv}, x {x_TxK.shape}, w {w_VxK.shape}, v_real {v_real}")
    full, partial = v_real // bv, v_real % bv != 0
    blocks = full + int(partial)  # blocks of padded rows alone are never loaded
    stages = max(1, min(stages, blocks))
    dtype = x_TxK.dtype
    wgmma_layout = plgpu.Layout.WGMMA

    def lay(v, layout):  # GPU interpret mode has no layouts
        return v if interpret else plgpu.layout_cast(v, layout)

    def kernel(x_ref, w_ref, a_ref, lse_ref, scoped):
        (x_smem2, w_smem, p_smem2, a_smem2, lse_smem2), x_ready, w_ready, w_free, sched = scoped
        wg = lax.axis_index("wg")

        def take_turn():  # the consumers alternate between the barrier's phases
            plgpu.barrier_arrive(sched)
            plgpu.barrier_wait(sched)

        @pl.when(wg < CONSUMERS)
        def _consumer():
            plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
            x_smem, p_smem, a_smem, lse_smem = (b.at[wg] for b in (x_smem2, p_smem2, a_smem2, lse_smem2))
            mine = pl.ds(lax.axis_index("rows") * bt + wg * rows, rows)
            plgpu.copy_gmem_to_smem(x_ref.at[mine], x_smem, x_ready.at[wg])
            plgpu.barrier_wait(x_ready.at[wg])
            pl.when(wg == 1)(take_turn)  # consumer 0 goes first

            def logits(slot):
                if interpret:  # no transposed wgmma operand there
                    s = lax.dot_general(x_smem[...], w_smem.at[slot][...], (((1,), (1,)), ((), ())),
                                        preferred_element_type=jnp.float32)
                    take_turn()
                    return s

                def gemm(s_ref):
                    plgpu.wgmma(s_ref, x_smem, plgpu.transpose_ref(w_smem.at[slot], (1, 0)))
                    take_turn()  # the other consumer's GEMMs go next, under this one's exps
                    return s_ref[...]
                return pl.run_scoped(gemm, plgpu.ACC((rows, bv), jnp.float32))

            def softmax_w(acc_RxK, slot):
                def gemm(acc_ref):
                    plgpu.wgmma(acc_ref, p_smem, w_smem.at[slot])
                if interpret:  # no run_state there: a fresh accumulator, added
                    def fresh(acc_ref):
                        gemm(acc_ref)
                        return acc_ref[...]
                    return acc_RxK + pl.run_scoped(fresh, plgpu.ACC((rows, K), jnp.float32))
                return pl.run_state(gemm)(plgpu.ACC.init(acc_RxK))  # waits for the GEMM

            def step(j, carry, masked: bool):
                acc_RxK, m_R, l_R = carry  # base 2: the running max and the sum of exps below it
                slot = lax.rem(j, stages)
                plgpu.barrier_wait(w_ready.at[slot])
                s_RxN = logits(slot)
                if masked:  # the one block that straddles v_real
                    cols = lay(lax.broadcasted_iota(jnp.int32, (rows, bv), 1), wgmma_layout)
                    s_RxN = jnp.where(cols < v_real - j * bv, s_RxN, -jnp.inf)
                m_new = jnp.maximum(m_R, s_RxN.max(axis=1) * LOG2E)
                alpha = jnp.exp2(m_R - m_new)
                p_RxN = jnp.exp2(s_RxN * LOG2E - lax.broadcast_in_dim(m_new, s_RxN.shape, [0]))
                l_R = l_R * alpha + p_RxN.sum(axis=1)
                acc_RxK = acc_RxK * lax.broadcast_in_dim(alpha, acc_RxK.shape, [0])
                p_smem[...] = p_RxN.astype(dtype)
                plgpu.commit_smem()  # visible to the tensor cores
                take_turn()  # wait for the tensor cores' turn
                acc_RxK = softmax_w(acc_RxK, slot)
                plgpu.barrier_arrive(w_free.at[slot])
                return acc_RxK, m_new, l_R

            carry = (lay(jnp.zeros((rows, K), jnp.float32), wgmma_layout),
                     lay(jnp.full((rows,), -jnp.inf, jnp.float32), wgmma_layout.reduce(1)),
                     lay(jnp.zeros((rows,), jnp.float32), wgmma_layout.reduce(1)))
            carry = lax.fori_loop(0, full, lambda j, c: step(j, c, False), carry)
            if partial:
                carry = step(full, carry, True)
            acc_RxK, m_R, l_R = carry
            pl.when(wg == 0)(take_turn)  # both consumers have taken as many turns
            a_smem[...] = acc_RxK / lax.broadcast_in_dim(l_R, acc_RxK.shape, [0])
            lse_smem[...] = m_R + jnp.log2(l_R)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(a_smem, a_ref.at[mine])
            plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[mine])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == CONSUMERS)
        def _producer():
            plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
            for j in range(stages):
                plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(j * bv, bv)], w_smem.at[j], w_ready.at[j])

            @pl.loop(stages, blocks)
            def _(j):
                slot = lax.rem(j, stages)
                plgpu.barrier_wait(w_free.at[slot])  # both consumers are done with block j - stages
                plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(j * bv, bv)], w_smem.at[slot], w_ready.at[slot])

            for j in range(blocks - stages, blocks):  # every release observed before the barriers go
                plgpu.barrier_wait(w_free.at[j % stages])

    def body(x_ref, w_ref, a_ref, lse_ref):
        swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        smem = (plgpu.SMEM((CONSUMERS, rows, K), dtype, transforms=swizzled),
                plgpu.SMEM((stages, bv, K), dtype, transforms=swizzled),
                plgpu.SMEM((CONSUMERS, rows, bv), dtype, transforms=swizzled),
                plgpu.SMEM((CONSUMERS, rows, K), jnp.float32),
                plgpu.SMEM((CONSUMERS, rows), jnp.float32))
        pl.run_scoped(lambda *scoped: kernel(x_ref, w_ref, a_ref, lse_ref, scoped), smem,
                      plgpu.Barrier(num_barriers=CONSUMERS),
                      plgpu.Barrier(num_barriers=stages),
                      plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=stages),
                      plgpu.Barrier(num_arrivals=CONSUMERS),
                      collective_axes="wg")

    extra = {}
    if interpret:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
        extra["interpret"] = InterpretGPUParams()
    body.__name__ = NAME
    with jax.named_scope(NAME):  # the performance model finds the kernel by this name
        a_TxK, lse2_T = plgpu.kernel(
            body, out_type=(jax.ShapeDtypeStruct((T, K), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.float32)),
            grid=(T // bt,), grid_names=("rows",), num_threads=CONSUMERS + 1, thread_name="wg",
            compiler_params=plgpu.CompilerParams(approx_math=True), **extra)(x_TxK, w_VxK)
    return lse2_T, a_TxK


def reference(x_TxK, w_VxK, v_real: int):
    """(lse2, a) in float32 from all logits at once: what `forward_dx` computes."""
    logits = x_TxK.astype(jnp.float32) @ w_VxK[:v_real].astype(jnp.float32).T
    return jax.nn.logsumexp(logits, axis=1) * LOG2E, jax.nn.softmax(logits, axis=1) @ w_VxK[:v_real].astype(jnp.float32)
