"""Model: parameter counts against an independent formula, causality, GQA and RoPE references, gradients."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import FP8Config, load_config
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.analysis.accounting import param_breakdown
from yxanul_jax.analysis.hlo import count_dots
from yxanul_jax.model.backends import PLAIN
from yxanul_jax.model.transformer import Attention, Yxanul, apply_rope, init_variables, rope_tables
from yxanul_jax.plan import build_plan

from conftest import REPO, micro_model, no_fp8

CONFIGS = sorted(str(p) for p in (REPO / "configs").glob("*.yaml"))


def formula_params(m) -> int:
    """Independent count: per layer Q, K, V, O, SwiGLU, two norms; embedding; head; final norm."""
    d, k = m.d_model, (m.head_dim or m.d_model // m.n_heads)
    per_layer = d * m.n_heads * k * 2 + 2 * d * m.n_kv_heads * k + 3 * d * m.ffn_dim + 2 * d
    r, v = m.embed_rank, m.vocab_size
    embedding = v * r + r * d if r else v * d
    head = {"tied": 0, "factorized": d * r, "untied": d * v}[m.head]
    return m.n_layers * per_layer + embedding + head + d


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.rsplit("/", 1)[-1])
def test_shipped_config_param_counts_match_formula(path):
    cfg = load_config(path)
    plan = build_plan(cfg)
    assert plan["params_total"] == formula_params(cfg.model)
    assert sum(plan["params_by_component"].values()) == plan["params_total"]


def test_reference_figures_from_the_spec():
    m197 = load_config(str(REPO / "configs/yxanul_197m.yaml")).model
    assert formula_params(m197) == 196_398_464
    assert round(formula_params(dataclasses.replace(m197, head="factorized")) / 1e6, 2) == 196.50
    assert round(formula_params(load_config(str(REPO / "configs/yxanul_270m.yaml")).model) / 1e6, 1) == 273.3


def _variables(m, fp8, tokens, key=0):
    """Fresh variables; with FP8, the state after one train step (delayed scales in use)."""
    model = Yxanul(m, fp8)
    variables = init_variables(m, fp8, jax.random.key(key))
    if fp8.active:
        params, state = fp8_lib.split_state(variables)
        state = jax.grad(_loss, argnums=2)(model, params, state, tokens)
        variables = {"params": params, **state}
    return variables


@pytest.mark.parametrize("fp8", [no_fp8(), FP8Config(amax_history_len=4)], ids=["bf16", "fp8"])
def test_causality(fp8):
    m = micro_model()
    model = Yxanul(m, fp8)
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, m.vocab_size)
    variables = _variables(m, fp8, tokens)
    t = 11
    changed = tokens.at[:, t].set((tokens[:, t] + 1) % m.vocab_size)
    a, b = model.apply(variables, tokens), model.apply(variables, changed)
    np.testing.assert_array_equal(np.asarray(a[:, :t]), np.asarray(b[:, :t]))
    assert not np.allclose(np.asarray(a[:, t:]), np.asarray(b[:, t:]))


def _reference_attention(p, x_BxLxD, m):
    """Plain multi-head attention in float32 einsums, kv heads repeated to the query heads."""
    B, L, D = x_BxLxD.shape
    H, G, K = m.n_heads, m.n_kv_heads, m.resolved_head_dim
    q = (x_BxLxD @ p["q"]["kernel"]).reshape(B, L, H, K)
    k = (x_BxLxD @ p["k"]["kernel"]).reshape(B, L, G, K)
    v = (x_BxLxD @ p["v"]["kernel"]).reshape(B, L, G, K)
    sin, cos = rope_tables(L, K, m.rope_theta)
    q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
    k, v = jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(K)
    s = jnp.where(jnp.tril(jnp.ones((L, L), bool)), s, -jnp.inf)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), v).reshape(B, L, H * K)
    return o @ p["o"]["kernel"]


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_attention_matches_einsum_reference(kv_heads):
    m = micro_model(n_heads=4, n_kv_heads=kv_heads)
    x = jax.random.normal(jax.random.key(2), (2, 16, m.d_model), jnp.float32)
    attn = Attention(m, PLAIN)
    sin, cos = rope_tables(16, m.resolved_head_dim, m.rope_theta)
    variables = jax.tree_util.tree_map(lambda a: a, attn.init(jax.random.key(3), x, sin, cos))
    variables = __import__("flax").linen.meta.unbox(variables)
    got, cache = attn.apply(variables, x, sin, cos)
    assert cache is None  # training: no KV cache
    want = _reference_attention(variables["params"], x, m)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    K, L = 16, 32
    q = jax.random.normal(jax.random.key(4), (K,))
    k = jax.random.normal(jax.random.key(5), (K,))
    sin, cos = rope_tables(L, K, 10_000.0)
    q_L = apply_rope(jnp.broadcast_to(q, (1, L, 1, K)), sin, cos)[0, :, 0]
    k_L = apply_rope(jnp.broadcast_to(k, (1, L, 1, K)), sin, cos)[0, :, 0]
    s_LxL = np.asarray(q_L @ k_L.T)
    for shift in (1, 5, 13):
        np.testing.assert_allclose(s_LxL[shift:, shift:], s_LxL[:-shift, :-shift], rtol=1e-4, atol=1e-4)
    assert not np.allclose(s_LxL[0, 0], s_LxL[5, 0])  # but it does depend on the offset


def _loss(model, params, state, tokens):
    logits = model.apply({"params": params, **state}, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


@pytest.mark.parametrize("overrides", [
    dict(), dict(head="factorized"), dict(head="untied", embed_rank=0), dict(head="tied", embed_rank=0),
    dict(scan_layers=True, remat="full"),
], ids=["tied-factorized", "factorized-head", "untied-full", "tied-full", "scan-remat"])
def test_every_parameter_gets_a_nonzero_gradient(overrides):
    m = micro_model(**overrides)
    fp8 = FP8Config(amax_history_len=4, scaling="current")  # a fresh state: the bootstrap step's scaling
    model = Yxanul(m, fp8)
    params, state = fp8_lib.split_state(init_variables(m, fp8, jax.random.key(0)))
    tokens = jax.random.randint(jax.random.key(6), (2, 17), 0, m.vocab_size)
    grads = jax.grad(_loss, argnums=1)(model, params, state, tokens)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert float(jnp.max(jnp.abs(g))) > 0, jax.tree_util.keystr(path)
    assert set(param_breakdown(params)) == {"embedding", "attention", "mlp", "norms", "head"}
    padded = sum(param_breakdown(params).values()) - sum(param_breakdown(params, m).values())
    assert padded == m.vocab_padding_params == (112 - 97) * ((m.embed_rank or m.d_model)
                                                             + (m.d_model if m.head == "untied" else 0))


def test_scan_and_remat_match_the_unrolled_model():
    m = micro_model()
    tokens = jax.random.randint(jax.random.key(7), (2, 12), 0, m.vocab_size)
    v_loop = init_variables(m, no_fp8(), jax.random.key(0))
    p = v_loop["params"]
    layers = [p[f"layer_{i}"] for i in range(m.n_layers)]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    p_scan = {k: v for k, v in p.items() if not k.startswith("layer_")} | {"layers": stacked}
    m_scan = dataclasses.replace(m, scan_layers=True, remat="dots")
    want = Yxanul(m, no_fp8()).apply({"params": p}, tokens)
    got = Yxanul(m_scan, no_fp8()).apply({"params": p_scan}, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    g_loop = jax.grad(_loss, argnums=1)(Yxanul(m, no_fp8()), p, {}, tokens)
    g_scan = jax.grad(_loss, argnums=1)(Yxanul(m_scan, no_fp8()), p_scan, {}, tokens)
    np.testing.assert_allclose(np.asarray(g_scan["layers"]["mlp"]["up"]["kernel"][1]),
                               np.asarray(g_loop["layer_1"]["mlp"]["up"]["kernel"]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_an_unrolled_scan_is_the_same_model_with_the_same_gradients(remat):
    # model.scan_unroll = n_layers: the same stacked parameters, no loop in the compiled step, and a
    # rematerialized layer is still recomputed
    m = micro_model(scan_layers=True, remat=remat, n_layers=3)
    unrolled = dataclasses.replace(m, scan_unroll=3)
    assert m.layer_loop and not unrolled.layer_loop
    v = init_variables(m, no_fp8(), jax.random.key(0))
    v_un = init_variables(unrolled, no_fp8(), jax.random.key(0))
    for a, b in zip(jax.tree_util.tree_leaves(v), jax.tree_util.tree_leaves(v_un)):
        np.testing.assert_array_equal(a, b)
    tokens = jax.random.randint(jax.random.key(7), (2, 12), 0, m.vocab_size)
    g = [jax.jit(jax.value_and_grad(_loss, argnums=1), static_argnums=0)(Yxanul(c, no_fp8()), v["params"], {}, tokens)
         for c in (m, unrolled)]
    np.testing.assert_allclose(g[1][0], g[0][0], rtol=1e-6)  # float32: the same sums, maybe in another order
    for a, b in zip(jax.tree_util.tree_leaves(g[0][1]), jax.tree_util.tree_leaves(g[1][1])):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(a))))
    grad = jax.jit(jax.grad(_loss, argnums=1), static_argnums=0)
    hlo = grad.lower(Yxanul(unrolled, no_fp8()), v["params"], {}, tokens).compile().as_text()
    assert " while(" not in hlo  # no loop over the layers
    # a rematerialized layer runs its forward GEMMs again: 3 layers x (q, k, v, o, gate, up and attention's two;
    # down's output is not needed again: 8). XLA CPU keeps them even without remat's CSE barrier; the sm_90 test
    # of the unrolled `full` step (test_gpu_target) is the one that fails without it.
    if remat == "full":
        plain = dataclasses.replace(unrolled, remat="none")
        n_none = count_dots(grad.lower(Yxanul(plain, no_fp8()), v["params"], {}, tokens).compile().as_text())["total"]
        assert count_dots(hlo)["total"] - n_none == 3 * 8


def test_hidden_then_logits_equals_call_and_dtypes():
    m = micro_model(dtype="bfloat16")
    model = Yxanul(m, FP8Config(amax_history_len=4))
    v = init_variables(m, model.fp8, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(8), (2, 8), 0, m.vocab_size)
    h = model.apply(v, tokens, method=Yxanul.hidden)
    assert h.shape == (2, 8, m.d_model) and h.dtype == jnp.bfloat16
    logits = model.apply(v, h, method=Yxanul.logits)
    assert logits.dtype == jnp.float32 and logits.shape == (2, 8, m.padded_vocab) and m.padded_vocab == 112
    assert np.all(np.isneginf(np.asarray(logits[..., m.vocab_size:])))  # padded rows: probability 0
    assert np.all(np.isfinite(np.asarray(logits[..., :m.vocab_size])))
    np.testing.assert_array_equal(np.asarray(logits[..., :m.vocab_size]), np.asarray(model.apply(v, tokens)))
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(v["params"]))  # FP32 master weights


def test_parameters_carry_logical_axis_names():
    import flax.linen as nn

    m = micro_model(scan_layers=True)
    boxed = Yxanul(m, no_fp8()).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    specs = nn.get_partition_spec(boxed)["params"]
    assert tuple(specs["embedding"]) == ("vocab", "embed_rank")
    assert tuple(specs["layers"]["attn"]["q"]["kernel"]) == ("layers", "embed", "heads")
    assert tuple(specs["layers"]["mlp"]["down"]["kernel"]) == ("layers", "mlp", "embed")


def test_auto_attention_is_short_on_short_sequences_and_cudnn_beyond():
    from yxanul_jax.model.transformer import SHORT_ATTENTION_MAX_SEQ, attention_implementation

    m = load_config("configs/yxanul_197m.yaml").model
    by_seq = {s: attention_implementation(m, "gpu", s) for s in (8, 16, 32, 64, 2048)}
    assert SHORT_ATTENTION_MAX_SEQ == 32
    assert by_seq == {8: "short", 16: "short", 32: "short", 64: "cudnn", 2048: "cudnn"}
    assert attention_implementation(m, "gpu") == "cudnn"  # no length: the long-sequence answer
    assert {attention_implementation(m, "cpu", s) for s in (8, 2048)} == {"xla"}
    forced = dataclasses.replace(m, attention="cudnn")
    assert attention_implementation(forced, "gpu", 8) == "cudnn"  # an explicit choice is kept



def test_materialized_grad_is_the_identity_and_its_gradient_too():
    # transformer.materialized_grad only keeps XLA from fusing the gradient's producers into its consumers
    from yxanul_jax.model.transformer import materialized_grad

    x = jax.random.normal(jax.random.key(5), (4, 24)).astype(jnp.bfloat16)
    f = lambda x: jnp.sum(jnp.sin(x.astype(jnp.float32)) * 3.0)  # noqa: E731
    np.testing.assert_array_equal(materialized_grad(x), x)
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda x: f(materialized_grad(x))))(x), jax.jit(jax.grad(f))(x))


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_swiglu_gradient_equals_autodiff_of_its_forward(dtype, tol):
    # transformer.swiglu's hand-written backward (one fused kernel on sm_90) against jax's own derivative of
    # silu(gate) * up, computed in float32; bfloat16 inputs round the gradients to bfloat16 (relative 1e-2)
    from yxanul_jax.model.transformer import swiglu

    k = jax.random.split(jax.random.key(3), 3)
    gate, up, dh = ((3.0 * jax.random.normal(kk, (64, 96))).astype(dtype) for kk in k)
    ref = lambda g, u: jax.nn.silu(g) * u  # noqa: E731
    _, vjp = jax.vjp(swiglu, gate, up)
    _, vjp_ref = jax.vjp(ref, gate.astype(jnp.float32), up.astype(jnp.float32))
    # the forward is float32's, rounded once to the inputs' dtype
    np.testing.assert_array_equal(swiglu(gate, up), ref(gate.astype(jnp.float32), up.astype(jnp.float32)).astype(dtype))
    for got, want in zip(vjp(dh), vjp_ref(dh.astype(jnp.float32))):
        assert got.dtype == dtype
        got, want = np.asarray(got, np.float32), np.asarray(want)
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


@pytest.mark.parametrize("L, G", [(16, 2), (1, 1), (32, 6)])
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_short_attention_equals_jax_xla_attention_with_its_gradients(dtype, tol, L, G):
    # transformer.short_attention (auto's choice on a GPU up to 32 tokens) against jax.nn.dot_product_attention's
    # XLA implementation: causal, 6 query heads over G kv heads (multi-query, grouped, multi-head), rows of 1 to
    # 32 tokens; bfloat16 rounds outputs and gradients
    from yxanul_jax.model.transformer import short_attention

    H = 6
    k = jax.random.split(jax.random.key(5), 4)
    q = jax.random.normal(k[0], (3, L, H, 32)).astype(dtype)
    kk = jax.random.normal(k[1], (3, L, G, 32)).astype(dtype)
    v = jax.random.normal(k[2], (3, L, G, 32)).astype(dtype)
    do = jax.random.normal(k[3], (3, L, H, 32)).astype(dtype)
    ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")  # noqa: E731
    out, vjp = jax.vjp(short_attention, q, kk, v)
    out_r, vjp_r = jax.vjp(ref, q, kk, v)
    assert out.dtype == dtype
    for got, want in zip((out, *vjp(do)), (out_r, *vjp_r(do))):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert got.shape == want.shape and np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))
    # causal: the first token attends to itself alone
    np.testing.assert_allclose(np.asarray(out[:, 0], np.float32), np.asarray(v[:, 0].repeat(H // G, 1), np.float32),
                               rtol=tol, atol=tol)


def test_the_attention_remat_policy_names_jaxs_cudnn_primitive():
    # remat=attention matches cuDNN's forward by its jax primitive's name: were jax to rename it, the policy
    # would silently become `full` while the planner still budgets the saved output. Checked here, on any CPU.
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    from yxanul_jax.model.transformer import CUDNN_ATTENTION_FWD, REMAT_POLICIES

    prim = cudnn_attention._dot_product_attention_fwd_p_wrapper
    assert prim.name == CUDNN_ATTENTION_FWD
    assert REMAT_POLICIES["attention"](prim) and not REMAT_POLICIES["attention"](jax.lax.exp_p)


def test_a_model_built_in_code_names_its_mistakes():
    """A researcher's own ModelConfig is checked when the model is set up (not only by the config loader), and token
    ids without a batch axis are named, rather than a shape error deep inside RoPE or an IndexError."""
    from yxanul_jax.core.config import ModelConfig
    from yxanul_jax.core.errors import UserError

    with pytest.raises(UserError, match="head dimension 3 must be even for RoPE"):
        init_variables(ModelConfig(d_model=96, n_heads=32), no_fp8(), jax.random.key(0))
    m = micro_model()
    variables = init_variables(m, no_fp8(), jax.random.key(0))
    for method in (None, Yxanul.hidden):
        with pytest.raises(ValueError, match=r"token ids must be \[batch, length\], got shape \(5,\); add a batch"):
            Yxanul(m, no_fp8()).apply(variables, jnp.zeros((5,), jnp.int32), method=method)
