"""The optimizer (Muon for the hidden matrices, the default; or AdamW throughout), decay on matrices only, and the
learning-rate schedule including curriculum stages.

`optim.name: muon` partitions the parameters (`optax.partition`): the attention and FFN kernels of the
blocks get `muon.scale_by_muon` (optax's Nesterov momentum orthogonalized by Newton-Schulz, one batched chain per
matrix shape; a scanned [n_layers, I, O] kernel is n_layers matrices) times the width scaling
sqrt(max(1, O / I)) (`width_scale`, as Keller Jordan's Muon and `optax.contrib.muon`), everything else (the
embedding table, the head's factors, the norm scales) AdamW. Written here rather than taken whole from
`optax.contrib.muon`: that bundles its own Nesterov Adam for the other leaves, with no weight-decay mask
(it would decay the norm scales) and none of our AdamW settings. Both groups follow the same schedule
(warmup, decay, stage `lr_scale`), each at its own peak (`optim.lr`, unset: the optimizer's own, `peak_lr`;
`optim.muon_lr`).

The schedule is one pure function of the optimizer step: global warmup, then cosine / WSD /
constant decay to `min_lr_ratio`, times the active stage's `lr_scale`, ramped over that stage's own
`warmup_steps`. Because it depends only on the step, a resumed run gets the same rates.

A resumed run whose train.steps differs from its checkpoint's (a finished run asked for more) would get a
different schedule, jumping at the first new step (a cosine at its floor back to mid-decay). `continued`
refuses that unless `train.extend` says how to go on (`decay`: from the current rate down to the floor at the
new end; `wsd`: back at the peak, then the last `decay_fraction` of the new total decaying), and records the
choice as `optim.continue_as/continue_from/continue_lr/continue_peak`, which every later resume carries over from
the checkpoint's config, so the schedule stays one pure function of the step (and of optim.lr, as it always is:
`peak_lr`).
Gradient clipping is per stage and lives in the train step (it must leave FP8 state out).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from yxanul_jax.core.config import Config, OptimConfig, from_saved
from yxanul_jax.core.errors import UserError
from yxanul_jax.model.transformer import stacked_axes
from yxanul_jax.training.muon import products_dtype, scale_by_muon


def _decay(shape: str, step, start: float, end: float, high: float, low: float):
    """`high` at `start` down to `low` at `end` (and after): half a cosine or a straight line."""
    frac = jnp.clip((step - start) / max(end - start, 1), 0.0, 1.0)
    if shape == "cosine":
        return low + 0.5 * (high - low) * (1 + jnp.cos(jnp.pi * frac))
    return high - (high - low) * frac


def wsd_decay_start(cfg: Config, start: int = 0) -> float:
    """The step at which a WSD schedule (or a `wsd` continuation from `start`) begins its decay: the last
    `decay_fraction` of the total, never before `start`."""
    total = cfg.train.steps
    return max(total - cfg.optim.decay_fraction * total, start)


def base_schedule(cfg: Config) -> optax.Schedule:
    """lr(step) before stage scaling: linear warmup, then the configured decay; from `optim.continue_from`
    on, the continuation `optim.continue_as` (see the module's docstring)."""
    o, total = cfg.optim, cfg.train.steps
    peak, floor = o.peak_lr, o.peak_lr * o.min_lr_ratio
    warm = max(o.warmup_steps, 0)
    shape = "linear" if o.schedule == "wsd" else o.schedule

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm_lr = peak * (step + 1) / max(warm, 1)
        if o.schedule == "constant":
            decayed = jnp.asarray(peak, jnp.float32)
        elif o.schedule == "cosine":
            decayed = _decay("cosine", step, warm, total, peak, floor)
        else:  # wsd: stable at peak, then linear decay over the last decay_fraction of the steps
            decayed = _decay("linear", step, wsd_decay_start(cfg), total, peak, floor)
        lr = jnp.where(step < warm, warm_lr, decayed)
        if o.continue_as == "decay":  # the configured shape, from the rate reached at continue_from
            kept = _decay(shape, step, o.continue_from, total, continuation_lr(o), floor)
            lr = jnp.where(step >= o.continue_from, kept, lr)
        elif o.continue_as == "wsd":  # stable at the peak, then a linear decay to the floor at the new end
            start = wsd_decay_start(cfg, o.continue_from)
            lr = jnp.where(step >= o.continue_from, _decay("linear", step, start, total, peak, floor), lr)
        return lr

    return schedule


def warmup_warning(cfg: Config) -> str | None:
    """The warning for a warmup as long as the run (`optim.warmup_steps` >= `train.steps`): the rates rise to the
    last step (at most to their peak) and the decay never starts. None otherwise, and for a run whose schedule
    `train.extend` continued."""
    o, total = cfg.optim, cfg.train.steps
    if o.warmup_steps < total or o.continue_as != "none":
        return None
    end = "" if o.schedule == "constant" else f", and the {o.schedule} decay never starts"
    fix = "optim.warmup_steps=0 (no warmup)" if total < 10 else f"optim.warmup_steps={total // 10} or so"
    return (f"optim.warmup_steps ({o.warmup_steps}) is not below train.steps ({total}): the learning rates rise "
            f"through the whole run (the last step at {total / max(o.warmup_steps, 1):.0%} of the peak){end}; set "
            f"{fix} for a full schedule")


def continuation_lr(o: OptimConfig) -> float:
    """The rate a `decay` continuation starts from (`optim.continue_lr`), scaled as optim.lr has been since it was
    recorded (`optim.continue_peak`)."""
    return o.continue_lr * (o.peak_lr / o.continue_peak if o.continue_peak else 1.0)


def continued(cfg: Config, saved: dict | None, step: int) -> Config:
    """`cfg` for a run resumed at `step` from a checkpoint whose resolved config is `saved` (a dict; None or
    unreadable: `cfg` as it is): the checkpoint's schedule continuation carried over, and, when train.steps
    changed so that the schedule would jump at `step`, the continuation `train.extend` chooses recorded from
    `step` on. `refuse` (the default) raises UserError saying what would happen and the two choices."""
    try:
        old = from_saved(saved) if isinstance(saved, dict) else None
    except (UserError, TypeError, ValueError):
        old = None
    if old is None:
        return cfg
    carried = {k: getattr(old.optim, k) for k in ("continue_as", "continue_from", "continue_lr", "continue_peak")}
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, **carried))
    before, after = old.train.steps, cfg.train.steps
    if before == after or step <= 0 or step >= after:  # same schedule, nothing trained yet, or nothing to train
        return cfg
    as_saved = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=before))
    was, now = float(base_schedule(as_saved)(step)), float(base_schedule(cfg)(step))
    if abs(now - was) <= 1e-6 * max(abs(was), 1e-12):
        return cfg  # no jump (the stable phase of a WSD run, a constant schedule): the new end holds
    o, how = cfg.optim, cfg.train.extend
    floor = o.peak_lr * o.min_lr_ratio
    if how == "refuse":
        wsd_from = int(wsd_decay_start(cfg, step))
        decay = (f"stays at the floor {floor:.3g} to step {after}" if math.isclose(was, floor, rel_tol=1e-4)
                 else f"from {was:.3g} down to {floor:.3g} at step {after}")
        peak = ("" if math.isclose(old.optim.peak_lr, o.peak_lr) else
                f" (rates at this command's optim.lr {o.peak_lr:.3g}; the run trained at {old.optim.peak_lr:.3g})")
        raise UserError(
            f"train.steps went from {before} to {after} on a run resuming at step {step}: its {o.schedule} "
            f"schedule would jump from lr {was:.3g} to {now:.3g} there{peak}; choose how it goes on: train.extend=decay "
            f"({decay}, no jump) or train.extend=wsd (back at the peak "
            f"{o.peak_lr:.3g} from step {step}, decaying to {floor:.3g} from step {wsd_from} to {after})")
    optim = dataclasses.replace(o, continue_as=how, continue_from=int(step), continue_lr=was, continue_peak=o.peak_lr)
    return dataclasses.replace(cfg, optim=optim)


def stage_scale(cfg: Config) -> optax.Schedule:
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


def lr_schedule(cfg: Config) -> optax.Schedule:
    base, scale = base_schedule(cfg), stage_scale(cfg)
    return lambda step: base(step) * scale(step)


def decay_mask(params: Any) -> Any:  # a pytree of arrays -> the same tree with a bool per leaf
    """Weight decay on matrices only (two or more axes besides a scanned stack's layer axis): never on norm scales,
    which the scanned layers stack to [n_layers, D]."""
    return jax.tree_util.tree_map_with_path(lambda path, p: p.ndim - stacked_axes(path) >= 2, params)


MUON_MODULES = ("attn", "mlp")  # the blocks' projections: q, k, v, o, gate, up, down (TE's fused names too)


def muon_labels(params: Any) -> Any:  # a pytree of arrays -> the same tree with "muon" or "adamw" per leaf
    """"muon" for every kernel of the blocks' attention and FFN, "adamw" for the rest."""
    def label(path, leaf):
        names = [str(getattr(k, "key", k)) for k in path]
        in_block = stacked_axes(path) or any(n.startswith("layer_") for n in names)
        return "muon" if in_block and names[-1] == "kernel" and set(names) & set(MUON_MODULES) else "adamw"

    return jax.tree_util.tree_map_with_path(label, params)


def width_scale(update: jax.Array) -> jax.Array:
    """Muon's width scaling: an orthogonalized update of a [..., fan_in, fan_out] kernel times
    sqrt(max(1, fan_out / fan_in)), so a wide matrix (gate, up: [D, F > D]) moves its outputs as far per step as
    a square one (Keller Jordan's Muon; `optax.contrib.muon`'s default, which its `scale_by_muon` alone leaves out)."""
    return update * math.sqrt(max(1.0, update.shape[-1] / update.shape[-2]))


def decayed_weights(weight_decay: float, mask: Callable[[Any], Any] | None = None, cautious: bool = False,
                    scale: Callable[[jax.Array], jax.Array] | None = None) -> optax.GradientTransformation:
    """Decoupled weight decay (added before the learning rate scales the update, as optax's AdamW does);
    `cautious`: only where the update and the weight agree in sign (the decay then never works against
    the step). `mask(params)`: which leaves decay. `scale(update)`: applied to each update first (Muon's
    `width_scale`, kept in this stateless step so that every Muon checkpoint's optimizer state keeps its layout)."""
    def update(updates, state, params):
        keep = mask(params) if mask is not None else jax.tree_util.tree_map(lambda _: True, params)

        def one(u, p, m):
            u = scale(u) if scale is not None else u
            if not m or weight_decay == 0:
                return u
            decay = weight_decay * p
            return u + (jnp.where(u * p > 0, decay, 0.0) if cautious else decay)

        return jax.tree_util.tree_map(one, updates, params, keep), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _adamw(cfg: Config, schedule) -> optax.GradientTransformation:
    o = cfg.optim
    if not o.cautious_weight_decay:  # optax's own (the state layout of every AdamW checkpoint)
        return optax.adamw(learning_rate=schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                           mask=decay_mask)
    return optax.chain(optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps),
                       decayed_weights(o.weight_decay, decay_mask, cautious=True), optax.scale_by_learning_rate(schedule))


def make_optimizer(cfg: Config, platform: str | None = None) -> optax.GradientTransformation:
    """AdamW, or (`optim.name: muon`) Muon for the blocks' kernels and AdamW for the rest; moments take
    the parameters' dtype (float32 master weights -> float32 moments). `platform` (default: jax's default backend):
    where the update runs, which with `mesh.fsdp` decides what Muon's GEMMs write (`muon.products_dtype`)."""
    o = cfg.optim
    schedule = lr_schedule(cfg)
    if o.name == "adamw":
        return _adamw(cfg, schedule)
    ratio = o.muon_lr / o.peak_lr
    products = products_dtype(sharded=cfg.mesh.fsdp != 1, platform=platform or jax.default_backend())
    muon = optax.chain(
        scale_by_muon(beta=o.muon_momentum, ns_dtype=o.muon_ns_dtype, ns_products=products),
        decayed_weights(o.muon_weight_decay, cautious=o.cautious_weight_decay, scale=width_scale),
        optax.scale_by_learning_rate(lambda step: schedule(step) * ratio))
    return optax.partition({"muon": muon, "adamw": _adamw(cfg, schedule)}, muon_labels)


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, jax.Array]:  # grads: a pytree of arrays
    """(clipped grads, pre-clip global norm); max_norm <= 0 disables clipping."""
    norm = optax.tree.norm(grads)
    if max_norm <= 0:
        return grads, norm
    factor = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree_util.tree_map(lambda g: g * factor.astype(g.dtype), grads), norm
