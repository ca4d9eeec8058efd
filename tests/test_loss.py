"""Chunked cross-entropy equals the naive full-logits loss, value and gradient."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.model.loss import chunked_cross_entropy, cross_entropy_sums


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
