"""The fused loss's training kernels as warp-specialized Mosaic GPU kernels (Hopper): one warpgroup's GEMMs run
under the other's exps.

    lse2_T, a_TxK = forward_dx(x_TxK, w_VxK, v_real)                               # the training forward
    dw_VxK = table_grad(x_TxK, w_VxK, targets_T, lse2_T, g_lse_T, g_tl_T, v_real)  # the table gradient

The same outputs as `model.fused_ce`'s Triton kernels `fused_ce_fwd_dx` and `fused_ce_dw`: lse2 = logsumexp over
the first v_real rows of w of x . w in base 2 (lse / ln 2), a = softmax @ w in float32 (the input gradient's softmax
part), and dw = dlogits^T @ x in float32 with dlogits = softmax x g_lse + onehot(target) x g_target. The default
training kernels on a Hopper GPU at head widths 64 and 128 (`core.tiles`: the default tiles' `auto`;
`dx=128x128s2:mosaic` asks outright), the Triton ones elsewhere; a CPU keeps the Triton kernels in interpret mode.

Why: Triton issues a tile's two GEMMs and its exps from one instruction stream. Its census
(`analysis.kernel_census`) leaves the tensor cores ~350 of each tile's 2,400 clocks idle, while the loop stores the
carried operands and waits for the accumulating GEMM. Here, as in FlashAttention-3, each program has three
warpgroups:
  * a producer (`_produce`, few registers) streams the walked blocks (of w for the forward, of x and its tokens'
    lse, gradients and targets for dw) through a ring of `stages` shared-memory slots with TMA; both consumers free
    each slot;
  * two consumers (64 rows each: of x for the forward, of w for dw) walk the other operand. Each block gets a
    first GEMM (the logits, or their transpose), its exps and then the accumulating GEMM from the same slot: w is
    both keys and values in the forward, x both in dw, so one load serves both GEMMs.
A schedule barrier (`_take_turn`) makes the two consumers take turns: one's two GEMMs run while the other forms its
exps, so by the census the tensor cores wait only for the few instructions between one consumer's GEMMs
(`kernel_census.pingpong_cycles`).

Two forms of the accumulating GEMM (`_accumulate`): the softmax (or dlogits) rounded to BF16 and stored to shared
memory for a GEMM of two shared-memory operands (the form an H200 checked and timed, 2026-11-28), or kept in registers
as the GEMM's left operand (`registers=True`, tiles `:mosaic-rs`: FlashAttention-3's RS form, as jax's Mosaic GPU
flash attention runs P @ V), which saves each consumer a 16 KB store, a fence and the tensor cores' re-read of it per
block, and the warpgroup barriers around it. That form also holds each consumer's own block (of x, or of w for dw)
in registers through the walk (`_held`: 32 a thread), the logits GEMM's left operand, so that both GEMMs read only
their right operand from shared memory. The census sees no difference in clocks (it does not charge shared memory);
what the loops move through it does (`kernel_census.smem_bytes`: 256 -> 160 KiB a 128 x 128 tile for the forward,
386 -> 290 for dw, where the shared memory gives 256 KiB in the census's 2,048 tensor clocks). A GPU decides.

The forward keeps flash attention's online max, not the Triton kernel's anchor. That costs a max, a rescale and one
more exp per row per block, in the exps' turn, under the other consumer's GEMMs. It needs no fallback walk: no sum
can overflow. dw uses the forward's lse, as the Triton dw does, and sums both parts of dlogits in float32 before the
one rounding to BF16 for its GEMM.

`interpret=True` runs the kernels in Pallas's GPU interpret mode on a CPU (threads, barriers and TMA simulated):
how the tests check them against float32. That mode cannot transpose a wgmma operand, run `run_state` or lay out
registers. So there both GEMMs are plain dots (the accumulating one's product added to the carried accumulator): the
same arithmetic, in a different order of float32 additions. Everything else is the code the GPU
runs: the ring, its barriers, the turns, the online max, the masks.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from yxanul_jax.core.tiles import MOSAIC_HELD, MOSAIC_MIN_STAGES, MOSAIC_WALKED, MOSAIC_WIDTHS
from yxanul_jax.model.fused_ce import LOG2E

FORWARD = "fused_ce_fwd_dx_ws"  # the kernels' bodies: their names in the HLO's op_name and the PTX the plugin writes
TABLE_GRAD = "fused_ce_dw_ws"
CONSUMERS = 2  # warpgroups that compute; one more loads
ROWS = MOSAIC_HELD // CONSUMERS  # a consumer's rows: one wgmma's M
PRODUCER_REGISTERS = 40  # per thread, released to the consumers (`setmaxnreg`)
CONSUMER_REGISTERS = 232


def _check(name, K, own, walked, own_n, walked_n):
    """ValueError unless a kernel's blocks fit: MOSAIC_HELD rows of its own operand per program, walked blocks in
    MOSAIC_WALKED, both operands whole blocks, K in MOSAIC_WIDTHS."""
    if (own != MOSAIC_HELD or walked not in MOSAIC_WALKED or K not in MOSAIC_WIDTHS
            or own_n % own or walked_n % walked):
        raise ValueError(f"{name} takes blocks of {MOSAIC_HELD} own rows and {MOSAIC_WALKED} walked ones, K in "
                         f"{MOSAIC_WIDTHS}, whole blocks of both; got {own} of {own_n} rows, {walked} of {walked_n}, "
                         f"K {K}")


def _ring(stages: int, blocks: int) -> int:
    """Slots of the ring: at least 2 (with one, consumer 1 frees a block only after its second GEMM, which waits for
    consumer 0's turn on the next block, which waits for that slot: a deadlock), at most the blocks."""
    return min(max(MOSAIC_MIN_STAGES, stages), blocks)


def _run(body, name, out_type, grid, interpret, *args):
    """`body` as a Mosaic GPU kernel of CONSUMERS + 1 warpgroups (axis "wg") over `grid` (axis "blocks"), named
    `name` (the performance model and `kernel_census.mosaic_ptx` find it by that); GPU interpret mode on a CPU."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    extra = {}
    if interpret:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # no public name in jax 0.10
        extra["interpret"] = InterpretGPUParams()
    body.__name__ = name
    with jax.named_scope(name):
        return plgpu.kernel(body, out_type=out_type, grid=(grid,), grid_names=("blocks",), num_threads=CONSUMERS + 1,
                            thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True), **extra)(*args)


def _take_turn(sched):
    """Arrive at the consumers' schedule barrier and wait for its phase: the consumers alternate."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    plgpu.barrier_arrive(sched)
    plgpu.barrier_wait(sched)


def _produce(rings, free, blocks: int, stages: int):
    """The producer warpgroup: block j of every ring (`(copy(j, slot), ready)` pairs: `copy` issues the TMA copies
    of block j into `slot`, signalling `ready.at[slot]`) into slot j % stages, once both consumers freed it."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
    for j in range(stages):  # stages <= blocks (`_ring`)
        for copy, ready in rings:
            copy(j, j, ready.at[j])

    @pl.loop(stages, blocks)
    def _(j):
        slot = lax.rem(j, stages)
        plgpu.barrier_wait(free.at[slot])  # both consumers are done with block j - stages
        for copy, ready in rings:
            copy(j, slot, ready.at[slot])

    for j in range(blocks - stages, blocks):  # every release observed before the barriers go
        plgpu.barrier_wait(free.at[j % stages])


def _gemm_nt(a, b_smem, sched, interpret: bool):
    """a @ b^T in float32 ([ROWS, N]), the consumer's turn handed on while it runs: b from shared memory, `a` a ref
    there or (the RS form) a BF16 array in registers in the WGMMA layout (`_held`)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    if interpret:  # no transposed wgmma operand there
        a = a if isinstance(a, jax.Array) else a[...]
        s = lax.dot_general(a, b_smem[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        _take_turn(sched)
        return s

    def gemm(s_ref):
        plgpu.wgmma(s_ref, a, plgpu.transpose_ref(b_smem, (1, 0)))
        _take_turn(sched)  # the other consumer's GEMMs go next, under this one's exps
        return s_ref[...]
    return pl.run_scoped(gemm, plgpu.ACC((a.shape[0], b_smem.shape[0]), jnp.float32))


def _gemm_acc(acc, a, b_smem, interpret: bool):
    """acc + a @ b in float32, waited for: `a` a BF16 array in registers (the WGMMA layout of the float32 array it
    was rounded from) or a ref in shared memory; b from shared memory."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    if interpret:  # no run_state there: the same BF16 products summed in float32, added
        a = a if isinstance(a, jax.Array) else a[...]
        return acc + lax.dot_general(a, b_smem[...], (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    def gemm(acc_ref):
        plgpu.wgmma(acc_ref, a, b_smem)
    return pl.run_state(gemm)(plgpu.ACC.init(acc))


def _accumulate(acc, p, carried, b_smem, p_smem, sched, interpret: bool):
    """(acc + p @ b, carried) in the consumer's next turn: p (float32, the softmax or dlogits) rounded once to BF16,
    then either kept in registers for the GEMM (`p_smem` None: the RS form, as FlashAttention-3 and jax's Mosaic GPU
    flash attention run P @ V; p, acc and `carried` formed before the turn) or stored to `p_smem` and fenced for the
    tensor cores first (the form an H200 measured, 2026-11-28)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    if p_smem is None:
        acc, carried, p = lax.optimization_barrier((acc, carried, p.astype(b_smem.dtype)))
        _take_turn(sched)
        return _gemm_acc(acc, p, b_smem, interpret), carried
    p_smem[...] = p.astype(p_smem.dtype)
    plgpu.commit_smem()  # visible to the tensor cores
    _take_turn(sched)  # wait for the tensor cores' turn
    return _gemm_acc(acc, p_smem, b_smem, interpret), carried


def _lay(v, layout, interpret: bool):
    """`v` in a register layout (GPU interpret mode has none)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return v if interpret else plgpu.layout_cast(v, layout)


def _load(ref, layout, interpret: bool):
    """A vector from shared memory in a register layout (GPU interpret mode has no `plgpu.load`)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return ref[...] if interpret else plgpu.load(ref, (), layout=layout)


def _held(ref, registers: bool, interpret: bool):
    """A consumer's own block, the logits GEMM's left operand through the whole walk: in the RS form loaded once into
    registers (64 x 128 BF16: 32 a thread), so that no iteration reads it from shared memory again; else the ref."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return _load(ref, plgpu.Layout.WGMMA, interpret) if registers else ref


def _swizzled():
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)


def forward_dx(x_TxK, w_VxK, v_real: int, *, bt: int = 128, bv: int = 128, stages: int = 2,
               registers: bool = False, interpret: bool = False):
    """(lse2 [T], a [T, K]) in float32 (module docstring): each program 2 x 64 rows of x, walking the vocabulary
    blocks that hold real rows, bv at a time."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    T, K = x_TxK.shape
    V = w_VxK.shape[0]
    _check("the mosaic training forward", K, bt, bv, T, V)
    if not 0 < v_real <= V:
        raise ValueError(f"v_real {v_real} must be in 1..{V}")
    full, partial = v_real // bv, v_real % bv != 0
    blocks = full + int(partial)  # blocks of padded rows alone are never loaded
    stages = _ring(stages, blocks)
    dtype = x_TxK.dtype
    wgmma = plgpu.Layout.WGMMA

    def kernel(x_ref, w_ref, a_ref, lse_ref, scoped):
        (x_smem2, w_smem, p_smem2, a_smem2, lse_smem2), x_ready, w_ready, w_free, sched = scoped
        wg = lax.axis_index("wg")

        @pl.when(wg < CONSUMERS)
        def _consumer():
            plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
            x_smem, a_smem, lse_smem = (b.at[wg] for b in (x_smem2, a_smem2, lse_smem2))
            p_smem = None if p_smem2 is None else p_smem2.at[wg]  # the softmax's buffer (none: kept in registers)
            mine = pl.ds(lax.axis_index("blocks") * bt + wg * ROWS, ROWS)
            plgpu.copy_gmem_to_smem(x_ref.at[mine], x_smem, x_ready.at[wg])
            plgpu.barrier_wait(x_ready.at[wg])
            x_held = _held(x_smem, registers, interpret)
            pl.when(wg == 1)(lambda: _take_turn(sched))  # consumer 0 goes first

            def step(j, carry, masked: bool):
                acc_RxK, m_R, l_R = carry  # base 2: the running max and the sum of exps below it
                slot = lax.rem(j, stages)
                plgpu.barrier_wait(w_ready.at[slot])
                s_RxN = _gemm_nt(x_held, w_smem.at[slot], sched, interpret)
                if masked:  # the one block that straddles v_real
                    cols = _lay(lax.broadcasted_iota(jnp.int32, (ROWS, bv), 1), wgmma, interpret)
                    s_RxN = jnp.where(cols < v_real - j * bv, s_RxN, -jnp.inf)
                m_new = jnp.maximum(m_R, s_RxN.max(axis=1) * LOG2E)
                alpha = jnp.exp2(m_R - m_new)
                p_RxN = jnp.exp2(s_RxN * LOG2E - lax.broadcast_in_dim(m_new, s_RxN.shape, [0]))
                l_R = l_R * alpha + p_RxN.sum(axis=1)
                acc_RxK = acc_RxK * lax.broadcast_in_dim(alpha, acc_RxK.shape, [0])
                acc_RxK, (l_R, m_new) = _accumulate(acc_RxK, p_RxN, (l_R, m_new), w_smem.at[slot], p_smem, sched,
                                                    interpret)
                plgpu.barrier_arrive(w_free.at[slot])
                return acc_RxK, m_new, l_R

            carry = (_lay(jnp.zeros((ROWS, K), jnp.float32), wgmma, interpret),
                     _lay(jnp.full((ROWS,), -jnp.inf, jnp.float32), wgmma.reduce(1), interpret),
                     _lay(jnp.zeros((ROWS,), jnp.float32), wgmma.reduce(1), interpret))
            carry = lax.fori_loop(0, full, lambda j, c: step(j, c, False), carry)
            if partial:
                carry = step(full, carry, True)
            acc_RxK, m_R, l_R = carry
            pl.when(wg == 0)(lambda: _take_turn(sched))  # both consumers have taken as many turns
            a_smem[...] = acc_RxK / lax.broadcast_in_dim(l_R, acc_RxK.shape, [0])
            lse_smem[...] = m_R + jnp.log2(l_R)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(a_smem, a_ref.at[mine])
            plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[mine])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == CONSUMERS)
        def _producer():
            def copy_w(j, slot, ready):
                plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(j * bv, bv)], w_smem.at[slot], ready)
            _produce([(copy_w, w_ready)], w_free, blocks, stages)

    def body(x_ref, w_ref, a_ref, lse_ref):
        smem = (plgpu.SMEM((CONSUMERS, ROWS, K), dtype, transforms=_swizzled()),
                plgpu.SMEM((stages, bv, K), dtype, transforms=_swizzled()),
                None if registers else plgpu.SMEM((CONSUMERS, ROWS, bv), dtype, transforms=_swizzled()),
                plgpu.SMEM((CONSUMERS, ROWS, K), jnp.float32),
                plgpu.SMEM((CONSUMERS, ROWS), jnp.float32))
        pl.run_scoped(lambda *scoped: kernel(x_ref, w_ref, a_ref, lse_ref, scoped), smem,
                      plgpu.Barrier(num_barriers=CONSUMERS), plgpu.Barrier(num_barriers=stages),
                      plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=stages), plgpu.Barrier(num_arrivals=CONSUMERS),
                      collective_axes="wg")

    out = (jax.ShapeDtypeStruct((T, K), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.float32))
    a_TxK, lse2_T = _run(body, FORWARD, out, T // bt, interpret, x_TxK, w_VxK)
    return lse2_T, a_TxK


def table_grad(x_TxK, w_VxK, targets_T, lse2_T, g_lse_T, g_tl_T, v_real: int, *, bt: int = 128, bv: int = 128,
               stages: int = 2, registers: bool = False, interpret: bool = False):
    """dw [V, K] in float32 (module docstring): each program 2 x 64 rows of w (the blocks that hold real rows;
    the rows of padded blocks are zeros), walking the tokens bt at a time with their lse2 (base 2), g_lse, g_target
    and target; a target outside [0, v_real) matches no row."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    T, K = x_TxK.shape
    V = w_VxK.shape[0]
    _check("the mosaic table gradient", K, bv, bt, V, T)
    if not 0 < v_real <= V:
        raise ValueError(f"v_real {v_real} must be in 1..{V}")
    programs = math.ceil(v_real / bv)
    blocks = T // bt
    stages = _ring(stages, blocks)
    dtype = x_TxK.dtype
    wgmma = plgpu.Layout.WGMMA
    # each token's lse2, g_lse, g_target and target (exact in float32 below 2^24) as rows, copied with its block of x.
    # Both parts of dlogits are summed in float32 before its one rounding: near p = 1 they cancel, and rounding
    # p x g_lse alone (adding g_target after the kernel) leaves the target's dlogit an error of up to 2^-8 g_lse.
    tokens_4xT = jnp.stack([lse2_T, g_lse_T, g_tl_T, targets_T.astype(jnp.float32)]).astype(jnp.float32)

    def kernel(x_ref, w_ref, tok_ref, dw_ref, scoped):
        (w_smem2, x_smem, tok_smem, d_smem2, dw_smem2), w_ready, x_ready, tok_ready, x_free, sched = scoped
        wg = lax.axis_index("wg")

        @pl.when(wg < CONSUMERS)
        def _consumer():
            plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
            w_smem, dw_smem = (b.at[wg] for b in (w_smem2, dw_smem2))
            d_smem = None if d_smem2 is None else d_smem2.at[wg]  # dlogits' buffer (none: kept in registers)
            v0 = lax.axis_index("blocks") * bv + wg * ROWS
            plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(v0, ROWS)], w_smem, w_ready.at[wg])
            plgpu.barrier_wait(w_ready.at[wg])
            w_held = _held(w_smem, registers, interpret)
            pl.when(wg == 1)(lambda: _take_turn(sched))  # consumer 0 goes first
            vocab_RxN = _lay(lax.broadcasted_iota(jnp.int32, (ROWS, bt), 0), wgmma, interpret).astype(jnp.float32)
            vocab_RxN = vocab_RxN + v0.astype(jnp.float32)

            def step(i, acc_RxK):
                slot = lax.rem(i, stages)
                plgpu.barrier_wait(x_ready.at[slot])
                plgpu.barrier_wait(tok_ready.at[slot])
                sT_RxN = _gemm_nt(w_held, x_smem.at[slot], sched, interpret)  # the logits, transposed
                lse2, g_lse, g_tl, tgt = (lax.broadcast_in_dim(
                    _load(tok_smem.at[slot, r], wgmma.reduce(0), interpret), sT_RxN.shape, [1]) for r in range(4))
                hot = jnp.where(vocab_RxN == tgt, g_tl, 0.0)
                d_RxN = jnp.exp2(sT_RxN * LOG2E - lse2) * g_lse + hot  # both parts in float32, then one rounding
                acc_RxK, _ = _accumulate(acc_RxK, d_RxN, (), x_smem.at[slot], d_smem, sched, interpret)
                plgpu.barrier_arrive(x_free.at[slot])
                return acc_RxK

            acc_RxK = lax.fori_loop(0, blocks, step, _lay(jnp.zeros((ROWS, K), jnp.float32), wgmma, interpret))
            pl.when(wg == 0)(lambda: _take_turn(sched))
            # a padded row's dlogits (its softmax term) reach only its own row of dw: zeroed once here
            real = _lay(lax.broadcasted_iota(jnp.int32, (ROWS, K), 0), wgmma, interpret) + v0 < v_real
            dw_smem[...] = jnp.where(real, acc_RxK, 0.0)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dw_smem, dw_ref.at[pl.ds(v0, ROWS)])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == CONSUMERS)
        def _producer():
            def copy_x(i, slot, ready):
                plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * bt, bt)], x_smem.at[slot], ready)

            def copy_tokens(i, slot, ready):
                plgpu.copy_gmem_to_smem(tok_ref.at[:, pl.ds(i * bt, bt)], tok_smem.at[slot], ready)
            _produce([(copy_x, x_ready), (copy_tokens, tok_ready)], x_free, blocks, stages)

    def body(x_ref, w_ref, tok_ref, dw_ref):
        smem = (plgpu.SMEM((CONSUMERS, ROWS, K), dtype, transforms=_swizzled()),
                plgpu.SMEM((stages, bt, K), dtype, transforms=_swizzled()),
                plgpu.SMEM((stages, 4, bt), jnp.float32),
                None if registers else plgpu.SMEM((CONSUMERS, ROWS, bt), dtype, transforms=_swizzled()),
                plgpu.SMEM((CONSUMERS, ROWS, K), jnp.float32))
        pl.run_scoped(lambda *scoped: kernel(x_ref, w_ref, tok_ref, dw_ref, scoped), smem,
                      plgpu.Barrier(num_barriers=CONSUMERS), plgpu.Barrier(num_barriers=stages),
                      plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=stages),
                      plgpu.Barrier(num_arrivals=CONSUMERS), collective_axes="wg")

    dw = _run(body, TABLE_GRAD, jax.ShapeDtypeStruct((programs * bv, K), jnp.float32), programs, interpret,
              x_TxK, w_VxK, tokens_4xT)
    return jnp.pad(dw, ((0, V - programs * bv), (0, 0))) if programs * bv < V else dw


def reference(x_TxK, w_VxK, v_real: int):
    """(lse2, a) in float32 from all logits at once: what `forward_dx` computes."""
    logits = x_TxK.astype(jnp.float32) @ w_VxK[:v_real].astype(jnp.float32).T
    return jax.nn.logsumexp(logits, axis=1) * LOG2E, jax.nn.softmax(logits, axis=1) @ w_VxK[:v_real].astype(jnp.float32)


def table_grad_reference(x_TxK, w_VxK, targets_T, g_lse_T, g_tl_T, v_real: int):
    """dw in float32 from all logits at once (the lse too): what `table_grad` computes."""
    x = x_TxK.astype(jnp.float32)
    logits = x @ w_VxK[:v_real].astype(jnp.float32).T
    d = jax.nn.softmax(logits, axis=1) * g_lse_T[:, None]
    d = d + jnp.where(jnp.arange(v_real)[None, :] == targets_T[:, None], g_tl_T[:, None], 0.0)
    return jnp.pad(d.T @ x, ((0, w_VxK.shape[0] - v_real), (0, 0)))
