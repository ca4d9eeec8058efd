"""The fused head + cross-entropy kernels (`model.fused_ce`) in Pallas interpret mode on CPU, against the
float32 reference: loss and both gradients, with padded vocabulary, masked tokens, a ragged last block
and z-loss; then the whole train step with `train.loss_kernel=fused` against the chunked loss. The sm_90
compile of the kernels (Triton) is in tests/test_gpu_target.py."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.tiles import DEFAULT_TILES, KernelTiles, Tiles, parse_tiles, training_form
from yxanul_jax.core.config import Config, TrainConfig, load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.model import fused_ce
from yxanul_jax.model.loss import loss_kernel, masked_sums
from yxanul_jax.training.steps import loss_sums

from conftest import micro_config

# Gradients: the kernels round the softmax (input gradient) or dlogits (table gradient) to the operands' BF16 before
# the GEMM that uses it (float32 accumulation), and the gradients come out in BF16: within 1 % of the largest entry.
GRAD_RTOL = 1e-2


def _loss(fn, x, w, targets, mask, z_weight):
    lse, target = fn(x, w, targets)
    nll, z = masked_sums(lse, target, mask)
    return nll + z_weight * z


# Other tiles than the default: each kernel its own blocks, so tokens and rows are padded to the largest.
MIXED_TILES = KernelTiles(fwd=Tiles(64, 32), dx=Tiles(32, 64, 4, 2), dw=Tiles(16, 128))


@pytest.mark.parametrize("T, V, v_real, K, tiles", [(200, 300, 290, 32, DEFAULT_TILES),
                                                    (128, 256, 256, 16, DEFAULT_TILES),
                                                    (130, 400, 200, 16, DEFAULT_TILES),
                                                    (128, 300, 256, 16, DEFAULT_TILES),
                                                    (64, 128, 100, 16, DEFAULT_TILES),
                                                    (200, 300, 290, 32, MIXED_TILES)])
def test_loss_and_gradients_match_the_float32_reference(T, V, v_real, K, tiles):
    # 200 tokens: a ragged last token block; 300 rows: a ragged vocabulary block; 10 padded columns.
    # 400 rows of which 200 real: one block straddles v_real and two hold padded rows only (skipped);
    # 300 rows of which 256 real: v_real ends a block, and the next holds padded rows only.
    # 128 rows of which 100 real: no whole block, the training forward's pipelined loop never runs.
    k = jax.random.split(jax.random.key(T + V), 4)
    x = jax.random.normal(k[0], (T, K)).astype(jnp.bfloat16)
    w = (0.5 * jax.random.normal(k[1], (V, K))).astype(jnp.bfloat16)
    targets = jax.random.randint(k[2], (T,), 0, v_real)
    # a few tokens share one target (their table row sums every occurrence), one targets a padded row
    targets = targets.at[:12].set(targets[0]).at[12].set(min(v_real, V - 1) if v_real < V else targets[12])
    mask = (jax.random.uniform(k[3], (T,)) > 0.2).astype(jnp.float32)
    targets = jnp.where(mask > 0, targets, -1)  # masked tokens carry a padding id outside the vocabulary
    fused = jax.jit(lambda x, w, t: fused_ce.linear_cross_entropy(x, w, t, v_real, tiles=tiles))
    ref = lambda x, w, t: fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), t, v_real)  # noqa: E731
    lse, target = fused(x, w, targets)
    lse_r, target_r = ref(x, w, targets)
    np.testing.assert_allclose(lse, lse_r, atol=2e-5, rtol=2e-6)
    np.testing.assert_allclose(target, target_r, atol=2e-5)
    for z_weight in (0.0, 1e-3):
        v, g = jax.value_and_grad(_loss, argnums=(1, 2))(fused, x, w, targets, mask, z_weight)
        v_r, g_r = jax.value_and_grad(_loss, argnums=(1, 2))(ref, x, w, targets, mask, z_weight)
        np.testing.assert_allclose(v, v_r, rtol=2e-6)
        for a, b in zip(g, g_r):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert a.shape == b.shape and np.max(np.abs(a - b)) <= GRAD_RTOL * np.max(np.abs(b))
    # A padded column never receives probability, so its table row gets no gradient.
    g_w = jax.grad(_loss, argnums=2)(fused, x, w, targets, mask, 1e-3)
    assert not np.any(np.asarray(g_w[v_real:], np.float32))


def test_gradients_stay_accurate_where_the_model_is_confident():
    # Where the target's probability is near 1, the softmax and one-hot parts of dlogits nearly cancel: each
    # rounded to BF16 before the sum (a version of these kernels) gave 5 % (dx) and 22 % (target rows of dw)
    # errors here; summed in float32 (dw: in the tile; dx: g_lse * a + g_target * w[target] in XLA, the target's own
    # softmax weight exp(0) = 1 exact in BF16) 0.2-0.3 %.
    T, V, K = 256, 256, 64
    k = jax.random.split(jax.random.key(7), 3)
    w = jax.random.normal(k[1], (V, K)).astype(jnp.bfloat16)
    targets = jax.random.randint(k[2], (T,), 0, V)
    x = (0.5 * w[targets].astype(jnp.float32) + 0.5 * jax.random.normal(k[0], (T, K))).astype(jnp.bfloat16)
    logits = x.astype(jnp.float32) @ w.astype(jnp.float32).T
    p_target = jnp.take_along_axis(jax.nn.softmax(logits, axis=1), targets[:, None], axis=1)
    assert float(jnp.mean(p_target)) > 0.99  # confident
    mask = jnp.ones((T,), jnp.float32)
    fused = lambda x, w, t: fused_ce.linear_cross_entropy(x, w, t, V)  # noqa: E731
    ref = lambda x, w, t: fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), t, V)  # noqa: E731
    g = jax.grad(_loss, argnums=(1, 2))(fused, x, w, targets, mask, 0.0)
    g_r = jax.grad(_loss, argnums=(1, 2))(ref, x, w, targets, mask, 0.0)
    rows = np.unique(np.asarray(targets))
    for a, b in ((g[0], g_r[0]), (g[1][rows], g_r[1][rows])):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b)


def _fused_train(x, w, targets, v_real):
    """lse, target logit and both gradients of sum(lse - target) through the training kernels (fused_ce_fwd_dx, dw)."""
    f = lambda x, w: jnp.sum(jnp.subtract(*fused_ce.linear_cross_entropy(x, w, targets, v_real)))  # noqa: E731
    (lse, tl), _ = jax.vjp(lambda x, w: fused_ce.linear_cross_entropy(x, w, targets, v_real), x, w)
    return lse, tl, jax.grad(f, argnums=(0, 1))(x, w)


def test_the_training_forward_walks_again_where_its_anchor_overflows():
    # The training forward shifts each row's exps by its target's logit, not a running max; where a logit is so
    # far over it that the sums overflow, the block is walked again with the online max: the same results.
    x, w, targets = fused_ce.overflow_inputs(64, 96, 16)
    v_real = 90
    lse, tl, (gx, gw) = jax.jit(_fused_train, static_argnums=3)(x, w, targets, v_real)
    lse_r, tl_r = fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), targets, v_real)
    assert float(jnp.min(lse_r[:8] - tl_r[:8])) > 95  # the extreme rows
    np.testing.assert_allclose(lse, lse_r, rtol=2e-6, atol=2e-5)
    ref = lambda x, w: jnp.sum(jnp.subtract(*fused_ce.reference(x, w, targets, v_real)))  # noqa: E731
    for a, b in zip((gx, gw), jax.grad(ref, argnums=(0, 1))(x.astype(jnp.float32), w.astype(jnp.float32))):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.all(np.isfinite(a)) and np.max(np.abs(a - b)) <= GRAD_RTOL * np.max(np.abs(b))


def test_the_training_forward_takes_the_anchored_walk_unless_it_overflows(monkeypatch):
    # The online-max walk replaced by NaNs: ordinary rows still come out right (the anchored walk served them),
    # and the block with extreme rows comes out NaN (it took the online walk).
    def poisoned(x, w_ref, acc0, **kw):
        nan = jnp.full((x.shape[0],), jnp.nan, jnp.float32)
        return nan, nan, None if acc0 is None else jnp.full(acc0.shape, jnp.nan, jnp.float32)

    monkeypatch.setattr(fused_ce, "_walk_online", poisoned)
    x, w, targets = fused_ce.overflow_inputs(256, 96, 16)
    bt = DEFAULT_TILES.dx.bt
    # masked tokens (no target) with row 0's logit 100 nats under their largest: anchored at their mean logit,
    # not at one of those, they stay on the anchored walk
    x = x.at[bt:bt + 8].set(x[0])
    w = w.at[0, 0].set(-10.0)
    targets = targets.at[bt:bt + 8].set(-1)
    lse, _, (gx, _) = _fused_train(x, w, targets, 90)
    lse_r, _ = fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), targets, 90)
    logits = x[bt].astype(jnp.float32) @ w[:90].astype(jnp.float32).T
    assert float(jnp.max(logits) - logits[0]) > 95
    np.testing.assert_allclose(lse[bt:], lse_r[bt:], rtol=2e-6, atol=2e-5)
    assert np.all(np.isfinite(np.asarray(gx[bt:], np.float32)))
    assert np.all(np.isnan(lse[:bt]))


def test_tiles_are_read_from_a_spec_and_checked():
    tiles = DEFAULT_TILES.replace("dx=64x256w4s2").replace("fwd=256x64")
    assert tiles.dx == Tiles(64, 256, 4, 2) and tiles.fwd == Tiles(256, 64, 8, 3)
    assert tiles.dw == DEFAULT_TILES.dw and (tiles.t_multiple, tiles.v_multiple) == (256, 256)
    assert parse_tiles("dx=64x256w4s2,fwd=256x64") == tiles and parse_tiles("default") == DEFAULT_TILES
    for bad in ("dx=64", "dq=64x64", "dx=48x64", "dx=8x64", "dx=64x64w3", "dx=64x64s0"):
        with pytest.raises(ValueError, match="fused cross-entropy tile"):
            DEFAULT_TILES.replace(bad)


def test_the_mosaic_training_kernels_are_tile_specs_with_their_own_limits():
    # model.fused_ce_ws: two consumers of 64 rows (128 held: bt for dx, bv for dw), walked blocks of 64 or 128, the
    # ring in sm_90's 227 KB of shared memory
    tiles = parse_tiles("dx=128x128s2:mosaic,dw=128x128s2:mosaic")
    assert tiles.dx == tiles.dw == Tiles(128, 128, 8, 2, "mosaic") and parse_tiles(tiles.spec()) == tiles
    assert tiles.fwd == DEFAULT_TILES.fwd and tiles.mosaic and not DEFAULT_TILES.mosaic
    assert parse_tiles("dx=128x64s4:mosaic").dx.stages == 4 and parse_tiles("dw=64x128s4:mosaic").dw.bt == 64
    for bad in ("fwd=128x64:mosaic", "dx=64x128:mosaic", "dx=128x256:mosaic", "dx=128x128s3:mosaic",
                "dx=128x64s5:mosaic", "dw=128x64:mosaic", "dw=128x128s3:mosaic", "dx=128x128s1:mosaic",
                "dw=64x128s1:mosaic", "dx=128x128:triton", "dx=128x128s4:mosaic-rs", "dw=64x128s7:mosaic-rs",
                "dw=128x128s3:auto"):
        with pytest.raises(ValueError, match="fused cross-entropy tiles|mosaic kernel takes"):
            parse_tiles(bad)
    # the RS form keeps its softmax out of shared memory: one more slot of 128 rows, two more of 64
    # (core.tiles.mosaic_max_stages), where `auto` (the SMEM form where it is mosaic) keeps the SMEM form's limits
    rs = parse_tiles("dx=128x128s3:mosaic-rs,dw=64x128s6:mosaic-rs")
    assert (rs.dx.stages, rs.dw.stages, rs.dw.kernel) == (3, 6, "mosaic-rs") and parse_tiles(rs.spec()) == rs
    x, w, t = jnp.zeros((8, 32), jnp.bfloat16), jnp.zeros((32, 32), jnp.bfloat16), jnp.zeros((8,), jnp.int32)
    with pytest.raises(ValueError, match="mosaic training kernels take a head input width in .64, 128.*got 32"):
        fused_ce.linear_cross_entropy(x, w, t, 32, tiles=parse_tiles("dw=128x128s2:mosaic"))
    with pytest.raises(UserError, match="mosaic training kernel.*this head is 32 wide.*drop ':mosaic'"):
        load_config("configs/yxanul_197m.yaml", ["model.embed_rank=32", "train.fused_ce_tiles=dx=128x128s2:mosaic"])
    # where the fused kernels do not run (an untied 768-wide head: the chunked loss), the spec is harmless
    load_config("configs/yxanul_197m.yaml", ["model.head=untied", "train.fused_ce_tiles=dx=128x128s2:mosaic"])


def test_the_default_training_kernels_are_mosaic_where_they_can_run():
    # `auto`: the mosaic kernels on a GPU at head widths 64 and 128 (model.fused_ce_ws), Triton at the same blocks
    # elsewhere; a kernel given without an ending is Triton; `:auto` takes the mosaic limits on its blocks
    assert (DEFAULT_TILES.fwd.kernel, DEFAULT_TILES.dx.kernel, DEFAULT_TILES.dw.kernel) == ("triton", "auto", "auto")
    assert all(DEFAULT_TILES.dx.runs_mosaic(k) and DEFAULT_TILES.dw.runs_mosaic(k) for k in (64, 128))
    assert not any(DEFAULT_TILES.dx.runs_mosaic(k) or DEFAULT_TILES.dw.runs_mosaic(k) for k in (16, 32))
    assert parse_tiles("dx=128x128s2").dx == Tiles(128, 128, 8, 2, "triton") and not Tiles().runs_mosaic(128)
    auto = parse_tiles("dx=128x64s4:auto")
    assert auto.dx == Tiles(128, 64, 8, 4, "auto") and parse_tiles(auto.spec()) == auto and not auto.mosaic
    for bad in ("dx=64x128:auto", "fwd=128x64:auto", "dw=128x128s3:auto"):
        with pytest.raises(ValueError, match="fused cross-entropy tiles|mosaic kernel takes"):
            parse_tiles(bad)
    assert parse_tiles("dx=128x128s2,dw=128x128s2").spec() == "dx=128x128w8s2,dw=128x128w8s2"  # not the default
    rs = parse_tiles("dx=128x128s2:mosaic-rs,dw=64x128s4:mosaic-rs")  # the RS form: softmax, dlogits in registers
    assert rs.dx == Tiles(128, 128, 8, 2, "mosaic-rs") and rs.mosaic and parse_tiles(rs.spec()) == rs
    assert rs.resolved(128) == rs and rs.resolved(128, gpu=False).dw == Tiles(64, 128, 8, 4, "triton")
    with pytest.raises(ValueError, match="mosaic kernel takes"):
        parse_tiles("dx=64x128:mosaic-rs")
    with pytest.raises(ValueError, match="mosaic kernel takes"):  # built directly, the blocks are checked too
        KernelTiles(dx=Tiles(64, 128, 8, 2, "auto"))
    with pytest.raises(ValueError, match="forward's kernel is Triton's"):
        KernelTiles(fwd=Tiles(kernel="mosaic"))
    # the sets the GPU scripts compare: the default's training kernels, each form, at the default's blocks
    for form in ("triton", "mosaic", "mosaic-rs"):
        tiles = parse_tiles(training_form(form))
        for name in ("dx", "dw"):
            made, default = getattr(tiles, name), getattr(DEFAULT_TILES, name)
            assert (made.bt, made.bv, made.stages, made.kernel) == (default.bt, default.bv, default.stages, form)
        assert tiles.fwd == DEFAULT_TILES.fwd
    assert parse_tiles(training_form("mosaic-rs", 3)).dw.stages == 3
    with pytest.raises(ValueError, match="kernel form"):
        training_form("cuda")
    # a 32-wide head takes the default tiles (they run in Triton there) and `:auto`, but not `:mosaic` (above)
    x, w, t = jnp.zeros((8, 32), jnp.bfloat16), jnp.zeros((32, 32), jnp.bfloat16), jnp.zeros((8,), jnp.int32)
    fused_ce.linear_cross_entropy(x, w, t, 32, tiles=auto)
    load_config("configs/yxanul_197m.yaml", ["model.embed_rank=32", "train.fused_ce_tiles=dw=128x128s2:auto"])


def test_v_real_outside_the_table_is_refused():
    x, w, t = jnp.zeros((8, 16), jnp.bfloat16), jnp.zeros((32, 16), jnp.bfloat16), jnp.zeros((8,), jnp.int32)
    for v_real in (0, 33):
        with pytest.raises(ValueError, match="v_real"):
            fused_ce.linear_cross_entropy(x, w, t, v_real)


def test_the_train_step_loss_is_the_same_fused_or_chunked():
    cfg = micro_config(dtype="bfloat16", embed_rank=16)  # 97 real rows of 112: padded vocabulary
    cfg = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, enabled=False))
    from yxanul_jax.model.transformer import init_variables

    params = init_variables(cfg.model, cfg.fp8, jax.random.key(0))["params"]
    k = jax.random.split(jax.random.key(1), 2)
    batch = {"inputs": jax.random.randint(k[0], (2, 40), 0, 97), "targets": jax.random.randint(k[1], (2, 40), 0, 97),
             "mask": jnp.ones((2, 40)).at[1, 30:].set(0.0)}

    def run(kernel, tiles="default"):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, loss_kernel=kernel, loss_chunk=32,
                                                               z_loss=1e-3, fused_ce_tiles=tiles))
        f = lambda p: loss_sums(c, p, {}, None, batch)  # noqa: E731
        (total, sums), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        return total, sums["nll"], sums["z"], g

    fused, chunked = run("fused"), run("chunked")
    # train.fused_ce_tiles: the same sums in other blocks, so in another order: float32 sums equal closely, BF16
    # gradients within a rounding of their largest entry
    tiled = run("fused", "fwd=16x32,dx=32x16w4s2,dw=64x64")
    np.testing.assert_allclose(np.asarray(tiled[:3]), np.asarray(fused[:3]), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(tiled[3]), jax.tree_util.tree_leaves(fused[3])):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 2 ** -7 * (np.max(np.abs(b)) or 1.0)
    for a, b in zip(fused[:3], chunked[:3]):
        np.testing.assert_allclose(a, b, rtol=2e-3)  # BF16 model: the head's BF16 logits vs float32 in-kernel
    for path, a in jax.tree_util.tree_leaves_with_path(fused[3]):
        b = dict(jax.tree_util.tree_leaves_with_path(chunked[3]))[path]
        scale = float(jnp.max(jnp.abs(b))) or 1.0
        assert float(jnp.max(jnp.abs(a - b))) <= 3e-2 * scale, jax.tree_util.keystr(path)


def test_auto_picks_fused_on_gpu_only_where_the_kernels_apply():
    m = load_config("configs/yxanul_197m.yaml")
    assert loss_kernel("auto", m.model, m.fp8, "gpu") == "fused"  # K = 128, BF16, head not FP8
    assert loss_kernel("auto", m.model, m.fp8, "cpu") == "chunked"
    untied = dataclasses.replace(m.model, head="untied")  # K = d_model = 768 > 128
    assert loss_kernel("auto", untied, m.fp8, "gpu") == "chunked"
    fp8_head = dataclasses.replace(m.fp8, targets=(*m.fp8.targets, "head"))
    assert loss_kernel("auto", m.model, fp8_head, "gpu") == "chunked"
    with pytest.raises(UserError, match="fp8.targets has 'head'"):
        load_config("configs/yxanul_197m.yaml", ["train.loss_kernel=fused", "fp8.targets=[q,head]"])
    with pytest.raises(UserError, match="head width that is a power of 2 from 16 to 128 .this head is 768 wide"):
        load_config("configs/yxanul_197m.yaml", ["train.loss_kernel=fused", "model.head=untied"])
    # Triton's blocks are powers of 2, and at 256 the default tiles would overflow sm_90's shared memory
    assert [k for k in range(8, 300, 8) if fused_ce.supported(k)] == [16, 32, 64, 128]
    assert loss_kernel("auto", dataclasses.replace(m.model, embed_rank=96), m.fp8, "gpu") == "chunked"
    assert Config().train.loss_kernel == TrainConfig().loss_kernel == "auto"
