"""Transformer Engine (`fp8.backend=te`), compiled for an H100 on a machine without a GPU: every FP8 target a TE
GEMM, cuDNN attention, TE's fused norm layers on our parameters, TE's recipes, and TE's FP8 state under our rules.

These run in the gpu-check environment with TE added (`scripts/te_check_env.sh`; CI builds it) and skip without
it. Nothing of TE runs on a CPU (it has no CPU lowering): numerics and speed of this backend need a GPU.
"""
import functools
import json
import subprocess

import pytest

from conftest import LAYER_LOOP, REPO, gpu_env, gpu_python, inspect_h100


pytestmark = pytest.mark.slow  # compiles for sm_90 / runs scripts or subprocesses: `pytest -m "not slow"` skips it

def _te_python() -> str:
    python = gpu_python()
    if not _has_te(python):
        pytest.skip("no Transformer Engine in the gpu-check environment: build it with scripts/te_check_env.sh "
                    "(CI does) to compile fp8.backend=te for sm_90 here")
    return python


@functools.lru_cache(maxsize=None)
def _has_te(python: str) -> bool:
    """Asked once per session: whether that Python has TE's JAX extension."""
    found = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('transformer_engine_jax'))"],
                           capture_output=True, text=True, cwd=REPO)
    return found.returncode == 0


def _run(code: str, *args: str) -> dict:
    proc = subprocess.run([_te_python(), "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=gpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _inspect_te(*args: str, cudnn: bool = True) -> dict:
    _te_python()
    return inspect_h100("fp8.backend=te", "--require", "fp8-expected", *(("--require", "cudnn-attention") if cudnn else ()),
                        *args)


def test_tiny_te_step_is_te_fp8_gemms_and_cudnn_attention():
    r = _inspect_te("--config", "configs/tiny.yaml")
    g = r["gpu"]
    # 4 layers x 7 projections x (forward, input gradient, weight gradient), every one TE's FP8 GEMM
    assert g["gemm_kinds"]["fp8 te"] == {"in_hlo": 84, "executed": 84} and g["fp8_found"] == 84
    assert not [k for k in g["gemm_kinds"] if k.startswith("fp8") and k != "fp8 te"] and g["fp8_lost"] == []
    assert g["te_calls"]["te_gemm_v2_ffi"] == 84 and g["cudnn_attention"] == {"forward": 4, "backward": 4}
    assert "te_norm_forward_ffi" not in g["te_calls"]  # unfused: our own RMSNorm


def test_tiny_te_fused_layers_fuse_both_norms_into_fewer_gemms():
    r = _inspect_te("--config", "configs/tiny.yaml", "fp8.te_layers=true")
    g = r["gpu"]
    # per layer: [q|k|v], o, [gate|up], down = 4 GEMMs x 3 roles x 4 layers; two fused norms per layer
    assert g["fp8_found"] == g["fp8_expected"]["total"] == 48 and g["fp8_lost"] == []
    assert g["te_calls"]["te_norm_forward_ffi"] == g["te_calls"]["te_norm_backward_ffi"] == 8
    assert g["te_calls"]["te_act_lu_ffi"] == 4  # SwiGLU inside LayerNormMLP
    assert r["fp8"]["te_layers"] is True


def test_te_head_state_with_accumulation_and_loss_chunks():
    r = _inspect_te("--config", "configs/tiny.yaml", "fp8.targets=[q,k,v,o,gate,up,down,head]", "model.vocab_pad_to=128",
                    "curriculum.0.grad_accum_steps=2", "train.loss_chunk=512")
    e = r["gpu"]["fp8_expected"]
    assert r["gpu"]["fp8_found"] == e["total"] and e["forward"] == 2 * (4 * 7 + 4)  # 4 head chunks per micro-batch


# Stage 0 (short rows, big batch) with TE's plain layers, stage 9 (2,048-token rows) with its fused ones:
# both layer kinds and both ends of the curriculum; each count is the same at the other stage.
@pytest.mark.parametrize("stage, fused", [("0", False), ("9", True)])
def test_yxanul_197m_te_stages_compile_for_h100(stage, fused):
    # stage 0 (seq 8) runs `short_attention` (`transformer.SHORT_ATTENTION_MAX_SEQ`), stage 9 cuDNN's
    r = _inspect_te("--config", "configs/yxanul_197m.yaml", "--stage", stage, f"fp8.te_layers={str(fused).lower()}", LAYER_LOOP,
                    cudnn=stage == "9")
    assert r["attention"] == ("cudnn" if stage == "9" else "short")
    g = r["gpu"]
    if stage == "0":
        assert g["cudnn_attention"] == {"forward": 0, "backward": 0}
    # forward, recomputed (remat full; not down), dx, dw; unfused, q, k, v are one GEMM (model.fuse_projections);
    # o runs in BF16 (the config's fp8.targets)
    per_layer = 3 + 2 + 3 + 3 if fused else 4 + 3 + 4 + 4
    assert g["fp8_found"] == g["fp8_expected"]["total"] == 28 * per_layer and g["fp8_lost"] == []
    assert set(k for k in g["gemm_kinds"] if k.startswith("fp8")) == {"fp8 te"}


def test_te_state_round_trips_through_an_orbax_checkpoint(tmp_path):
    # TE's collections (one starts with an underscore) in the real train state, saved and restored bit-exactly.
    out = _run(r"""
import dataclasses, json, sys, jax, jax.numpy as jnp, numpy as np
from yxanul_jax.analysis import te_compile
te_compile.prepare()
from yxanul_jax.core.config import CheckpointConfig, load_config
from yxanul_jax.training.checkpoint import Checkpointer
from yxanul_jax.training.steps import abstract_train_state
base = load_config("configs/tiny.yaml")
cfg = dataclasses.replace(base, fp8=dataclasses.replace(base.fp8, backend="te", te_layers=True, amax_history_len=8))
abstract = abstract_train_state(cfg)
leaves, treedef = jax.tree_util.tree_flatten(abstract)
state = jax.tree_util.tree_unflatten(treedef, [jnp.full(a.shape, i + 0.5, a.dtype) for i, a in enumerate(leaves)])
ck = CheckpointConfig(interval=1, max_to_keep=2, keep_best=True, async_save=False)
with Checkpointer(sys.argv[1], ck) as c:
    c.save(3, state, {"note": "te"}, force=True)
with Checkpointer(sys.argv[1], ck) as c:
    step, back, _ = c.restore(abstract)
same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(state.fp8), jax.tree.leaves(back.fp8)))
print(json.dumps({"step": step, "collections": sorted(back.fp8), "same": same, "leaves": len(jax.tree.leaves(back.fp8))}))
""", str(tmp_path / "ck"))
    assert out == {"step": 3, "collections": ["_overwrite_with_gradient", "fp8_metas"], "same": True, "leaves": 96}


def test_te_recipes_and_state_follow_our_rules():
    # The recipe fields, TE's state layout, and which way TE's scale runs (from TE's own code, on CPU).
    out = _run(r"""
import dataclasses, json, jax, jax.numpy as jnp
from yxanul_jax.analysis import te_compile
from yxanul_jax.model import fp8 as F
te_compile.prepare()
from transformer_engine.common import recipe as R
from transformer_engine.jax.quantize.quantizer import compute_scale_from_amax
from yxanul_jax.analysis.accounting import state_bytes
from yxanul_jax.core.config import FP8Config, load_config
from yxanul_jax.model.transformer import split_head_state as _split_head
from yxanul_jax.training.steps import abstract_train_state

d = F.te_recipe(FP8Config(backend="te", margin=1, amax_history_len=16, amax_compute_algo="most_recent"))
c = F.te_recipe(FP8Config(backend="te", scaling="current"))
out = {"delayed": [type(d).__name__, d.margin, d.amax_history_len, d.amax_compute_algo, d.fp8_format.name],
       "current": [type(c).__name__, c.fp8_format.name]}
s2, s4 = (float(compute_scale_from_amax(jnp.array([a]), jnp.float8_e4m3fn, 0.0)[0]) for a in (2.0, 4.0))
out["scale_of_larger_amax_is_smaller"] = s4 < s2
base = load_config("configs/tiny.yaml")
for name, fp8 in (("unfused", dict(targets=("q", "k", "v", "o", "gate", "up", "down", "head"))), ("fused", dict(te_layers=True))):
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, vocab_pad_to=128),
                              fp8=dataclasses.replace(base.fp8, backend="te", amax_history_len=16, **fp8))
    state = abstract_train_state(cfg)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.fp8)]
    mins = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(F.merge_identity(state.fp8))
            if float(x.reshape(-1)[0]) == float("inf")]
    opt = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)]
    body, head = _split_head(state.fp8)
    out[name] = {"collections": sorted(state.fp8), "leaves": len(paths), "min_merged": len(mins),
                 "all_min_are_scales": all(p.endswith("_scale']") for p in mins),
                 "scales": sum(p.endswith("_scale']") for p in paths),
                 "head": sorted(head) if head else None, "fp8_in_optimizer": any("fp8" in p or "overwrite" in p for p in opt),
                 "bytes": [state_bytes(cfg)["fp8_state"], sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state.fp8))],
                 "params": sorted(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.params))}
print(json.dumps(out))
""")
    assert out["delayed"] == ["DelayedScaling", 1, 16, "most_recent", "HYBRID"]
    assert out["current"] == ["Float8CurrentScaling", "HYBRID"]
    assert out["scale_of_larger_amax_is_smaller"]  # hence min-merged: the larger amax wins, as with ours
    unfused, fused = out["unfused"], out["fused"]
    # unfused: 4 layers x 7 GEMMs + the head, 3 operands each, a history and a scale per operand
    assert unfused["collections"] == ["_overwrite_with_gradient"] and unfused["leaves"] == 2 * 3 * (4 * 7 + 1)
    assert unfused["min_merged"] == unfused["scales"] == 3 * (4 * 7 + 1) and unfused["all_min_are_scales"]
    assert unfused["head"] == ["_overwrite_with_gradient"] and not unfused["fp8_in_optimizer"]
    assert unfused["bytes"][0] == unfused["bytes"][1] and fused["bytes"][0] == fused["bytes"][1]  # what `plan` counts
    # fused: 4 layers x 4 GEMMs (3 in TE's layers' collection, `o` in its dot_general's); the same parameter
    # names as without fusion
    assert fused["collections"] == ["_overwrite_with_gradient", "fp8_metas"] and fused["head"] is None
    assert fused["leaves"] == 2 * 3 * 4 * 4 and fused["min_merged"] == 3 * 4 * 4
    assert fused["params"] == unfused["params"] and not fused["fp8_in_optimizer"]


def test_te_compile_without_transformer_engine_names_the_script():
    import importlib.metadata

    from yxanul_jax.analysis import te_compile
    from yxanul_jax.core.errors import UserError

    try:
        importlib.metadata.version("transformer_engine_jax")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("Transformer Engine is installed in this environment; the missing-TE path cannot run")
    with pytest.raises(UserError, match=r"scripts/te_check_env.sh") as e:
        te_compile.prepare()
    assert "\n" not in str(e.value)
