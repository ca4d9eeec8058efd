"""The FP8 saturation warning: silent while delayed scaling catches up with a jump (an episode of clipping no
longer than the amax history), one actionable line when clipping outlasts the history."""
import dataclasses
import io
import re
import types

import jax
import jax.numpy as jnp

from yxanul_jax.core import console
from yxanul_jax.core.coerce import apply_overrides
from yxanul_jax.core.config import Config, FP8Config, validate
from yxanul_jax.model import fp8 as F
from yxanul_jax.training.hooks import MetricsLog, NullWriter, StepInfo
from yxanul_jax.training.monitor import Progress

HISTORY = 4
SPEC = F.Fp8Spec(jnp.bfloat16)
GEMM = ("layer_0", "mlp", "up", "gemm")  # named as the model names its up projection


def _state(metas) -> dict:
    node = dict(zip(F.OPERANDS, metas))
    for key in reversed(GEMM):
        node = {key: node}
    return {F.FP8_COLLECTION: node}


def _metas(state) -> list:
    node = state[F.FP8_COLLECTION]
    for key in GEMM:
        node = node[key]
    return [node[op] for op in F.OPERANDS]


def run_steps(growth: list[float], history: int = HISTORY) -> tuple[list[str], list[float]]:
    """Real FP8 GEMM steps (forward and backward through `fp8.fp8_dot`, delayed scaling, `history`-long
    amax histories): step t's input is the previous one times growth[t]. Each step's `fp8.saturation`
    (old state -> new state) goes to the train loop's metrics hook as the train step reports it; returns
    the warnings it printed and the ratios."""
    cfg = dataclasses.replace(Config(), fp8=FP8Config(amax_history_len=history))
    x = jax.random.normal(jax.random.key(1), (8, 32), jnp.float32)
    w = 0.05 * jax.random.normal(jax.random.key(2), (32, 16), jnp.float32)
    g = jax.random.normal(jax.random.key(3), (8, 16), jnp.bfloat16)
    state = _state([F.init_meta(history) for _ in F.OPERANDS])
    err = io.StringIO()
    console.set_streams(err=err)
    try:
        hook = MetricsLog(cfg, NullWriter(), Progress(len(growth), every=10**6, stream=io.StringIO()))
        hook.on_start(None, types.SimpleNamespace(fp8=state), 0)
        ratios = []
        for step, factor in enumerate(growth, start=1):
            x = factor * x
            _, vjp = jax.vjp(lambda x, *m: F.fp8_dot(x, w, *m, SPEC), x, *_metas(state))
            new = _state(vjp(g)[1:])
            ratio, at = F.saturation(state, new)
            state = new
            ratios.append(float(ratio))
            metrics = {"loss": 1.0, "lr": 1e-3, "grad_norm": 1.0, "fp8_saturation": ratio, "fp8_saturation_at": at}
            hook.on_metrics(None, StepInfo(step, 0, 8, metrics, 8 * step, 1.0, None))
    finally:
        console.set_streams()
        console._warned.clear()  # the next run may print the same line again
    return [line for line in err.getvalue().splitlines() if "FP8" in line], ratios


def test_clipping_no_longer_than_the_history_is_not_reported():
    # steps 2-5: the input grows 8x a step, so each of its casts clips (ratio 8 to the delayed scale): four
    # clipping steps, as long as the history; then it stops growing and the history has caught up
    warnings, ratios = run_steps([1.0] + [8.0] * HISTORY + [1.0] * 6)
    assert [round(r) for r in ratios[1:1 + HISTORY]] == [8] * HISTORY and max(ratios[1 + HISTORY:]) <= 1.0
    assert warnings == []


def test_clipping_that_outlasts_the_history_is_reported_once_per_episode_with_fixes_that_exist():
    # five clipping steps (2-6), one more than the history: warned at step 6, not again at 7-8; after a gap
    # longer than the history a new episode (steps 15-19) is warned about again
    growth = [1.0] + [8.0] * 7 + [1.0] * 6 + [8.0] * 5
    warnings, ratios = run_steps(growth)
    assert sum(r >= F.SATURATION_WARN for r in ratios) == 12
    assert len(warnings) == 2, warnings
    first = warnings[0]
    assert first.startswith("warning: FP8 clipping has persisted from step 2 to step 6, longer than the 4-step")
    assert "layer_0/mlp/up/gemm input (5 steps)" in first and "worst 8.0x" in first
    assert "from step 15 to step 19" in warnings[1]
    # every fix it names is a real override: margin for the worst jump (2**3 = 8), current scaling, the
    # clipped projection (up) out of fp8.targets, a lower lr
    fixes = re.findall(r"\b(fp8\.\w+=(?:\[[^\]]*\]|\w+))", first)
    assert fixes == ["fp8.margin=3", "fp8.scaling=current", "fp8.targets=[q,k,v,o,gate,down]"], fixes
    assert ", or a lower optim.muon_lr and optim.lr (now 0.01 and 0.012); the per-step" in first, first  # Muon's
    assert "or or" not in first, first  # one "or" between fixes (there were two before each of the last two)
    fixed = validate(apply_overrides(Config(), fixes))
    assert fixed.fp8.margin == 3 and "up" not in fixed.fp8.targets


def test_the_targets_of_operand_names():
    names = ["layer_1/attn/k/gemm grad", "layer_0/attn/qkv input", "head_gemm kernel",
             "layers/mlp/down/gemm grad [layer 2]"]
    assert F.saturation_targets(names) == ["q", "k", "v", "down", "head"]
    assert F.saturation_targets(["block/gemm input"]) == []
