"""Chunked cross-entropy equals the naive full-logits loss, value and gradient."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.model.loss import chunked_cross_entropy, cross_entropy_sums, logsumexp_rows


@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 1000])
def test_chunked_equals_naive_value_and_gradient(chunk):
    n, d, v = 50, 16, 37
    kh, kw, kt, km = jax.random.split(jax.random.key(0), 4)
    h = jax.random.normal(kh, (n, d), jnp.float32)
    w = jax.random.normal(kw, (d, v), jnp.float32)
    t = jax.random.randint(kt, (n,), 0, v)
    m = (jax.random.uniform(km, (n,)) > 0.2).astype(jnp.float32)

    def naive(h, w):
        logits = h @ w
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), t[:, None], -1)[:, 0]
        lse = jax.nn.logsumexp(logits, -1)
        return jnp.sum(nll * m) + 1e-2 * jnp.sum(lse ** 2 * m)

    def chunked(h, w):
        nll, z = chunked_cross_entropy(lambda hc, _: hc @ w, h, t, m, chunk)
        return nll + 1e-2 * z

    np.testing.assert_allclose(float(chunked(h, w)), float(naive(h, w)), rtol=1e-5)
    for a, b in zip(jax.grad(chunked, argnums=(0, 1))(h, w), jax.grad(naive, argnums=(0, 1))(h, w)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_sums_ignore_masked_tokens():
    logits = jnp.array([[0.0, 1.0], [5.0, -5.0]])
    nll, _ = cross_entropy_sums(logits, jnp.array([1, 1]), jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(float(nll), float(jnp.log1p(jnp.exp(-1.0))), rtol=1e-6)


def test_a_masked_padding_id_outside_the_vocabulary_adds_nothing():
    # A researcher pads targets with -1 or with an id >= vocab and masks them out: the value and the
    # gradient equal those without the padded tokens (the gathered logit there is NaN).
    w = jax.random.normal(jax.random.key(0), (8, 5), jnp.float32)
    h = jax.random.normal(jax.random.key(1), (4, 8), jnp.float32)
    t, m = jnp.array([1, 4, 5, -1]), jnp.array([1.0, 1.0, 0.0, 0.0])

    def loss(w, h, t, m):
        nll, z = chunked_cross_entropy(lambda hc, _: hc @ w, h, t, m, 2)
        return nll + 1e-2 * z

    value, grad = jax.value_and_grad(loss)(w, h, t, m)
    want, want_grad = jax.value_and_grad(loss)(w, h[:2], t[:2], m[:2])
    np.testing.assert_allclose(float(value), float(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-6, atol=1e-7)


def test_chunked_loss_keeps_peak_memory_at_chunk_size():
    """The compiled gradient's temporaries stay near chunk x vocab, far below tokens x vocab."""
    n, d, v, chunk = 4096, 32, 8192, 256
    h = jax.ShapeDtypeStruct((n, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    t = jax.ShapeDtypeStruct((n,), jnp.int32)
    m = jax.ShapeDtypeStruct((n,), jnp.float32)

    def loss(h, w, t, m, c):
        return chunked_cross_entropy(lambda hc, _: hc @ w, h, t, m, c)[0]

    def temp_bytes(c):
        return jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=4).lower(h, w, t, m, c).compile() \
            .memory_analysis().temp_size_in_bytes

    full_logits = n * v * 4
    assert temp_bytes(chunk) <= 3 * chunk * v * 4 < full_logits / 4  # a few chunk-sized buffers
    assert temp_bytes(n) >= full_logits  # a single chunk is the naive loss: it does hold all logits


def _autodiff_sums(logits, t, m):
    """The sums as plain JAX autodiff sees them (the reference for `cross_entropy_sums`' hand-written gradient)."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
    keep = m != 0
    return (jnp.sum(jnp.where(keep, (lse - target) * m, 0.0)),
            jnp.sum(jnp.where(keep, lse * lse * m, 0.0)))


def _sums_case():
    # 6 tokens over 9 columns, the last one padded (-inf): weights 1, 0.5 and 0, a masked id outside the vocabulary
    logits = 3.0 * jax.random.normal(jax.random.key(2), (6, 9), jnp.float32)
    logits = logits.at[:, 8].set(-jnp.inf).at[1, 3].set(40.0)  # row 1: its target nearly certain
    t = jnp.array([0, 3, 7, 2, -1, 11])
    m = jnp.array([1.0, 1.0, 0.5, 0.0, 0.0, 0.0])
    return logits, t, m


def test_the_hand_written_gradient_equals_autodiff_in_float32():
    # the chunked loss's gradient (`loss._sums_bwd`) against JAX's own, with the z-loss, a padded column,
    # fractional and zero mask weights and masked ids outside the vocabulary: the logits' and the mask's
    logits, t, m = _sums_case()

    def total(fn):
        return lambda lg, m: (lambda s: s[0] + 1e-2 * s[1])(fn(lg, t, m))

    got = jax.grad(total(cross_entropy_sums), argnums=(0, 1))(logits, m)
    want = jax.grad(total(_autodiff_sums), argnums=(0, 1))(logits, m)
    assert got[0].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-6, atol=1e-7)
    # the mask's gradient: autodiff's is NaN at a masked id outside the vocabulary (0 x the NaN gathered logit), ours 0
    np.testing.assert_allclose(np.asarray(got[1])[:4], np.asarray(want[1])[:4], rtol=1e-6, atol=1e-6)
    assert np.all(np.isnan(np.asarray(want[1])[4:])) and np.all(np.asarray(got[1])[4:] == 0)
    np.testing.assert_allclose(float(total(cross_entropy_sums)(logits, m)), float(total(_autodiff_sums)(logits, m)))
    assert np.all(np.asarray(got[0])[3:] == 0)  # masked tokens: exactly nothing


def test_bf16_logits_get_a_bf16_gradient_rounded_once():
    # the head GEMM's BF16 logits: the gradient comes back in BF16, the float32 gradient rounded once (not a float32
    # copy of the tile first); the sums are those of the same values in float32
    logits, t, m = _sums_case()
    lg16 = logits.astype(jnp.bfloat16)
    g16 = jax.grad(lambda lg: cross_entropy_sums(lg, t, m)[0])(lg16)
    g32 = jax.grad(lambda lg: _autodiff_sums(lg, t, m)[0])(lg16.astype(jnp.float32))
    assert g16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(g16.astype(jnp.float32)),
                                  np.asarray(g32.astype(jnp.bfloat16).astype(jnp.float32)))
    np.testing.assert_allclose(float(cross_entropy_sums(lg16, t, m)[1]), float(_autodiff_sums(lg16, t, m)[1]),
                               rtol=1e-6)


def test_one_pass_logsumexp_equals_jax():
    # the chunked loss's logsumexp (one variadic reduction): rows of random scale, a row 1,000 over the rest, padded
    # -inf columns first and last, BF16 input; against jax.nn.logsumexp in float32 (rtol 1e-6)
    x = 4.0 * jax.random.normal(jax.random.key(5), (7, 301), jnp.float32) * jnp.arange(1, 8)[:, None]
    x = x.at[2, 150].set(1000.0).at[:, 0].set(-jnp.inf).at[:, -3:].set(-jnp.inf)
    for a in (x, x.astype(jnp.bfloat16)):
        want = jax.nn.logsumexp(a.astype(jnp.float32), -1)
        np.testing.assert_allclose(np.asarray(logsumexp_rows(a)), np.asarray(want), rtol=1e-6)
