"""The warp-specialized training forward (`model.fused_ce_ws`) in Pallas's GPU interpret mode on a CPU (its
producer, two consumers, barriers and TMA copies simulated), against float32. Its sm_90 compile and census are
tests/test_gpu_target.py's."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.tiles import DEFAULT_TILES, parse_tiles
from yxanul_jax.model import fused_ce, fused_ce_ws
from yxanul_jax.model.loss import masked_sums

# a = softmax @ w is formed from the softmax rounded to BF16 for the GEMM (as the Triton kernel's): relative to the
# largest |a|, within 2^-8; lse (base 2) from float32 sums, within 1e-5
A_RTOL, LSE_ATOL = 2.0 ** -8, 1e-5


@pytest.fixture
def target():
    """Set the compile-only GPU's compute capability (`fused_ce.set_compile_target`: what a deviceless compile for an
    H100 records) for one test; forgotten after it."""
    yield fused_ce.set_compile_target
    fused_ce.set_compile_target(None)


def _inputs(T, V, K, seed=0, scale=1.0):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = (scale * jax.random.normal(kx, (T, K))).astype(jnp.bfloat16)
    w = (0.3 * jax.random.normal(kw, (V, K))).astype(jnp.bfloat16)
    return x, w


def _check(x, w, v_real, **kw):
    lse2, a = fused_ce_ws.forward_dx(x, w, v_real, interpret=True, **kw)
    lse_r, a_r = fused_ce_ws.reference(x, w, v_real)
    assert np.abs(np.asarray(lse2) - np.asarray(lse_r)).max() < LSE_ATOL
    assert np.abs(np.asarray(a) - np.asarray(a_r)).max() < A_RTOL * np.abs(np.asarray(a_r)).max()


@pytest.mark.parametrize("T,V,K,v_real,bv,stages", [
    (128, 384, 128, 300, 128, 2),  # a padded vocabulary: two whole blocks, one straddling v_real; the ring wraps
    (256, 256, 64, 256, 64, 3),  # two programs, no padding, K 64, three blocks in flight
    (128, 512, 128, 129, 128, 2),  # one real column in the straddling block; the padded block after it never loads
    (128, 128, 128, 128, 128, 2),  # one block: fewer blocks than stages
])
def test_the_warp_specialized_forward_equals_float32(T, V, K, v_real, bv, stages):
    _check(*_inputs(T, V, K), v_real, bv=bv, stages=stages)


def test_a_row_far_above_its_other_logits_needs_no_fallback():
    # the Triton kernel's anchor overflows where a logit is ~88 nats over the target's and walks such blocks again;
    # this kernel keeps flash attention's online max, so the same rows come out right in its one walk
    x, w = _inputs(128, 256, 128)
    x = x.at[:8].set(0).at[:8, 0].set(10.0)
    w = w.at[:, 0].set(0).at[5, 0].set(10.0).at[200, 0].set(-10.0)  # column 5: +100 nats (2^144: no float32), 200: -100
    _check(x, w, 250)


def _table_grad_inputs(T, V, K, v_real, seed=0, confident=False):
    """(x, w, targets, g_lse, g_target) for a table-gradient check; `confident`: each token's x its target's row of w,
    scaled, so that the target's softmax is near 1 (every target real)."""
    x, w = _inputs(T, V, K, seed)
    k = jax.random.split(jax.random.key(seed + 1), 2)
    targets = jax.random.randint(k[0], (T,), -1, v_real + 8)  # some outside [0, v_real): they match no row
    if confident:
        targets = jnp.clip(targets, 0, v_real - 1)
        x = w[targets]
        p = jax.nn.softmax(x.astype(jnp.float32) @ w[:v_real].astype(jnp.float32).T, axis=1)
        assert np.median(np.asarray(p[jnp.arange(T), targets])) > 0.99  # the regime this case is for
    g_lse = jax.random.uniform(k[1], (T,), minval=0.5, maxval=1.5) / T
    # the NLL's -g_lse at real targets; elsewhere too, where no row may take it (a target outside [0, v_real))
    return x, w, targets, g_lse, -g_lse


def _table_grad_check(T, V, K, v_real, bt, stages, seed=0, registers=False, confident=False):
    x, w, targets, g_lse, g_tl = _table_grad_inputs(T, V, K, v_real, seed, confident)
    lse2, _ = fused_ce_ws.reference(x, w, v_real)
    dw = fused_ce_ws.table_grad(x, w, targets, lse2, g_lse, g_tl, v_real, bt=bt, stages=stages, registers=registers,
                                interpret=True)
    ref = fused_ce_ws.table_grad_reference(x, w, targets, g_lse, g_tl, v_real)
    assert dw.shape == (V, K) and not np.any(np.asarray(dw[v_real:]))  # padded rows: zeros
    # dlogits rounded once to BF16 for the GEMM: within 2^-8 of the largest |dw|
    assert np.abs(np.asarray(dw) - np.asarray(ref)).max() < A_RTOL * np.abs(np.asarray(ref)).max()


@pytest.mark.parametrize("T,V,K,v_real,bt,stages", [
    (384, 256, 128, 200, 128, 2),  # a padded block: its rows zeroed; three token blocks through a ring of two
    (128, 512, 64, 300, 64, 4),  # K 64, blocks of 64 tokens, three programs (the fourth block is padding alone)
])
def test_the_warp_specialized_table_gradient_equals_float32(T, V, K, v_real, bt, stages):
    _table_grad_check(T, V, K, v_real, bt, stages)


def test_the_table_gradient_of_confident_tokens_rounds_dlogits_once():
    # near p = 1 the target's two parts of dlogits (softmax x g_lse and g_target = -g_lse) cancel: summed in float32
    # and rounded once to BF16 they stay within the bound; rounding the softmax part alone first (the one-hot part
    # added after it: tried for the RS form, found by review) leaves the target's dlogit in steps of 2^-9 g_lse and
    # fails it, where the random cases above pass either way
    x, w, targets, g_lse, g_tl = _table_grad_inputs(384, 256, 128, 200, confident=True)
    ref = np.asarray(fused_ce_ws.table_grad_reference(x, w, targets, g_lse, g_tl, 200))
    xf, wf = x.astype(jnp.float32), w[:200].astype(jnp.float32)
    soft = (jax.nn.softmax(xf @ wf.T, axis=1) * g_lse[:, None]).astype(jnp.bfloat16).astype(jnp.float32)
    hot = jnp.where(jnp.arange(200)[None, :] == targets[:, None], g_tl[:, None], 0.0)
    apart = np.asarray(jnp.pad((soft + hot).T @ xf, ((0, 56), (0, 0))))  # the softmax part rounded alone
    assert np.abs(apart - ref).max() > 2 * A_RTOL * np.abs(ref).max()  # this case tells the two apart
    _table_grad_check(384, 256, 128, 200, 128, 2, confident=True)


def test_the_rs_form_keeps_the_softmax_and_dlogits_in_registers_and_equals_float32():
    # `registers=True` (tiles `:mosaic-rs`): the accumulating GEMM takes its BF16 left operand from registers (no
    # shared-memory buffer, no fence); the same arithmetic, so the same bounds, with a padded block and a wrapping ring
    _check(*_inputs(128, 384, 128), 300, bv=128, stages=2, registers=True)
    _table_grad_check(384, 256, 128, 200, 128, 2, registers=True)
    _table_grad_check(384, 256, 128, 200, 128, 2, registers=True, confident=True)
    # and with the third slot of 128 it has room for (core.tiles.mosaic_max_stages): five blocks through a ring of three
    _check(*_inputs(128, 640, 128), 600, bv=128, stages=3, registers=True)
    _table_grad_check(640, 256, 128, 200, 128, 3, registers=True)


@pytest.mark.parametrize("spec", ["dx=128x128s2:mosaic,dw=128x128s2:mosaic", "default",
                                  "dx=128x128s3:mosaic-rs,dw=128x128s3:mosaic-rs"])
def test_the_fused_loss_on_mosaic_tiles_matches_float32_through_its_gradients(monkeypatch, target, spec):
    # the GPU's path through model.fused_ce (its custom gradient, padding, the lse handed from the forward to dw, the
    # input gradient formed in XLA) with both mosaic kernels, run here in GPU interpret mode: asked for outright, and
    # as the default tiles pick them at K 64 (`Tiles.runs_mosaic`)
    target("9.0")  # compiled for an H100: the default tiles take the mosaic kernels
    monkeypatch.setattr(fused_ce, "_on_platform", lambda fn, interpret, *args: fn(*args, interpret=False, fast=True))
    ran = []
    for name in ("forward_dx", "table_grad"):
        def traced(*args, _name=name, _fn=getattr(fused_ce_ws, name), **kw):
            ran.append((_name, kw["registers"]))
            return _fn(*args, interpret=True, **kw)
        monkeypatch.setattr(fused_ce_ws, name, traced)
    tiles = parse_tiles(spec)
    T, V, v_real, K = 200, 300, 290, 64  # tokens padded to 256, rows to 384: a straddling block, a padded one
    k = jax.random.split(jax.random.key(5), 4)
    x = jax.random.normal(k[0], (T, K)).astype(jnp.bfloat16)
    w = (0.5 * jax.random.normal(k[1], (V, K))).astype(jnp.bfloat16)
    mask = (jax.random.uniform(k[3], (T,)) > 0.2).astype(jnp.float32)
    targets = jnp.where(mask > 0, jax.random.randint(k[2], (T,), 0, v_real), -1)

    def loss(fn, x, w):
        nll, z = masked_sums(*fn(x, w, targets), mask)
        return nll + 1e-3 * z

    fused = functools.partial(fused_ce.linear_cross_entropy, v_real=v_real, tiles=tiles)
    ref = lambda x, w, t: fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), t, v_real)  # noqa: E731
    v, g = jax.value_and_grad(loss, argnums=(1, 2))(fused, x, w)
    v_r, g_r = jax.value_and_grad(loss, argnums=(1, 2))(ref, x, w)
    np.testing.assert_allclose(v, v_r, rtol=2e-6)
    for a, b in zip(g, g_r):  # the softmax and dlogits rounded to BF16 for their GEMMs, the gradients BF16
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-2 * np.max(np.abs(b))
    assert not np.any(np.asarray(g[1][v_real:], np.float32))  # padded rows: no gradient
    rs = spec.endswith(":mosaic-rs")  # the softmax and dlogits kept in registers: that form's alone
    assert sorted(set(ran)) == [("forward_dx", rs), ("table_grad", rs)]  # both mosaic kernels ran, no Triton one


def test_a_jax_whose_mosaic_api_differs_is_one_line_naming_the_way_back(monkeypatch):
    # the kernels use an experimental API: where this JAX cannot build them, the step's trace stops with a UserError
    # (exit 2 from a command) that says to drop ':mosaic', not a traceback from inside Pallas
    from yxanul_jax.core.errors import UserError

    def renamed(*args, **kw):
        raise AttributeError("module 'jax.experimental.pallas.mosaic_gpu' has no attribute 'ACC'")
    monkeypatch.setattr(fused_ce_ws, "forward_dx", renamed)
    x, w = _inputs(128, 256, 64)
    tiles = parse_tiles("dx=128x128s2:mosaic")
    with pytest.raises(UserError, match=r"mosaic kernels do not build with jax .*no attribute 'ACC'.*drop ':mosaic'"):
        fused_ce._forward_dx(x, w, None, v_real=256, tiles=tiles, interpret=False, fast=True)


def test_where_the_mosaic_api_differs_the_default_tiles_run_the_triton_kernels(monkeypatch, caplog, target):
    # the default tiles (`auto`) are not stopped by an experimental API that renamed something (found while tracing):
    # the same blocks in Triton, said once
    target("9.0")

    def renamed(*args, **kw):
        raise AttributeError("module 'jax.experimental.pallas.mosaic_gpu' has no attribute 'ACC'")
    monkeypatch.setattr(fused_ce_ws, "forward_dx", renamed)
    monkeypatch.setattr(fused_ce_ws, "table_grad", renamed)
    fused_ce._warn_fallback.cache_clear()
    for _ in range(2):
        assert _kernels_traced(DEFAULT_TILES) == ["fused_ce_fwd_dx", "fused_ce_dw"]
    said = [r.getMessage() for r in caplog.records if "running the Triton kernels" in r.getMessage()]
    assert len(said) == 1 and "no attribute 'ACC'" in said[0]  # one line for both kernels and both traces


def _kernels_traced(tiles, K=64):
    """The Pallas kernels' names in the jaxprs of the GPU path of the training forward and the table gradient."""
    x, w = _inputs(128, 256, K)
    T, V = x.shape[0], w.shape[0]
    f32 = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
    dx = jax.make_jaxpr(functools.partial(fused_ce._forward_dx, v_real=V, tiles=tiles, interpret=False,
                                          fast=True))(x, w, f32(T))
    dw = jax.make_jaxpr(functools.partial(fused_ce._table_grad, v_real=V, tiles=tiles, interpret=False,
                                          fast=True))(x, w, jnp.zeros((T,), jnp.int32), f32(T), f32(T), f32(T))
    names = set(re.findall(r"\bfused_ce_\w+", str(dx) + str(dw)))
    return [n for n in ("fused_ce_fwd_dx_ws", "fused_ce_dw_ws", "fused_ce_fwd_dx", "fused_ce_dw") if n in names]


def test_the_default_tiles_take_the_mosaic_kernels_only_for_a_hopper_gpu(target):
    # wgmma is sm_90's: an H100 or H200 (compute capability 9.0) gets the mosaic kernels; an RTX 4090 (8.9), an A100
    # (8.0) or a B200 (10.0) the Triton ones at the same blocks, as does a CPU (its CUDA branch is never lowered,
    # and the mosaic kernels are not even traced); asked for outright on such a GPU, one line naming the fix
    for cc, kernels in ((None, ["fused_ce_fwd_dx", "fused_ce_dw"]), ("9.0", ["fused_ce_fwd_dx_ws", "fused_ce_dw_ws"]),
                        ("8.9", ["fused_ce_fwd_dx", "fused_ce_dw"]), ("10.0", ["fused_ce_fwd_dx", "fused_ce_dw"])):
        target(cc)
        assert _kernels_traced(DEFAULT_TILES) == kernels, cc
    from yxanul_jax.core.errors import UserError

    target("8.9")
    with pytest.raises(UserError, match=r"need a Hopper GPU .*this one is 8\.9; drop ':mosaic-rs'"):
        _kernels_traced(parse_tiles("dx=128x128s2:mosaic-rs"))
    target(None)  # no GPU: a spec asking for them is traced as asked (its CUDA branch is never lowered)
    assert _kernels_traced(parse_tiles("dx=128x128s2:mosaic,dw=128x128s2:mosaic")) == ["fused_ce_fwd_dx_ws",
                                                                                      "fused_ce_dw_ws"]


def test_a_ring_of_one_slot_is_raised_to_two():
    # with one slot the consumers' turns deadlock once there are two blocks (`fused_ce_ws._ring`; found by review:
    # interpret mode hung): asked for 1, the kernels take 2, and never more than the blocks
    assert fused_ce_ws._ring(1, 5) == 2 and fused_ce_ws._ring(4, 3) == 3 and fused_ce_ws._ring(1, 1) == 1
    _check(*_inputs(128, 256, 64), 256, bv=64, stages=1)  # 4 blocks: it would hang on one slot


def test_shapes_it_cannot_take_are_refused():
    x, w = _inputs(128, 256, 32)
    with pytest.raises(ValueError, match="K 32"):
        fused_ce_ws.forward_dx(x, w, 256, interpret=True)
    x, w = _inputs(96, 256, 128)
    with pytest.raises(ValueError, match="whole blocks"):
        fused_ce_ws.forward_dx(x, w, 256, interpret=True)
    z = jnp.zeros((96,), jnp.float32)
    with pytest.raises(ValueError, match="whole blocks"):
        fused_ce_ws.table_grad(x, w, z.astype(jnp.int32), z, z, z, 256, interpret=True)
