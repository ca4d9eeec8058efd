"""`optim.name: muon` (issue 26): which parameters Muon trains, its update, cautious decay, the optimizer
state's size and sharding, FP8 state outside it, a bit-exact resume through a real Orbax checkpoint, and
the refusal to resume an AdamW run under Muon."""
import collections
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from yxanul_jax.analysis import accounting
from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.training import optim

from conftest import REPO, TRAINED_RUN, load_script, stop_after


def _dot_lines(update, *args) -> list[str]:
    """The `dot_general` lines of `update` lowered for `args` (StableHLO: operand and result types on each line)."""
    return [line for line in jax.jit(update).lower(*args).as_text().splitlines() if "dot_general" in line]


def _params(overrides):
    from yxanul_jax.training.steps import init_train_state

    return init_train_state(load_config(None, overrides), jax.random.key(0)).params


@pytest.mark.parametrize("overrides", [[], ["model.scan_layers=true", "model.remat=full"],
                                       ["model.head=untied", "model.embed_rank=0"]], ids=["unrolled", "scanned", "untied"])
def test_muon_trains_the_blocks_kernels_and_adamw_the_rest(overrides):
    overrides = TRAINED_RUN + ["optim.name=muon", *overrides]
    params = _params(overrides)
    labels = optim.muon_labels(params)
    by_label = collections.defaultdict(int)
    names = {}
    for (path, leaf), label in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(labels)):
        by_label[label] += leaf.size
        names[jax.tree_util.keystr(path)] = label
    assert by_label["muon"] == accounting.muon_param_count(load_config(None, overrides))
    for key, label in names.items():
        expect = "muon" if "kernel" in key and ("'attn'" in key or "'mlp'" in key) else "adamw"
        assert label == expect, key  # embedding, embed_proj, head, norm scales: AdamW


def test_a_muon_step_is_an_orthogonalized_momentum():
    # One matrix, one step from zero momentum with Nesterov: the update is NS5(g); its singular values sit near
    # 1 (the quintic iteration maps them into about [0.7, 1.2]) where g's spread over 100x.
    g = jax.random.normal(jax.random.key(0), (64, 32)) * jnp.logspace(-1, 1, 32)[None, :]
    tx = optax.contrib.scale_by_muon(beta=0.95, nesterov=True)
    u, _ = tx.update(g, tx.init(g))
    s = np.linalg.svd(np.asarray(u), compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.3, s
    sg = np.linalg.svd(np.asarray(g), compute_uv=False)
    assert sg.max() / sg.min() > 30


@pytest.mark.parametrize("overrides", [[], ["model.scan_layers=true", "model.remat=full"],
                                       ["model.fuse_projections=true", "fp8.backend=none"]],
                         ids=["unrolled", "scanned", "fused"])
def test_newton_schulz_runs_once_per_matrix_shape_with_optax_state_and_updates(overrides):
    """`muon.scale_by_muon` against optax's `scale_by_muon` leaf by leaf: the same state (a checkpoint of one
    restores into the other), updates equal to float32 rounding (|u| ~ 0.1-1, the quintic's output) over three
    steps on the model's own kernels (tall, wide and square; q/k/v and gate/up of one shape), and the lowered
    update holds one iteration's 3 GEMMs (a loop of 5) per distinct matrix shape, not per kernel."""
    from optax.contrib import MuonDimensionNumbers

    from yxanul_jax.training import muon

    params = _params(TRAINED_RUN + overrides)
    labels = jax.tree_util.tree_leaves(optim.muon_labels(params))
    kernels = {jax.tree_util.keystr(k): v for (k, v), lab in zip(jax.tree_util.tree_leaves_with_path(params), labels)
               if lab == "muon"}
    shapes = {v.shape[-2:] for v in kernels.values()}
    assert len(shapes) < len(kernels) and any(v.shape[-2] > v.shape[-1] for v in kernels.values())  # down is tall
    ours = muon.scale_by_muon(0.95)
    ref = optax.contrib.scale_by_muon(beta=0.95, nesterov=True, weight_dimension_numbers={
        k: MuonDimensionNumbers(v.ndim - 2, v.ndim - 1) for k, v in kernels.items()})
    ours_state, ref_state = ours.init(kernels), ref.init(kernels)
    assert jax.tree_util.tree_structure(ours_state) == jax.tree_util.tree_structure(ref_state)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype), ours_state,
                                            ref_state)))
    np.testing.assert_array_equal(ours_state.ns_coeffs, ref_state.ns_coeffs)
    ours_update, ref_update = jax.jit(ours.update), jax.jit(ref.update)
    for i in range(3):
        grads = {k: jax.random.normal(jax.random.fold_in(jax.random.key(i), n), v.shape)
                 for n, (k, v) in enumerate(kernels.items())}
        u, ours_state = ours_update(grads, ours_state)
        r, ref_state = ref_update(grads, ref_state)
        for k in kernels:
            assert float(jnp.abs(r[k]).max()) > 0.05, k
            np.testing.assert_allclose(u[k], r[k], rtol=0, atol=3e-6, err_msg=k)
            np.testing.assert_array_equal(ours_state.mu[k], ref_state.mu[k], err_msg=k)  # elementwise: bit-exact

    def lowered(update):
        return update.lower(grads, ours_state).as_text()

    assert lowered(ours_update).count("dot_general") == 3 * len(shapes)
    assert lowered(ref_update).count("dot_general") == 3 * len(kernels)
    # a tall kernel is turned first: every Gram matrix X X^T is of the shorter side (d_model 64; ffn_dim 128 would
    # make down's 128 x 128)
    assert "x128x128xf32>" not in lowered(ours_update)


def test_newton_schulz_in_bfloat16_is_float32s_to_its_rounding_in_bf16_gemms():
    """`optim.muon_ns_dtype=bfloat16` (Keller Jordan's Muon): the same momentum (bit-exact: it is taken before the
    iterations), float32 updates within 6 % of the float32 iterations' (relative Frobenius error per kernel, 2.9-4.1 %
    on the tiny model's: BF16 keeps 8 bits, and the quintic's coefficients, up to 4.8 and kept float32, amplify its
    rounding over five iterations), their singular values in the same band, and every GEMM of the lowered update on
    BF16 operands, as many GEMMs as in float32."""
    from yxanul_jax.training import muon

    params = _params(TRAINED_RUN)
    labels = jax.tree_util.tree_leaves(optim.muon_labels(params))
    kernels = {jax.tree_util.keystr(k): v for (k, v), lab in zip(jax.tree_util.tree_leaves_with_path(params), labels)
               if lab == "muon"}
    f32, bf16 = muon.scale_by_muon(0.95), muon.scale_by_muon(0.95, ns_dtype="bfloat16")
    state = f32.init(kernels)
    grads = {k: jax.random.normal(jax.random.fold_in(jax.random.key(7), n), v.shape)
             for n, (k, v) in enumerate(kernels.items())}
    (u32, state32), (u16, state16) = jax.jit(f32.update)(grads, state), jax.jit(bf16.update)(grads, state)
    errors = []
    for k in kernels:
        assert u16[k].dtype == jnp.float32, k
        np.testing.assert_array_equal(state16.mu[k], state32.mu[k], err_msg=k)
        errors.append(float(jnp.linalg.norm(u16[k] - u32[k]) / jnp.linalg.norm(u32[k])))
        s16, s32 = (np.linalg.svd(np.asarray(u[k]).reshape(-1, *u[k].shape[-2:]), compute_uv=False) for u in (u16, u32))
        # the quintic maps singular values into about [0.7, 1.2] rather than to 1 (Keller Jordan's coefficients), so
        # rounding moves them inside that band: BF16's stay in it wherever float32's are (a square kernel's smallest
        # value of a random matrix, near 0, is lifted by neither)
        assert s16.max() < 1.3 and s16[s32 > 0.6].min() > 0.5, (k, s16, s32)
    # BF16's rounding, and no more: 2.9-4.1 % here; 4.9-8.1 % with the coefficients rounded to BF16 too
    assert 1e-3 < min(errors) and max(errors) < 0.06, errors
    # BF16 operands and a float32 product (rounded after: a sharded GEMM sums its partials in float32, as one
    # device's accumulator does)
    dots = _dot_lines(bf16.update, grads, state)
    assert dots and all(line.count("xbf16>") == 2 and line.endswith("xf32>") for line in dots)
    assert len(dots) == len(_dot_lines(f32.update, grads, state))


def test_on_a_gpu_without_fsdp_the_newton_schulz_gemms_round_their_own_products():
    """`make_optimizer(cfg, platform)`: where a GPU holds whole kernels (mesh.fsdp 1) each BF16 Newton-Schulz GEMM
    writes BF16 itself (cuBLASLt rounds in its epilogue: no float32 product through memory); under FSDP (mesh.fsdp
    -1 too: the mesh may shard), or on a CPU (whose BF16 dot is not the float32 product rounded), each writes float32,
    rounded after."""
    params = _params(TRAINED_RUN)
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.01), params)
    counts = set()
    for fsdp, platform, product in ((1, "gpu", "xbf16>"), (2, "gpu", "xf32>"), (-1, "gpu", "xf32>"),
                                    (1, "cpu", "xf32>")):
        mesh = [f"mesh.fsdp={fsdp}"] + (["mesh.data=1"] if fsdp == -1 else [])
        opt = optim.make_optimizer(load_config(None, [*TRAINED_RUN, *mesh]), platform)
        ns = [line for line in _dot_lines(opt.update, grads, opt.init(params), params) if line.count("xbf16>") >= 2]
        assert ns and all(line.endswith(product) for line in ns), (fsdp, platform, ns[:2])
        counts.add(len(ns))
    assert len(counts) == 1  # the same GEMMs, only what they write differs


def test_muon_rounding_check_compares_both_products_at_a_configs_shapes(tmp_path):
    # scripts/muon_rounding_check.py (a GPU lease's check that BF16-writing GEMMs round as float32 products do): on
    # a CPU the forms differ (XLA's CPU BF16 dot is not the float32 product rounded, and five iterations spread an
    # ulp), by BF16's own rounding and no more, which is why the CPU keeps float32 products
    from data_fixtures import run_cli

    rc, out, _ = run_cli(load_script("muon_rounding_check").main,
                         ["--config", "configs/tiny.yaml", "--layers", "1", "--iters", "1",
                          "--json-out", str(tmp_path / "r.json")])
    row = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and row == json.loads((tmp_path / "r.json").read_text())
    assert row["kernels"] == 7 and row["platform"] == "cpu"
    assert set(row["ms"]) == {"float32 iterations", "float32 products", "bf16 products"}
    assert 0 < row["differ_share"] < 1 and 0 < row["relative_frobenius"] < 0.06, row


def _saved_without(run_dir, overrides: list[str], key: str) -> dict:
    """A run directory of `overrides` with a checkpoint, whose config.yaml then loses `key` (optim.NAME), as one
    written before that key existed; returns the saved dict as it was before the key was removed."""
    import yaml

    from yxanul_jax.core.rundir import prepare_run_dir

    prepare_run_dir(str(run_dir), load_config(None, overrides))
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    section, name = key.split(".")
    without = {**saved, section: {k: v for k, v in saved[section].items() if k != name}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(without))
    return saved


def test_a_config_saved_before_muon_ns_dtype_existed_ran_float32(tmp_path, capsys):
    # The default became bfloat16 (2026-11-29); a run directory or checkpoint saved before holds no
    # optim.muon_ns_dtype and ran its iterations in float32 (config.SAVED_WITHOUT). A resume under today's default
    # may change it (the rate-like keys may: config.RESUME) and says so; an AdamW run is not told about Muon's keys.
    from yxanul_jax.core.config import from_saved
    from yxanul_jax.core.rundir import prepare_run_dir

    assert load_config().optim.muon_ns_dtype == "bfloat16" and from_saved({}).optim.muon_ns_dtype == "float32"
    run_dir = tmp_path / "run"
    saved = _saved_without(run_dir, [], "optim.muon_ns_dtype")
    assert saved["optim"]["muon_ns_dtype"] == "bfloat16"  # written out, so a later default change shows on resume
    assert load_config(str(run_dir / "config.yaml"), run=True).optim.muon_ns_dtype == "float32"
    capsys.readouterr()
    prepare_run_dir(str(run_dir), load_config())
    told = capsys.readouterr().err
    assert "optim.muon_ns_dtype" in told and "'bfloat16'" in told and "pass them: optim.muon_ns_dtype=float32" in told
    # an AdamW run never read the Muon group's settings: their changed defaults are no change of it, and unsaid
    adamw_dir = tmp_path / "adamw"
    _saved_without(adamw_dir, ["optim.name=adamw", "optim.muon_lr=0.005"], "optim.muon_ns_dtype")
    capsys.readouterr()
    prepare_run_dir(str(adamw_dir), load_config(None, ["optim.name=adamw"]))
    assert "differ" not in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [[], ["model.scan_layers=true", "model.remat=full"]], ids=["unrolled", "scanned"])
def test_the_muon_group_steps_as_optax_contrib_muon(overrides):
    """The reference is optax's whole Muon (orthogonalized Nesterov momentum, its iterations in float32 as optax runs
    them, then the width scaling sqrt(max(1, fan_out / fan_in)) that `scale_by_muon` alone leaves out, then decay and
    the rate) on the same kernels: three steps of random gradients agree on every Muon leaf, the wide gate and up
    kernels included."""
    from optax.contrib import MuonDimensionNumbers, muon

    cfg = load_config(None, TRAINED_RUN + ["optim.name=muon", "optim.schedule=constant", "optim.warmup_steps=0",
                                           "optim.muon_weight_decay=0.1", "optim.muon_ns_dtype=float32", *overrides])
    params = _params(TRAINED_RUN + overrides)
    labels = optim.muon_labels(params)
    flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
    is_muon = {jax.tree_util.keystr(k): lab == "muon"
               for (k, _), lab in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(labels))}
    kernels = {k: v for k, v in flat.items() if is_muon[k]}
    assert any("gate" in k for k in kernels) and any("up" in k for k in kernels)
    o = cfg.optim
    ref = muon(learning_rate=o.muon_lr, beta=o.muon_momentum, nesterov=True, weight_decay=o.muon_weight_decay,
               muon_weight_dimension_numbers={k: MuonDimensionNumbers(v.ndim - 2, v.ndim - 1) for k, v in kernels.items()})
    ours = optim.make_optimizer(cfg)
    ours_state, ref_state = ours.init(params), ref.init(kernels)
    scanned = "model.scan_layers=true" in overrides
    assert sum(v.shape[-1] > v.shape[-2] for v in kernels.values()) == 2 * (1 if scanned else cfg.model.n_layers)
    for i in range(3):
        grads = jax.tree_util.tree_map(lambda p, i=i: jax.random.normal(jax.random.key(i), p.shape, p.dtype), params)
        u, ours_state = ours.update(grads, ours_state, params)
        g = {k: v for k, v in zip(flat, jax.tree_util.tree_leaves(grads)) if is_muon[k]}
        r, ref_state = ref.update(g, ref_state, kernels)
        got = {k: v for k, v in zip(flat, jax.tree_util.tree_leaves(u)) if is_muon[k]}
        for k in kernels:
            np.testing.assert_allclose(got[k], r[k], rtol=1e-4, atol=1e-7, err_msg=k)


def test_cautious_weight_decay_only_where_update_and_weight_agree():
    p = jnp.array([1.0, 1.0, -1.0, -1.0])
    u = jnp.array([0.5, -0.5, 0.5, -0.5])
    tx = optim.decayed_weights(0.1, cautious=True)
    out, _ = tx.update(u, tx.init(p), p)
    np.testing.assert_allclose(out, [0.6, -0.5, 0.5, -0.6])
    plain = optim.decayed_weights(0.1)
    np.testing.assert_allclose(plain.update(u, plain.init(p), p)[0], [0.6, -0.4, 0.4, -0.6])


def test_muon_runs_with_fp8_and_accumulation_and_keeps_fp8_state_out():
    from yxanul_jax.training.batch import BatchSpec
    from yxanul_jax.training.steps import init_train_state, make_train_step

    cfg = load_config(None, TRAINED_RUN + ["optim.name=muon", "curriculum.0.grad_accum_steps=2",
                                           "curriculum.0.batch_size=4"])
    assert cfg.fp8.active
    state = init_train_state(cfg, jax.random.key(0))
    fp8_leaves = {id(x) for x in jax.tree_util.tree_leaves(state.fp8)}
    assert fp8_leaves and not fp8_leaves & {id(x) for x in jax.tree_util.tree_leaves(state.opt_state)}
    stage = cfg.curriculum[0]
    spec = BatchSpec.of(stage)
    k = jax.random.split(jax.random.key(1), 2)
    shape = spec.abstract()["inputs"].shape
    batch = {"inputs": jax.random.randint(k[0], shape, 0, 512), "targets": jax.random.randint(k[1], shape, 0, 512),
             "mask": jnp.ones(shape, jnp.float32)}
    step = jax.jit(make_train_step(cfg, stage))
    losses = []
    for _ in range(4):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    mu = state.opt_state.inner_states["muon"].inner_state[0].mu
    assert any(float(jnp.abs(x).sum()) > 0 for x in jax.tree_util.tree_leaves(mu))  # the momentum is state


def test_resume_is_bit_exact_with_muon(tmp_path, capsys):
    import json
    import shutil

    from yxanul_jax.training.checkpoint import read_checkpoint_meta
    from yxanul_jax.training.integrity import META_CHECKSUMS, meta_checksums
    from yxanul_jax.training.loop import MUON_WIDTH_KEY, fit

    overrides = TRAINED_RUN + ["optim.name=muon", "train.log_every=1", "checkpoint.interval=3"]
    whole = fit(load_config(None, overrides), str(tmp_path / "whole"))
    fit(load_config(None, overrides), str(tmp_path / "part"), hooks=[stop_after(3)])
    assert read_checkpoint_meta(str(tmp_path / "part" / "checkpoints"))[MUON_WIDTH_KEY] is True
    shutil.copytree(tmp_path / "part", tmp_path / "old")  # the same checkpoint as one saved before the key existed
    meta_file = tmp_path / "old" / "checkpoints" / "3" / "meta" / "metadata"  # Orbax's JsonSave: plain JSON
    meta = json.loads(meta_file.read_text())
    meta.pop(MUON_WIDTH_KEY)
    meta.pop(META_CHECKSUMS)
    meta[META_CHECKSUMS] = meta_checksums(meta, 3)  # re-signed: an intact checkpoint, not a damaged one
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    resumed = fit(load_config(None, overrides), str(tmp_path / "part"))  # steps 4..6 from the Orbax checkpoint
    assert whole.step == resumed.step == 6
    note = "this Muon checkpoint does not say it was saved with Muon's width scaling"
    said = capsys.readouterr().err
    assert note not in said and "setting(s) differ" not in said, said  # only a checkpoint from before says so
    fit(load_config(None, overrides), str(tmp_path / "old"))
    assert note in capsys.readouterr().err

    def rows(run):
        with open(os.path.join(run, "metrics.jsonl")) as fh:
            return {r["step"]: r["loss"] for r in map(json.loads, fh) if "loss" in r}

    assert rows(str(tmp_path / "part")) == rows(str(tmp_path / "whole"))


def test_an_adamw_run_does_not_resume_under_muon(tmp_path):
    from yxanul_jax.core.rundir import prepare_run_dir

    assert load_config().optim.name == "muon"  # the default since the studies (docs/QUALITY.md)
    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), load_config(None, ["optim.name=adamw"]))
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    with pytest.raises(UserError, match="'optim.name' is 'adamw', not 'muon'.*pass optim.name=adamw to resume it as "
                                        "it was, a new --run-dir with init.from_checkpoint="):
        prepare_run_dir(str(run_dir), load_config())
    with pytest.raises(UserError, match="optim.muon_lr"):
        load_config(None, ["optim.name=muon", "optim.muon_lr=0"])


def test_a_config_saved_before_optim_name_existed_was_adamw(tmp_path):
    # Run directories and checkpoints written before Muon (2026-11-24) hold no optim.name: AdamW trained them, so
    # the default's change to muon must not read them as Muon runs (config.SAVED_WITHOUT).
    from yxanul_jax.core.config import from_saved
    from yxanul_jax.core.rundir import prepare_run_dir

    run_dir = tmp_path / "run"
    saved = _saved_without(run_dir, ["optim.name=adamw"], "optim.name")
    del saved["optim"]["name"]
    assert from_saved(saved).optim.name == "adamw" and from_saved({}).optim.name == "adamw"
    assert load_config(str(run_dir / "config.yaml"), run=True).optim.name == "adamw"
    with pytest.raises(UserError, match="'optim.name' is 'adamw', not 'muon'.*pass optim.name=adamw"):
        prepare_run_dir(str(run_dir), load_config())
    prepare_run_dir(str(run_dir), load_config(None, ["optim.name=adamw"]))  # resumes as it was


@pytest.mark.slow
def test_newton_schulz_on_an_fsdp_sharded_state_matches_one_device(tmp_path):
    # The same Muon steps on one CPU device and on 8 (fsdp=4 x data=2: every kernel split over fsdp).
    run = TRAINED_RUN + ["optim.name=muon", "model.dtype=float32", "fp8.enabled=false", "train.log_every=1",
                         "eval.batch_size=8"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    losses = {}
    for name, extra in (("one", []), ("eight", ["mesh.data=2", "mesh.fsdp=4"])):
        e = env if extra else {**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        proc = subprocess.run([sys.executable, "-m", "yxanul_jax.train", "--run-dir", str(tmp_path / name), *run, *extra],
                              env=e, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(tmp_path / name / "metrics.jsonl") as fh:
            losses[name] = [r["loss"] for r in map(json.loads, fh) if "loss" in r]
    assert len(losses["one"]) == len(losses["eight"]) == 6
    np.testing.assert_allclose(losses["eight"], losses["one"], rtol=1e-5)
