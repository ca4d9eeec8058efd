"""The memory planner (yxanul_jax/analysis/memory.py, yxanul_jax/plan.py): exact state and residual accounting,
agreement with XLA's compiled memory analysis, largest batches, and scaled-down configs that fit."""
import contextlib
import dataclasses
import io
import json
import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals

from yxanul_jax import plan
from yxanul_jax.analysis import accounting
from yxanul_jax.analysis import memory
from yxanul_jax.core.config import StageConfig, load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.training.stages import compile_stage
from yxanul_jax.model.transformer import split_head_state as _split_head
from yxanul_jax.training.steps import abstract_train_state, loss_sums

from conftest import LAYER_LOOP, REPO

TINY, PYTHIA, Y197 = (str(REPO / "configs" / f) for f in ("tiny.yaml", "pythia_70m_capped.yaml", "yxanul_197m.yaml"))


def _size(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("path,overrides", [
    (TINY, []), (Y197, []), (str(REPO / "configs/yxanul_270m.yaml"), []), (PYTHIA, []),
    (TINY, ["model.embed_rank=32", "model.head=factorized", "fp8.targets=[q,head]", "model.scan_layers=true"]),
    (TINY, ["fp8.enabled=false", "model.embed_rank=0", "fp8.amax_history_len=16"]),
    (TINY, ["optim.name=muon"]), (Y197, ["optim.name=muon", "optim.cautious_weight_decay=true"]),
])
def test_state_bytes_and_param_count_are_exact(path, overrides):
    cfg = load_config(path, overrides)
    state = abstract_train_state(cfg)
    assert accounting.state_bytes(cfg) == {"weights": _size(state.params), "optimizer": _size(state.opt_state),
                                       "fp8_state": _size(state.fp8),
                                       "misc_state": _size(state.step)}
    assert accounting.param_count(cfg) == plan.build_plan(cfg, suggest=False)["params_total"]


_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "u32": 4, "bool": 1, "f8_e4m3fn": 1, "f8_e5m2": 1, "i8": 1}


def _residual_bytes(cfg, batch: int, seq_len: int) -> int:
    """Bytes JAX saves for the backward pass of the real loss (public `print_saved_residuals`),
    leaving out the parameters and the batch themselves."""
    st = abstract_train_state(cfg)
    body, _ = _split_head(st.fp8)
    shape = (batch, seq_len)
    data = {"inputs": jnp.zeros(shape, jnp.int32), "targets": jnp.zeros(shape, jnp.int32),
            "mask": jnp.ones(shape, jnp.float32)}
    params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), st.params)
    fp8 = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), body)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(lambda p: loss_sums(cfg, p, fp8, None, data)[0], params)
    total = 0
    for line in out.getvalue().splitlines():
        m = re.match(r"(\w+)\[([\d,]*)\]", line.strip())
        if m and "from the argument" not in line:
            total += _ITEMSIZE[m.group(1)] * math.prod(int(d) for d in m.group(2).split(",") if d)
    return total


@pytest.mark.parametrize("overrides", [
    ["fp8.enabled=false"], [], ["fp8.targets=[q,o,up]"], ["model.dtype=float32", "fp8.enabled=false"],
    ["model.remat=dots", "model.scan_layers=true"], ["model.remat=full", "model.scan_layers=true"],
    ["model.remat=dots", "model.scan_layers=true", "fp8.gemm_form=dequant"],
    ["fp8.wgrad=bf16"], ["fp8.wgrad=bf16", "fp8.targets=[q,o,up]"],
    ["fp8.wgrad=bf16", "model.remat=dots", "model.scan_layers=true"],
    ["model.remat=dots", "model.scan_layers=true", "fp8.enabled=false"],
    ["model.remat=dots", "model.scan_layers=true", "fp8.targets=[q,o,up]"],
    ["model.remat=dots", "model.scan_layers=true", "fp8.targets=[q,o,up]", "fp8.gemm_form=dequant"],
    ["model.remat=dots", "model.scan_layers=true", "model.dtype=float32", "fp8.gemm_form=dequant"],
    ["model.remat=attention", "model.scan_layers=true"],  # XLA's attention (CPU): what full saves
])
def test_saved_residual_formula_equals_what_jax_saves(overrides):
    cfg, measured = saved_per_layer_token(overrides)
    assert measured == memory.saved_bytes_per_token(cfg, 32, cfg.model.remat)


def saved_per_layer_token(overrides: list[str], L: int = 32):
    """(the tiny config with `overrides`, bytes JAX saves per layer and token at sequence length L).
    The double difference over layers (1 -> 2) and rows (2 -> 4) cancels everything that is not per layer
    per token (weights' BF16/FP8 copies, RoPE tables, the loss). Also run by tests/test_gpu_target.py."""
    cfgs = {n: load_config(TINY, overrides + [f"model.n_layers={n}", "model.vocab_size=256"]) for n in (1, 2)}
    r = {(n, b): _residual_bytes(cfgs[n], b, L) for n in (1, 2) for b in (2, 4)}
    return cfgs[1], (r[2, 4] - r[1, 4] - r[2, 2] + r[1, 2]) / (2 * L)


@pytest.mark.parametrize("path,overrides", [
    (TINY, []),                                   # 4 unrolled layers, FP8, no remat: the loss sets the peak
    (PYTHIA, ["model.scan_layers=true", "model.remat=full", "curriculum.0.batch_size=128"]),  # 35 M, scanned
])
def test_planner_agrees_with_xla_compiled_memory_within_15_percent(path, overrides):
    cfg = load_config(path, overrides)
    stage = cfg.curriculum[0]
    mem = compile_stage(cfg, stage).memory_analysis()
    xla = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
           + mem.temp_size_in_bytes)
    est = memory.estimate_stage(cfg, stage, platform="cpu")
    assert abs(est["bytes_total"] - xla) / xla < 0.15, (est["bytes_total"] / 1e6, xla / 1e6)
    # The parts that are exact are exact: XLA's arguments are the state plus the batch, less the FP8
    # underflow shares (one float32 per operand), which the step writes but never reads: XLA drops them.
    state = accounting.state_bytes(cfg)
    unread = accounting.fp8_gemm_count(cfg) * 3 * 4
    assert mem.argument_size_in_bytes == sum(state.values()) + est["batch"] - unread


def test_auto_remat_saves_cudnn_attention_where_it_fits_and_only_block_inputs_elsewhere():
    cfg = load_config(Y197)
    assert cfg.model.remat == "auto"
    s9, s0 = cfg.curriculum[9], cfg.curriculum[0]
    plans = {r: memory.estimate_stage(cfg, s9, remat=r)["bytes_total"] for r in ("attention", "full")}
    # cuDNN's output (a H K) and float32 softmax statistics (4 H) per token and layer, on top of full's block input
    m = cfg.model
    extra = m.n_layers * s9.batch_size * s9.seq_len * (2 * m.n_heads * m.resolved_head_dim + 4 * m.n_heads)
    assert plans["attention"] - plans["full"] == extra
    assert memory.stage_choice(cfg, s9, plans["attention"])[0] == "attention"
    assert memory.stage_choice(cfg, s9, plans["attention"] - 1)[0] == "full"  # does not fit: only block inputs
    assert memory.stage_choice(cfg, s9, None)[0] == "full"
    # seq 8 runs short_attention: no cuDNN output to save; without a loop over the layers (the config's
    # scan_unroll: 28) everything is saved where it fits (memory.AUTO_REMAT_UNROLLED), else only block inputs
    assert memory.stage_choice(cfg, s0, 10 ** 15)[0] == "none"
    assert memory.stage_choice(load_config(Y197, [LAYER_LOOP]), s0, 10 ** 15)[0] == "full"
    assert memory.stage_choice(load_config(Y197, [LAYER_LOOP]), s9, 10 ** 15)[0] == "attention"
    assert memory.stage_choice(load_config(Y197, [LAYER_LOOP]), s9, 10 ** 15, platform="cpu")[0] == "full"
    assert memory.stage_choice(cfg, s9, 10 ** 15, platform="cpu")[0] == "none"  # XLA CPU would keep it all anyway
    # the planner plans what auto picks for the budget it is given
    assert memory.estimate_stage(cfg, s9, budget=plans["attention"])["bytes_total"] == plans["attention"]
    assert memory.estimate_stage(cfg, s9, budget=plans["attention"] - 1)["bytes_total"] == plans["full"]
    assert memory.estimate_stage(cfg, s9)["bytes_total"] == plans["full"]
    h100 = plan.build_plan(cfg, memory.parse_gpu("h100"), suggest=False)["stages"]
    rtx = plan.build_plan(cfg, memory.parse_gpu("rtx4090"), suggest=False)["stages"]
    # Without a loop `none` comes first, each micro-batch split in 2 or 4 where whole it does not fit
    # (memory.AUTO_SPLITS): on an H100 every stage runs without recomputation
    label = lambda stages: [memory.remat_label(s["remat"], s["micro_split"]) for s in stages]  # noqa: E731
    assert label(h100) == ["none"] + ["none/2"] * 6 + ["none/4"] * 2 + ["none/2"]
    assert label(rtx) == ["none/4"] + ["full"] * 9  # 22.1 GB for none/4 at stage 9 > the 4090's 15.5 GB budget
    assert all(s["bytes_total"] <= memory.parse_gpu("h100").budget_bytes for s in h100)
    assert all(s["bytes_total_by_remat"]["attention"] >= s["bytes_total_by_remat"]["full"] for s in h100)
    # a train step resolves auto for the device it compiles for (here a CPU: XLA's attention; with the loop over
    # the layers, so that `none` is not a candidate whatever the host's memory)
    assert memory.with_stage_remat(load_config(Y197, [LAYER_LOOP]), s9).model.remat == "full"
    assert memory.with_stage_remat(load_config(Y197, ["model.remat=dots"]), s9).model.remat == "dots"
    budget, platform = memory.device_budget()
    assert platform == "cpu" and budget > 0


def test_auto_splits_the_micro_batch_where_that_lets_none_fit(monkeypatch):
    cfg = load_config(Y197)
    s9 = cfg.curriculum[9]
    none = {k: memory.estimate_stage(cfg, s9, remat="none", split=k)["bytes_total"] for k in memory.AUTO_SPLITS}
    # the activations are the micro-batch's: half of them in 2 pieces, a quarter in 4 (each rounded to a byte)
    acts = {k: memory.estimate_stage(cfg, s9, remat="none", split=k)["activations"] for k in memory.AUTO_SPLITS}
    assert abs(2 * acts[2] - acts[1]) <= 1 and abs(4 * acts[4] - acts[1]) <= 2
    assert memory.stage_choice(cfg, s9, none[1]) == ("none", 1)
    assert memory.stage_choice(cfg, s9, none[1] - 1) == ("none", 2)
    assert memory.stage_choice(cfg, s9, none[2] - 1) == ("none", 4)
    assert memory.stage_choice(cfg, s9, none[4] - 1) == ("attention", 1)  # only `none` is split
    est = memory.estimate_stage(cfg, s9, budget=none[1] - 1)  # the planner plans what auto picks
    assert (est["remat"], est["micro_split"], est["bytes_total"]) == ("none", 2, none[2])
    # a split divides the micro-batch; one set by hand is the only one auto tries; with a loop over the layers
    # `none` is not a candidate, so nothing is split
    assert memory.stage_choice(cfg, dataclasses.replace(s9, batch_size=63), 10 ** 15) == ("none", 1)
    assert memory.stage_choice(cfg, dataclasses.replace(s9, batch_size=63), none[2] - 1)[0] == "attention"
    assert memory.stage_choice(load_config(Y197, ["train.micro_split=4"]), s9, none[1]) == ("none", 4)
    assert memory.stage_choice(load_config(Y197, [LAYER_LOOP]), s9, none[4]) == ("attention", 1)
    assert memory.stage_choice(cfg, s9, none[1] - 1, devices=8) == ("attention", 1)  # a mesh: no split
    # a train step resolves both for its device (here a budget between none whole and none/2, as on an H100)
    monkeypatch.setattr(memory, "device_budget", lambda device=None: (none[1] - 1, "gpu"))
    resolved = memory.with_stage_remat(cfg, s9)
    assert (resolved.model.remat, resolved.train.micro_split) == ("none", 2)
    assert memory.with_stage_remat(resolved, s9) == resolved  # resolved once, for good
    # a layout is grown only where the step then runs larger pieces: 32 x 2 runs none whole, and 64 x 1 would run
    # none/2, the same pieces of 32
    s9_halves = dataclasses.replace(s9, batch_size=32, grad_accum_steps=2)
    halves = dataclasses.replace(cfg, curriculum=(*cfg.curriculum[:9], s9_halves))
    assert memory.stage_choice(halves, s9_halves, none[1] - 1) == ("none", 1)
    assert memory.largest_micro_batches(halves, none[1] - 1).curriculum[9] == s9_halves
    # layouts (plan's max batch, `largest_micro_batches`) are micro-batches a step runs whole: the largest is the
    # one that fits with `full`, not 4 x what fits with none/4
    budget = none[1] - 1
    full = load_config(Y197, ["model.remat=full"])
    assert memory.max_batch_size(cfg, s9, budget) == memory.max_batch_size(full, s9, budget) > s9.batch_size
    with pytest.raises(UserError, match=r"train.micro_split' \(3\) must divide every stage's batch_size"):
        load_config(Y197, ["train.micro_split=3"])
    # what a step's FP8 GEMMs should be counts its pieces, and needs `auto` resolved first
    resolved = load_config(Y197, ["model.remat=none", "train.micro_split=2"])
    assert accounting.expected_fp8_gemms(resolved, 9)["total"] == 2 * 28 * 12  # 4 forward, 4 dgrad, 4 wgrad
    with pytest.raises(ValueError, match="model.remat resolved"):
        accounting.expected_fp8_gemms(cfg, 9)


def test_chunked_loss_is_what_lets_the_seeds_batch_fit_a_24gb_card():
    # SPEC 9: "batch 8192 at seq_len 8 on 24 GB" holds only if the logits never exist all at once.
    cfg = load_config(Y197)
    gpu = memory.parse_gpu("rtx4090")
    stage = cfg.curriculum[0]
    assert (stage.seq_len, stage.batch_size) == (8, 8192)
    assert memory.estimate_stage(cfg, stage)["bytes_total"] < gpu.budget_bytes
    # the XLA loss (train.loss_kernel=chunked) in one chunk would not fit; the fused kernels fit in any case
    one_chunk = dataclasses.replace(cfg.train, loss_chunk=stage.seq_len * stage.batch_size, loss_kernel="chunked")
    unchunked = dataclasses.replace(cfg, train=one_chunk)
    assert memory.estimate_stage(unchunked, stage)["bytes_total"] > gpu.total_bytes
    fused = dataclasses.replace(cfg, train=dataclasses.replace(one_chunk, loss_kernel="fused"))
    assert memory.estimate_stage(fused, stage)["bytes_total"] < gpu.budget_bytes


def test_remat_orders_planned_activations():
    cfg = load_config(Y197, [LAYER_LOOP])  # a loop over the layers: unrolled, XLA CPU hoists every recomputation
    stage = cfg.curriculum[4]
    acts = {r: memory.estimate_stage(cfg, stage, "cpu", remat=r)["activations"] for r in ("none", "dots", "full")}
    assert acts["none"] > acts["dots"] > acts["full"] > 0
    # On the GPU (sm_90 compiles) a scanned layer without remat stacks every residual, norms' float32 copies
    # and the SwiGLU's included (XLA's peak at stage 9: none 159 GB, dots 98, full 14); `full` keeps the least.
    gpu = {r: memory.estimate_stage(cfg, stage, "gpu", remat=r)["activations"] for r in ("none", "dots", "full")}
    assert gpu["none"] > gpu["dots"] > gpu["full"] > 0
    # remat full keeps each layer's BF16 block input (on CPU XLA keeps the residual stream in float32)
    assert gpu["full"] == cfg.model.n_layers * stage.batch_size * stage.seq_len * 2 * cfg.model.d_model
    assert acts["full"] == 2 * gpu["full"]


def test_plan_json_has_memory_per_stage_and_a_consistent_max_batch(capsys):
    assert plan.main(["--config", Y197, "--gpu", "h100", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    data = json.loads(out[-1])
    assert data["params_total"] == 196_398_464 and isinstance(data["fits"], bool)
    budget = data["gpu"]["budget_bytes"]
    cfg = load_config(Y197)
    for s, stage in zip(data["stages"], cfg.curriculum):
        assert {"seq_len", "batch_size", "bytes_total", "max_batch_size", "fits"} <= set(s)
        assert s["fits"] == (s["bytes_total"] <= budget)
        b = s["max_batch_size"]
        at = memory.estimate_stage(cfg, dataclasses.replace(stage, batch_size=b))["bytes_total"]
        above = memory.estimate_stage(cfg, dataclasses.replace(stage, batch_size=b + 1))["bytes_total"]
        assert at <= budget < above
    assert data["fits"] == all(s["fits"] for s in data["stages"])
    assert any("max batch" in line for line in out[:-1])


def _check_suggestion_fits(cfg, gpu_name, tmp_path):
    gpu = memory.parse_gpu(gpu_name)
    first = plan.build_plan(cfg, gpu)
    assert not first["fits"] and first["suggestion"]["fits"]
    path = tmp_path / "suggested.yaml"
    path.write_text(first["suggestion"]["yaml"])
    suggested = load_config(str(path))  # the printed YAML is a complete, valid config
    second = plan.build_plan(suggested, gpu)
    assert second["fits"] and second["suggestion"] is None
    assert len(second["stages"]) == len(cfg.curriculum)  # every stage checked: no vacuous all() below
    assert all(s["bytes_total"] <= gpu.budget_bytes for s in second["stages"])
    # Same curriculum: stage boundaries, lengths and tokens per step unchanged (and no stage dropped,
    # which zip would hide).
    assert len(suggested.curriculum) == len(cfg.curriculum)
    for a, b in zip(cfg.curriculum, suggested.curriculum):
        assert (a.start_step, a.seq_len, a.tokens_per_step) == (b.start_step, b.seq_len, b.tokens_per_step)
    assert suggested.model.vocab_size == cfg.model.vocab_size
    return suggested


def test_gtx1650_suggestion_for_yxanul_197m_plans_as_fitting(tmp_path):
    suggested = _check_suggestion_fits(load_config(Y197), "gtx1650", tmp_path)
    # it had to shrink the model, to the largest shape that fits: a narrower one (its embedding rank scaled with it to
    # 96, which the fused loss does not take) on the chunked loss with a small chunk. Before the planner's sm_90 refit
    # (2026-11-29) it was 28 x 640, which XLA's sm_90 compile put at 2.91 GB against the 2.58 GB budget (docs/MEMORY.md);
    # before the chunked loss kept its logits in BF16 (loss.cross_entropy_sums), 14 x 768 on the fused loss
    m = suggested.model
    assert suggested.optim.name == "muon"
    assert (m.n_layers, m.d_model, m.head_width) == (28, 576, 96) and suggested.train.loss_chunk < 1024


def test_gtx1650_suggestion_for_the_seeds_32k_vocab_model_plans_as_fitting(tmp_path):
    # GTX1650_MEMORY.md: vocab 32,000, width 2,048, 512-token rows: over 5 GB on a 4 GB card.
    cfg = load_config(TINY, ["model.vocab_size=32000", "model.d_model=2048", "model.n_heads=16",
                             "model.n_kv_heads=4", "model.ffn_dim=5632", "model.n_layers=8",
                             "model.embed_rank=0", "model.max_position=512"])
    cfg = dataclasses.replace(cfg, curriculum=(StageConfig(seq_len=512, batch_size=16),))
    suggested = _check_suggestion_fits(cfg, "gtx1650", tmp_path)
    assert accounting.param_count(suggested) < accounting.param_count(cfg)


def test_a_config_that_only_needs_smaller_batches_keeps_its_model(tmp_path):
    suggested = _check_suggestion_fits(load_config(Y197), "rtx4090", tmp_path)
    assert suggested.model.d_model == 768 and suggested.model.n_layers == 28
    assert any(s.grad_accum_steps > 1 for s in suggested.curriculum)


def test_plan_offers_fewer_larger_micro_batches_where_they_fit(tmp_path):
    # yxanul-270m keeps its seeds' layout (micro-batches of 1,024-2,048 tokens, 32 per step); an H100 holds a
    # whole step as one micro-batch, which the performance model predicts 3.3x faster at stage 0 (BENCHMARKS.md)
    cfg = load_config(str(REPO / "configs/yxanul_270m.yaml"))
    gpu = memory.parse_gpu("h100")
    first = plan.build_plan(cfg, gpu)
    assert first["fits"] and first["suggestion"] is None and first["faster"]
    path = tmp_path / "faster.yaml"
    path.write_text(first["faster"]["yaml"])
    grown = load_config(str(path))
    assert grown.model == cfg.model and len(grown.curriculum) == len(cfg.curriculum)
    for a, b in zip(cfg.curriculum, grown.curriculum):
        assert (a.start_step, a.seq_len, a.tokens_per_step) == (b.start_step, b.seq_len, b.tokens_per_step)
        assert b.batch_size >= a.batch_size and b.grad_accum_steps <= a.grad_accum_steps
    assert sum(s.grad_accum_steps for s in grown.curriculum) < sum(s.grad_accum_steps for s in cfg.curriculum)
    second = plan.build_plan(grown, gpu)
    assert second["fits"] and second["faster"] is None  # nothing left to grow
    assert "fewer, larger micro-batches" in plan.format_plan(first)
    # one micro-batch per step already (197m on an H100), or a card where the layout is what fits: nothing offered
    assert plan.build_plan(load_config(Y197), gpu)["faster"] is None
    assert plan.build_plan(cfg, memory.parse_gpu("rtx4090"))["faster"] is not None  # 32 GB seeds' layout, 24 GB card
    assert plan.build_plan(cfg, memory.parse_gpu("gtx1650"))["faster"] is None


def test_gpu_names_sizes_and_mistakes(capsys, monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert memory.parse_gpu("H100").total_bytes == 81559 * 2**20
    g = memory.parse_gpu("24GB", headroom=0.0)
    assert g.total_bytes == 24 * 2**30 and g.budget_bytes == int(24 * 2**30 * 0.75)
    # Names from the one GPU table (issue 28): a card's number is its name, never gigabytes.
    for name, key in [("4090", "rtx4090"), ("RTX 4090", "rtx4090"), ("h100-pcie", "h100-pcie"), ("h200", "h200"),
                      ("a100-40", "a100-40"), ("a100-80", "a100-80"), ("l4", "l4"), ("1650", "gtx1650"),
                      ("NVIDIA H100", "h100")]:
        assert memory.parse_gpu(name).name == key, name
    assert memory.parse_gpu("4090").total_bytes == 24564 * 2**20
    with pytest.raises(UserError, match="ambiguous.*24GB"):
        memory.parse_gpu("24")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert memory.parse_gpu("a100-80").mem_fraction == 0.9
    with pytest.raises(UserError, match="did you mean 'rtx4090'"):
        memory.parse_gpu("rtx4900")
    assert plan.main(["--config", TINY, "--gpu", "rtx4900"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown GPU 'rtx4900'") and len(err.splitlines()) == 1
    assert plan.main(["--config", TINY, "--headroom", "1.5"]) == 2
    assert "--headroom" in capsys.readouterr().err


def test_plan_counts_padded_vocabulary_rows_apart():
    cfg = load_config(Y197)
    p = plan.build_plan(cfg, suggest=False)
    assert p["params_total"] == 196_398_464 == accounting.param_count(cfg)  # the model's parameters
    assert p["params_allocated"] - p["params_total"] == (200_064 - 200_005) * 128  # padded rows: allocated only
    assert p["vocab"] == {"size": 200_005, "padded": 200_064}
    assert accounting.state_bytes(cfg)["weights"] == 4 * p["params_allocated"]


def test_a_run_on_a_gpu_that_holds_larger_micro_batches_is_told_so_in_one_line():
    # what `train` warns at its start on a GPU (training.loop.micro_batch_hint): the plan's finding in one line
    from yxanul_jax.training.loop import micro_batch_hint

    budget = memory.parse_gpu("h100").budget_bytes
    hint = micro_batch_hint(load_config(str(REPO / "configs/yxanul_270m.yaml")), budget)
    assert hint == ("this GPU holds larger micro-batches: stage 0: batch 8 x accum 32 -> 256 x 1 (same 32,768 tokens "
                    "per step) (and 5 more); the same sums run faster in fewer, larger micro-batches: `python -m "
                    "yxanul_jax.plan --config FILE --gpu GPU` prints that config")
    assert micro_batch_hint(load_config(Y197), budget) is None  # one micro-batch a step already
