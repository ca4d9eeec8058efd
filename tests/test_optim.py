"""The learning-rate schedule at its landmarks (warmup, stage boundaries with lr_scale and ramps, the end),
WSD, weight decay on matrices only, and clipping."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.model.fp8 import split_state
from yxanul_jax.model.transformer import init_variables
from yxanul_jax.training.optim import clip_by_global_norm, decay_mask, lr_schedule, make_optimizer

# 100 steps, peak 1e-3, floor 1e-4, 10 warmup steps; stage 1 from step 40 at half the rate with a
# 10-step ramp, stage 2 from step 70 at full rate and no ramp.
BASE = ["train.steps=100", "optim.lr=1e-3", "optim.min_lr_ratio=0.1", "optim.warmup_steps=10",
        "curriculum=[{start_step: 0}, {start_step: 40, lr_scale: 0.5, warmup_steps: 10}, {start_step: 70}]"]


def _lr(*overrides):
    sched = lr_schedule(load_config(None, BASE + list(overrides)))
    return lambda step: float(sched(step))


def _cosine(step, peak=1e-3, floor=1e-4, warm=10, total=100):
    frac = min(max((step - warm) / (total - warm), 0.0), 1.0)
    return floor + 0.5 * (peak - floor) * (1 + np.cos(np.pi * frac))


def test_warmup_then_cosine_with_stage_scales_and_ramps():
    lr = _lr()
    assert lr(0) == pytest.approx(1e-4)  # (step + 1) / warmup of the peak: never zero
    assert lr(9) == pytest.approx(1e-3)  # warmup ends at the peak
    assert lr(10) == pytest.approx(_cosine(10)) == pytest.approx(1e-3)
    assert lr(39) == pytest.approx(_cosine(39))  # stage 0 at full rate
    assert lr(40) == pytest.approx(_cosine(40) * 0.5 * 1 / 10)  # stage 1: ramp step 1 of 10 of lr_scale 0.5
    assert lr(49) == pytest.approx(_cosine(49) * 0.5)  # ramp done
    assert lr(69) == pytest.approx(_cosine(69) * 0.5)
    assert lr(70) == pytest.approx(_cosine(70))  # stage 2: lr_scale 1, no ramp
    assert lr(99) == pytest.approx(_cosine(99), rel=1e-5)
    assert lr(100) == pytest.approx(1e-4) and lr(1000) == pytest.approx(1e-4)  # the floor, never below


def test_an_unset_lr_is_the_optimizer_s_own_and_a_set_one_is_kept():
    """optim.lr unset: AdamW alone peaks at 0.003, Muon's AdamW group at 0.012 (each the demo's better rate,
    docs/QUALITY.md); the Muon group at muon_lr whatever lr is; an explicit lr (YAML, override) is kept."""
    from yxanul_jax.core.config import DEFAULT_LR
    from yxanul_jax.core.errors import UserError

    assert DEFAULT_LR == {"adamw": 3e-3, "muon": 0.012}
    one = ["optim.warmup_steps=1", "optim.muon_lr=0.005"]
    for overrides, peak in (([], 0.012), (["optim.name=adamw"], 3e-3), (["optim.lr=0.002"], 0.002),
                            (["optim.name=adamw", "optim.lr=0.002"], 0.002), (["optim.lr=null"], 0.012)):
        cfg = load_config(None, one + overrides)
        assert cfg.optim.peak_lr == peak and float(lr_schedule(cfg)(0)) == pytest.approx(peak), overrides
    assert load_config().optim.lr is None  # left unset in the resolved config: the optimizer's own
    # The Muon group steps at muon_lr whatever lr is (set, or the optimizer's own): its first update is the same.
    cfg = load_config("configs/tiny.yaml", one)
    params, _ = split_state(init_variables(cfg.model, cfg.fp8, jax.random.key(0)))
    grads = jax.tree.map(jnp.ones_like, params)
    steps = []
    for lr in (None, 0.002):
        c = load_config("configs/tiny.yaml", one + ([f"optim.lr={lr}"] if lr else []))
        opt = make_optimizer(c)
        updates, _ = opt.update(grads, opt.init(params), params)
        steps.append(float(jnp.abs(updates["layer_0"]["attn"]["q"]["kernel"]).max()))
    assert steps[0] == pytest.approx(steps[1], rel=1e-6)  # the Muon group does not move with lr
    with pytest.raises(UserError, match="'optim.lr' must be positive, or null for the optimizer's own, got 0"):
        load_config(None, ["optim.lr=0"])


def test_wsd_is_stable_then_decays_linearly_over_the_last_fraction():
    lr = _lr("optim.schedule=wsd", "optim.decay_fraction=0.2", "curriculum=[{start_step: 0}]")
    assert lr(10) == pytest.approx(1e-3) and lr(79) == pytest.approx(1e-3) and lr(80) == pytest.approx(1e-3)
    assert lr(90) == pytest.approx(1e-3 - 0.9e-3 * 0.5)
    assert lr(100) == pytest.approx(1e-4)


def test_constant_schedule_after_warmup():
    lr = _lr("optim.schedule=constant", "curriculum=[{start_step: 0}]")
    assert lr(4) == pytest.approx(5e-4) and lr(10) == pytest.approx(1e-3) and lr(99) == pytest.approx(1e-3)


def test_decay_only_on_matrices_and_clip_leaves_small_gradients_alone():
    params = {"kernel": jnp.ones((4, 4)), "scale": jnp.ones((4,))}
    assert decay_mask(params) == {"kernel": True, "scale": False}
    # every parameter of the real models, scanned (norm scales stacked to [n_layers, D]) or not
    for scan in ("true", "false"):
        cfg = load_config("configs/tiny.yaml", [f"model.scan_layers={scan}", "model.n_layers=2"])
        model_params = init_variables(cfg.model, cfg.fp8, jax.random.key(0))["params"]
        decayed = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(decay_mask(model_params))}
        norms = [k for k in decayed if "norm" in k]
        assert len(norms) == (3 if scan == "true" else 5) and not any(decayed[k] for k in norms), decayed
        assert all(v for k, v in decayed.items() if k.endswith("['kernel']") or "embedding" in k), decayed
        # one update of zero gradients, AdamW's or Muon's: the decay moves the matrices, never a norm scale
        for name in ("adamw", "muon"):
            opt = make_optimizer(load_config("configs/tiny.yaml", [
                f"model.scan_layers={scan}", "model.n_layers=2", f"optim.name={name}", "optim.weight_decay=0.1",
                "optim.muon_weight_decay=0.1"]))
            zeros = jax.tree_util.tree_map(jnp.zeros_like, model_params)
            updates, _ = opt.update(zeros, opt.init(model_params), model_params)
            for path, u in jax.tree_util.tree_leaves_with_path(updates):
                assert bool(jnp.any(u != 0)) == decayed[jax.tree_util.keystr(path)], (name, jax.tree_util.keystr(path))
    grads = {"a": jnp.full((3,), 4.0), "b": jnp.zeros((2, 2))}
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert float(norm) == pytest.approx(np.sqrt(48.0))
    assert float(jnp.linalg.norm(clipped["a"])) == pytest.approx(1.0, rel=1e-5)
    same, _ = clip_by_global_norm(grads, 100.0)
    np.testing.assert_array_equal(np.asarray(same["a"]), np.asarray(grads["a"]))
    off, _ = clip_by_global_norm(grads, 0.0)  # 0 disables clipping
    np.testing.assert_array_equal(np.asarray(off["a"]), np.asarray(grads["a"]))


def test_a_warmup_as_long_as_the_run_is_warned_with_the_rate_it_ends_at():
    from yxanul_jax.training.optim import warmup_warning

    assert warmup_warning(load_config(None, BASE)) is None  # 10 of 100 steps
    half = load_config(None, [*BASE, "optim.warmup_steps=200"])
    assert warmup_warning(half) == (
        "optim.warmup_steps (200) is not below train.steps (100): the learning rates rise through the whole run (the "
        "last step at 50% of the peak), and the cosine decay never starts; set optim.warmup_steps=10 or so for a full "
        "schedule")
    assert _lr("optim.warmup_steps=200")(99) == pytest.approx(0.5e-3)  # the rate the warning names (stage 2: x1)
    whole = warmup_warning(load_config(None, [*BASE, "optim.warmup_steps=100", "optim.schedule=constant"]))
    assert "(the last step at 100% of the peak); set" in whole  # a constant schedule has no decay to name
