"""AdamW with decay on matrices only, and the learning-rate schedule including curriculum stages.

The schedule is one pure function of the optimizer step: global warmup, then cosine / WSD /
constant decay to `min_lr_ratio`, times the active stage's `lr_scale`, ramped over that stage's own
`warmup_steps`. Because it depends only on the step, a resumed run gets the same rates.
Gradient clipping is per stage and lives in the train step (it must leave FP8 state out).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from yxanul_jax.core.config import Config


def base_schedule(cfg: Config):
    """lr(step) before stage scaling: linear warmup, then the configured decay."""
    o, total = cfg.optim, cfg.train.steps
    peak, floor = o.lr, o.lr * o.min_lr_ratio
    warm = max(o.warmup_steps, 0)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm_lr = peak * (step + 1) / max(warm, 1)
        if o.schedule == "constant":
            decayed = jnp.asarray(peak, jnp.float32)
        elif o.schedule == "cosine":
            frac = jnp.clip((step - warm) / max(total - warm, 1), 0.0, 1.0)
            decayed = floor + 0.5 * (peak - floor) * (1 + jnp.cos(jnp.pi * frac))
        else:  # wsd: stable at peak, then linear decay over the last decay_fraction of the steps
            decay_start = total - o.decay_fraction * total
            frac = jnp.clip((step - decay_start) / max(total - decay_start, 1), 0.0, 1.0)
            decayed = peak - (peak - floor) * frac
        return jnp.where(step < warm, warm_lr, decayed)

    return schedule


def stage_scale(cfg: Config):
    """lr multiplier of the stage active at `step` (with its optional per-stage warmup ramp)."""
    starts = jnp.array([s.start_step for s in cfg.curriculum], jnp.float32)
    scales = jnp.array([s.lr_scale for s in cfg.curriculum], jnp.float32)
    warms = jnp.array([max(s.warmup_steps, 0) for s in cfg.curriculum], jnp.float32)

    def scale(step):
        step = jnp.asarray(step, jnp.float32)
        i = jnp.sum(step >= starts) - 1
        ramp = jnp.where(warms[i] > 0, jnp.minimum(1.0, (step - starts[i] + 1) / jnp.maximum(warms[i], 1)), 1.0)
        return scales[i] * ramp

    return scale


def lr_schedule(cfg: Config):
    base, scale = base_schedule(cfg), stage_scale(cfg)
    return lambda step: base(step) * scale(step)


def decay_mask(params):
    """Weight decay on matrices (ndim >= 2) only: never on norm scales."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """AdamW; moments take the parameters' dtype (float32 master weights -> float32 moments)."""
    o = cfg.optim
    return optax.adamw(learning_rate=lr_schedule(cfg), b1=o.b1, b2=o.b2, eps=o.eps,
                       weight_decay=o.weight_decay, mask=decay_mask)


def clip_by_global_norm(grads, max_norm: float):
    """(clipped grads, pre-clip global norm); max_norm <= 0 disables clipping."""
    norm = optax.tree.norm(grads)
    if max_norm <= 0:
        return grads, norm
    factor = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree_util.tree_map(lambda g: g * factor.astype(g.dtype), grads), norm
