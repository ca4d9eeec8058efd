"""`model.fuse_projections`: q, k, v as one GEMM over the same parameters. The parameters and the logits
are those of the unfused model; under FP8 one state serves the three (fewer FP8 GEMMs, as
`accounting.fp8_gemms` counts and the HLO shows); a fused model trains. `model.fuse_mlp`: gate and up as
one GEMM where they are not FP8 GEMMs, the same function and gradients; under FP8 nothing changes."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.analysis import accounting
from yxanul_jax.analysis.hlo import count_dots
from yxanul_jax.core.config import FP8Config
from yxanul_jax.model.fp8 import FP8_COLLECTION
from yxanul_jax.model.transformer import Yxanul, init_variables
from yxanul_jax.training.stages import compile_stage

from conftest import micro_config, micro_model

OFF = FP8Config(enabled=False)


def test_same_parameters_and_logits_fused_or_not():
    plain, fused = micro_model(), micro_model(fuse_projections=True)
    p_plain = init_variables(plain, OFF, jax.random.key(0))["params"]
    p_fused = init_variables(fused, OFF, jax.random.key(0))["params"]
    assert jax.tree_util.tree_structure(p_plain) == jax.tree_util.tree_structure(p_fused)
    for a, b in zip(jax.tree_util.tree_leaves(p_plain), jax.tree_util.tree_leaves(p_fused)):
        np.testing.assert_array_equal(a, b)  # the same names, shapes and initial values: checkpoints and exports agree
    ids = jnp.arange(1, 40)[None, :]
    np.testing.assert_allclose(Yxanul(fused, OFF).apply({"params": p_plain}, ids),
                               Yxanul(plain, OFF).apply({"params": p_plain}, ids), rtol=1e-5, atol=1e-5)


def test_fp8_state_and_gemm_counts_follow_the_fusion():
    cfg = micro_config(fuse_projections=True)
    fp8 = FP8Config()
    variables = init_variables(cfg.model, fp8, jax.random.key(0))
    layer = variables[FP8_COLLECTION]["layer_0"]["attn"]
    assert "qkv" in layer and not {"q", "k", "v"} & set(layer)  # one state for the fused GEMM
    gemms = accounting.fp8_gemms(cfg.model, fp8)
    assert [t for t, _, _ in gemms] == ["qkv", "o", "gate", "up", "down", "head"][:len(gemms)]
    assert accounting.fp8_gemm_count(dataclasses.replace(cfg, fp8=fp8)) == 2 * 5 + ("head" in fp8.targets)
    # one compiled CPU step: 2 layers x 5 FP8 projections x (forward, input gradient, weight gradient)
    cfg = dataclasses.replace(cfg, fp8=fp8)
    dots = count_dots(compile_stage(cfg, cfg.curriculum[0]).as_text())
    assert dots["fp8"] == 2 * 5 * 3


def test_fuse_mlp_is_the_same_function_and_gradients_in_one_gemm():
    plain, fused = micro_model(fuse_projections=True), micro_model(fuse_projections=True, fuse_mlp=True)
    p = init_variables(plain, OFF, jax.random.key(0))["params"]
    p_fused = init_variables(fused, OFF, jax.random.key(0))["params"]
    assert jax.tree_util.tree_structure(p) == jax.tree_util.tree_structure(p_fused)
    ids = jnp.arange(1, 40)[None, :]

    def loss(params, cfg):  # a scalar of every logit: its gradient reaches gate and up through both halves
        logits = Yxanul(cfg, OFF).apply({"params": params}, ids)
        return jnp.sum(jnp.sin(logits))

    (l0, g0), (l1, g1) = (jax.value_and_grad(loss)(p, c) for c in (plain, fused))
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)):  # float32 references
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * np.max(np.abs(a)))
    # per layer forward: qkv, gate|up, down, o (4 GEMMs, not 5), the head's two and the embedding's one
    hlo = lambda c: jax.jit(lambda q: Yxanul(c, OFF).apply({"params": q}, ids)).lower(p).compile().as_text()  # noqa: E731
    assert count_dots(hlo(plain))["total"] - count_dots(hlo(fused))["total"] == plain.n_layers


def test_fuse_mlp_leaves_fp8_gate_and_up_two_gemms():
    fp8 = FP8Config()
    base, fused = micro_config(fuse_projections=True), micro_config(fuse_projections=True, fuse_mlp=True)
    states = [init_variables(c.model, fp8, jax.random.key(0))[FP8_COLLECTION] for c in (base, fused)]
    assert jax.tree_util.tree_structure(states[0]) == jax.tree_util.tree_structure(states[1])
    assert {"gate", "up"} <= set(states[1]["layer_0"]["mlp"])
