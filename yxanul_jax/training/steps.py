"""Pure train and eval steps: `train_step(state, batch) -> (state, metrics)`, one per curriculum stage.

The train state is `TrainState`, defined here once (a pytree; what Orbax saves, what the mesh
shards, what every step takes and returns).

A batch is `batch.BatchSpec`'s dict of [A, B, L] arrays (A micro-batches accumulated by `lax.scan`; each cut
in train.micro_split inside the step). Losses and gradients are sums over tokens until the very end, so 4 x 2
accumulation equals one batch of 8 up to float rounding.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from yxanul_jax.analysis import memory
from yxanul_jax.core import scopes
from yxanul_jax.core.config import MIXTURE_NAME, Config, FP8Config, StageConfig
from yxanul_jax.core.errors import UserError, one_line
from yxanul_jax.core.rundir import TERM_PREFIX
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.backends import dense_backend
from yxanul_jax.model.loss import chunked_cross_entropy, loss_kernel, masked_sums, n_chunks
from yxanul_jax.model.transformer import Yxanul, init_variables, join_head_state, split_head_state
from yxanul_jax.training.batch import split_micro_batches
from yxanul_jax.training.optim import clip_by_global_norm, lr_schedule, make_optimizer


TERM_NAME = MIXTURE_NAME  # a term's name: letters, digits, '_' and '-' (a metric and TensorBoard tag)


@struct.dataclass
class TrainState:
    """Everything a step changes, and all a checkpoint holds besides the data position.

    step       int32 []             optimizer steps taken (the schedule's clock)
    params     float32 pytree       master weights
    opt_state  optax state          Muon momentum and AdamW moments (float32), counts (optim.make_optimizer)
    fp8        dict of collections  FP8 state ({} when FP8 is off): amax histories, scales and
                                    non-finite counters; never a gradient
    """

    step: jax.Array
    params: Any
    opt_state: Any
    fp8: Any

    def model_parts(self) -> dict:
        """{"params", "fp8"}: what evaluating or sampling the model needs (a partial checkpoint restore)."""
        return {"params": self.params, "fp8": self.fp8}


def init_train_state(cfg: Config, key: jax.Array) -> TrainState:
    """A fresh state: parameters from `key`, zero moments, empty FP8 histories."""
    k_params, _ = jax.random.split(key)
    params, fp8_state = fp8_lib.split_state(init_variables(cfg.model, cfg.fp8, k_params))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=make_optimizer(cfg).init(params),
                      fp8=fp8_state)


def abstract_train_state(cfg: Config) -> TrainState:
    """Shapes and dtypes of the train state, with no memory allocated."""
    return jax.eval_shape(lambda: init_train_state(cfg, jax.random.key(cfg.train.seed)))


def _head_copies(head, chunks: int):
    """One copy of the head's FP8 state per loss chunk, so each chunk's update stays separate."""
    if head is None:
        return None
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (chunks, *x.shape)), head)


def step_fp8(cfg: Config) -> FP8Config:
    """The `FP8Config` a train step traces with: `fp8.gemm_form: auto` resolved for this platform and the step's
    XLA options (`fp8.gemm_form`)."""
    return dataclasses.replace(cfg.fp8, gemm_form=fp8_lib.gemm_form(cfg.fp8, cfg.train.xla_options))


def fp8_summary(cfg: Config) -> dict | None:
    """What our FP8 GEMMs run as in the train step ({"gemm_form", "wgrad"}), for reports; None without them."""
    return {"gemm_form": step_fp8(cfg).gemm_form, "wgrad": cfg.fp8.wgrad} if cfg.fp8.native else None


def step_xla_options(cfg: Config) -> dict:
    """The XLA options the train step compiles with: `train.xla_options`, plus what its FP8 form needs
    (`fp8.required_xla_options`: Triton GEMMs off for `dequant`)."""
    return {**fp8_lib.required_xla_options(cfg.fp8, cfg.train.xla_options), **cfg.train.xla_options}


def check_xla_options(cfg: Config) -> None:
    """UserError when XLA refuses `train.xla_options` (an unknown name, a value of the wrong type): found by compiling
    a trivial function with them, in well under a second, before a run writes anything or compiles its step."""
    options = cfg.train.xla_options
    if not options:
        return
    try:
        jax.jit(lambda x: x + 1).lower(jnp.zeros((), jnp.float32)).compile(compiler_options=dict(options))
    except jax.errors.JaxRuntimeError as e:
        raise UserError(f"config key 'train.xla_options': XLA refused them ({one_line(e)}); fix the name or value "
                        "(XLA's DebugOptions fields, e.g. xla_gpu_enable_triton_gemm=false) or drop it") from None


def loss_sums(cfg: Config, params: Any, body_fp8: dict, head_copies: Any, batch: dict[str, jax.Array],
              extra: Callable[[jax.Array, Any, dict], dict] | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(objective, sums) of one micro-batch [B, L]: sums = {"nll": NLL sum, "z": z sum} over its real tokens and
    objective = nll + z_loss * z; the head runs in chunks, or as the fused kernels (`train.loss_kernel`,
    `loss.loss_kernel`).

    `extra(h_BxLxD, params, batch) -> {name: sum}`: terms of your own on the final hidden states (after the final
    norm) or the parameters, each added to the objective and returned in `sums`; the train step reports each as
    `metrics["loss/<name>"]` per real token. Sums, not means: the step divides everything by the batch's real-token
    count once (scale a per-token term by `batch["mask"]`). `h_BxLxD` is in model.dtype (BF16 by default): cast it
    to float32 before summing (each term is then taken as float32). The model is applied once either way: FP8 state
    updates once per step (a second `model.apply` in your term would sum two states, README: Model and precision).
    This is the step's `LossFn`: `make_train_step(cfg, stage, loss=functools.partial(loss_sums, extra=...))`."""
    model = Yxanul(cfg.model, step_fp8(cfg))
    h_BxLxD = model.apply({"params": params, **body_fp8}, batch["inputs"], method=Yxanul.hidden)
    d = h_BxLxD.shape[-1]
    if loss_kernel(cfg.train.loss_kernel, cfg.model, cfg.fp8) == "fused":
        with jax.named_scope(scopes.LOSS):
            lse_N, target_N = model.apply({"params": params}, h_BxLxD.reshape(-1, d), batch["targets"].reshape(-1),
                                          tiles=cfg.train.fused_ce_tiles, method=Yxanul.fused_loss_terms)
            nll, z = masked_sums(lse_N, target_N, batch["mask"].reshape(-1))
    else:
        def logits_fn(h_CxD, head_state):
            return model.apply({"params": params, **join_head_state({}, head_state)}, h_CxD,
                               method=Yxanul.head_logits)

        with jax.named_scope(scopes.LOSS):
            nll, z = chunked_cross_entropy(logits_fn, h_BxLxD.reshape(-1, d), batch["targets"].reshape(-1),
                                           batch["mask"].reshape(-1), cfg.train.loss_chunk, head_copies)
    sums = {"nll": nll, "z": z}
    objective = nll + cfg.train.z_loss * z
    if extra is not None:
        terms = {name: jnp.asarray(value, jnp.float32) for name, value in extra(h_BxLxD, params, batch).items()}
        if clash := set(terms) & set(sums):
            raise ValueError(f"loss_sums(extra=...): the term name(s) {sorted(clash)} are the step's own; rename them")
        if bad := [n for n in terms if not isinstance(n, str) or not TERM_NAME.fullmatch(n)]:
            raise ValueError(f"loss_sums(extra=...): term names become metric names (loss/<name>); {bad} is not "
                             "letters, digits, '_' and '-'")
        for value in terms.values():
            objective = objective + value
        sums = {**sums, **terms}
    return objective, sums


LossFn = Callable[..., tuple[jax.Array, dict]]
"""What a train step differentiates, with `loss_sums`'s signature and contract: `(cfg, params, body_fp8,
head_copies, batch) -> (objective, sums)`, sums holding at least "nll" and "z" (sums over the micro-batch's real
tokens). Wrap `loss_sums` (its `extra`, or terms of your own on `params` added to its objective) rather than
applying the model again."""


def fp8_bootstrap_config(cfg: Config) -> Config | None:
    """The config of a fresh run's very first step, when it differs from `cfg`.

    Delayed scaling quantizes with scales from earlier steps; a fresh state has none (an empty
    history and unit scales would flush most gradients to zero). The first step therefore runs once
    with `current` scaling, compiled on its own, which fills every history; None when not needed.
    """
    if not dense_backend(cfg.fp8).needs_bootstrap:
        return None
    return dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, scaling="current"))


def make_accumulate(cfg: Config, stage: StageConfig, loss: LossFn = loss_sums) -> Callable:
    """accumulate(params, fp8, batch[A, B, L]) -> (gradient sums, new FP8 state, sums): `loss`'s sums ("nll",
    "z", and any terms of its own) added over the A micro-batches.

    Sums over all A micro-batches (by `lax.scan`) of the float32 parameter gradients; the FP8 state
    updates of the micro-batches (and of the head's loss chunks) are max-merged, never summed.
    """
    grad_fn = jax.grad(lambda *a: loss(cfg, *a), argnums=(0, 1, 2), has_aux=True)
    chunks = n_chunks(stage.batch_size * stage.seq_len, cfg.train.loss_chunk)

    def accumulate(params, fp8_state, batch):
        body_fp8, head = split_head_state(fp8_state)
        head_copies = _head_copies(head, chunks)  # their updates are max-merged below

        def micro(carry, mb):
            g_acc, fp8_acc = carry
            (g_params, g_body, g_head), sums = grad_fn(params, body_fp8, head_copies, mb)
            new_head = None if head is None else fp8_lib.merge_copies(g_head)
            new_fp8 = join_head_state(g_body, new_head)  # the "gradients" of FP8 state are its new values
            g_acc = jax.tree_util.tree_map(jnp.add, g_acc, g_params)
            sums = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), sums)  # stacked by the scan: [A]
            return (g_acc, fp8_lib.merge_fp8(fp8_acc, new_fp8)), sums

        zeros = lambda t: jax.tree_util.tree_map(jnp.zeros_like, t)  # noqa: E731
        (grads, new_fp8), sums_A = jax.lax.scan(micro, (zeros(params), fp8_lib.merge_identity(fp8_state)), batch)
        if not {"nll", "z"} <= set(sums_A) or any(v.ndim != 1 for v in sums_A.values()):
            shapes = {k: v.shape[1:] for k, v in sums_A.items()}
            raise ValueError(f"a train step's loss must return (objective, sums) with scalar sums holding 'nll' and "
                             f"'z' (loss_sums' own), got sums of shapes {shapes}")
        return grads, new_fp8, {k: jnp.sum(v) for k, v in sums_A.items()}  # each sum over its A micro-batch values

    return accumulate


def make_train_step(cfg: Config, stage: StageConfig, device: jax.Device | None = None,
                    loss: LossFn = loss_sums) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """The train step of one stage: `train_step(state, batch) -> (state, metrics)`, a pure function to
    jit once per stage. `batch` is `BatchSpec.of(stage)`'s dict (`training/batch.py`). `stage` gives the
    shapes and the clip; the learning rate is `cfg`'s schedule at `state.step`, whose per-stage `lr_scale`
    and warmup come from `cfg.curriculum` by step number, so a stage that is not in `cfg.curriculum`
    changes no lr. `model.remat: auto` (and with it train.micro_split) is chosen for this stage within `device`'s
    memory (`memory.with_stage_remat`; default: this process's first device).

    `loss` (`LossFn`, default `loss_sums`) is what it differentiates; metrics: "loss" (NLL per real token: what
    validation reports), "z_loss", a "loss/<name>" per real token for each other sum `loss` returns, "grad_norm",
    "lr" (the AdamW parameters' rate), "step_tokens" and the FP8 counters."""
    cfg = memory.with_stage_remat(cfg, stage, device)
    optimizer = make_optimizer(cfg, memory.step_device(device).platform)
    schedule = lr_schedule(cfg)
    split = cfg.train.micro_split
    accumulate = make_accumulate(cfg, stage.split(split), loss)

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        params = state.params
        grads, new_fp8, sums = accumulate(params, state.fp8, split_micro_batches(batch, split))
        nll, z = sums["nll"], sums["z"]
        n_tokens = jnp.maximum(jnp.sum(batch["mask"]), 1.0)
        with jax.named_scope(scopes.OPTIMIZER):
            grads = jax.tree_util.tree_map(lambda g: g / n_tokens, grads)
            grads, grad_norm = clip_by_global_norm(grads, stage.grad_clip)
            updates, opt_state = optimizer.update(grads, state.opt_state, params)
            new_params = optax.apply_updates(params, updates)
        new_state = state.replace(step=state.step + 1, params=new_params, opt_state=opt_state, fp8=new_fp8)
        metrics = {"loss": nll / n_tokens, "z_loss": z / n_tokens, "grad_norm": grad_norm,
                   "lr": schedule(state.step), "step_tokens": jnp.sum(batch["mask"]),
                   **{f"{TERM_PREFIX}{k}": v / n_tokens for k, v in sums.items() if k not in ("nll", "z")}}
        if new_fp8:  # steps x operands whose amax was inf/NaN (kept out of the histories), over the whole run
            metrics["fp8_nonfinite"] = fp8_lib.nonfinite_total(new_fp8)
            if cfg.fp8.underflow_stats:
                metrics["fp8_grad_underflow"] = fp8_lib.underflow_mean(new_fp8, "grad")
            if dense_backend(cfg.fp8).reports_saturation:  # values clipped by a lagging delayed scale
                metrics["fp8_saturation"], metrics["fp8_saturation_at"] = fp8_lib.saturation(state.fp8, new_fp8)
        return new_state, metrics

    return train_step


def make_eval_step(cfg: Config) -> Callable[[Any, dict, dict], tuple[jax.Array, jax.Array]]:
    """eval_step(params, fp8, batch[B, L]) -> (NLL sum, token count): no state change."""

    def eval_step(params, fp8_state, batch):
        body, head = split_head_state(fp8_state)
        copies = _head_copies(head, n_chunks(batch["inputs"].size, cfg.train.loss_chunk))
        _, sums = loss_sums(cfg, params, body, copies, batch)
        return sums["nll"], jnp.sum(batch["mask"])

    return eval_step
