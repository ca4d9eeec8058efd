"""Train step: accumulation equals one big batch, FP8 state max-merges, the loss goes down."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import Config, FP8Config, StageConfig, TrainConfig
from yxanul_jax.training.batch import split_micro_batches
from yxanul_jax.training.steps import (fp8_bootstrap_config, init_train_state, loss_sums, make_accumulate, make_eval_step,
                                       make_train_step)

from conftest import micro_model


def _cfg(fp8: FP8Config, **train) -> Config:
    return dataclasses.replace(Config(), model=micro_model(), fp8=fp8,
                               train=dataclasses.replace(TrainConfig(), loss_chunk=40, **train))


def _batch(a, b, l, vocab, key=0):
    tokens = jax.random.randint(jax.random.key(key), (a * b, l + 1), 0, vocab)
    mask = jnp.ones((a * b, l), jnp.float32).at[0, :3].set(0.0)  # some padding to weigh correctly
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": mask}
    return {k: v.reshape(a, b, l) for k, v in batch.items()}


def test_grad_accumulation_4x2_equals_batch_8():
    # Compared on the summed gradients (float32, rtol 1e-5 of the largest element): comparing
    # parameters after an AdamW step amplifies rounding of near-zero gradients through m / sqrt(v)
    # and failed on some machines at 1.2e-6 absolute.
    cfg = _cfg(FP8Config(enabled=False))
    state = init_train_state(cfg, jax.random.key(0))
    big = _batch(1, 8, 16, cfg.model.vocab_size)
    small = {k: v.reshape(4, 2, 16) for k, v in big.items()}
    one, four = StageConfig(seq_len=16, batch_size=8), StageConfig(seq_len=16, batch_size=2, grad_accum_steps=4)
    g1, _, sums1 = jax.jit(make_accumulate(cfg, one))(state.params, state.fp8, big)
    g4, _, sums4 = jax.jit(make_accumulate(cfg, four))(state.params, state.fp8, small)
    np.testing.assert_allclose(float(sums1["nll"]), float(sums4["nll"]), rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree_util.tree_leaves(g4)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a).max() > 0, jax.tree_util.keystr(path)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(a).max(), err_msg=jax.tree_util.keystr(path))
    _, m1 = jax.jit(make_train_step(cfg, one))(state, big)  # and the full step reports the same loss and norm
    _, m4 = jax.jit(make_train_step(cfg, four))(state, small)
    np.testing.assert_allclose(float(m1["loss"]), float(m4["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m4["grad_norm"]), rtol=1e-5)


def test_micro_split_runs_the_same_step_in_smaller_micro_batches():
    # train.micro_split (set by remat: auto where it lets `none` fit): the loader's batch is unchanged, the step
    # cuts each micro-batch in k (every k-th row), the sums are the same up to float rounding (float32, rtol 1e-5);
    # the FP8 state is max-merged over the pieces, as over any micro-batches.
    # The FP8 head runs in loss chunks of 40 tokens: 2 per micro-batch of 64 tokens, 1 per piece of 32.
    cfg = _cfg(FP8Config(amax_history_len=4, targets=("q", "k", "v", "o", "gate", "up", "down", "head")))
    state = init_train_state(cfg, jax.random.key(0))
    batch = _batch(2, 4, 16, cfg.model.vocab_size)
    stage = StageConfig(seq_len=16, batch_size=4, grad_accum_steps=2)
    split = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_split=2))
    s1, m1 = jax.jit(make_train_step(cfg, stage))(state, batch)
    s2, m2 = jax.jit(make_train_step(split, stage))(state, batch)
    for key in ("loss", "z_loss", "grad_norm", "step_tokens"):
        np.testing.assert_allclose(float(m1[key]), float(m2[key]), rtol=1e-5, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(s1.params), jax.tree_util.tree_leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(s1.fp8), jax.tree_util.tree_leaves(s2.fp8)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, err_msg=jax.tree_util.keystr(path))
    # ... and the step does run 4 pieces: its scan over micro-batches is 4 long, not 2
    scans = lambda c: [e.params["length"] for e in jax.make_jaxpr(make_train_step(c, stage))(state, batch).eqns  # noqa: E731
                       if e.primitive.name == "scan"]
    assert scans(cfg)[0] == 2 and scans(split)[0] == 4  # the first scan (then Muon's Newton-Schulz loops)
    # the pieces are every k-th row of each micro-batch, the rows of micro-batch a before those of a + 1
    rows = jnp.arange(8 * 3).reshape(2, 4, 3)
    cut = split_micro_batches({"inputs": rows}, 2)["inputs"]
    assert cut.shape == (4, 2, 3) and cut[:, :, 0].tolist() == [[0, 6], [3, 9], [12, 18], [15, 21]]
    assert split_micro_batches({"inputs": rows}, 1)["inputs"] is rows


def test_the_loss_chunk_changes_neither_the_step_nor_the_fp8_state():
    # train.loss_chunk (resumable): the head + loss in chunks of 16, 40 or all 64 tokens of a micro-batch (4, 2, 1
    # FP8 head copies, max-merged): the same sums up to float rounding, the same new FP8 state
    cfg = _cfg(FP8Config(amax_history_len=4, targets=("q", "k", "v", "o", "gate", "up", "down", "head")))
    state = init_train_state(cfg, jax.random.key(0))
    batch = _batch(2, 4, 16, cfg.model.vocab_size)
    stage = StageConfig(seq_len=16, batch_size=4, grad_accum_steps=2)
    runs = [jax.jit(make_train_step(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, loss_chunk=c)),
                                    stage))(state, batch) for c in (40, 16, 64)]
    (s1, m1) = runs[0]
    for s2, m2 in runs[1:]:
        for key in ("loss", "z_loss", "grad_norm"):
            np.testing.assert_allclose(float(m1[key]), float(m2[key]), rtol=1e-5, err_msg=key)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(s1.params), jax.tree_util.tree_leaves(s2.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6,
                                       err_msg=jax.tree_util.keystr(path))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(s1.fp8), jax.tree_util.tree_leaves(s2.fp8)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_fp8_state_is_max_merged_across_micro_batches():
    fp8 = FP8Config(amax_history_len=4, targets=("q", "k", "v", "o", "gate", "up", "down", "head"))
    cfg = _cfg(fp8)
    state = init_train_state(cfg, jax.random.key(0))
    quiet = _batch(1, 2, 16, cfg.model.vocab_size, key=1)
    loud = _batch(1, 2, 16, cfg.model.vocab_size, key=2)
    step1 = jax.jit(make_train_step(cfg, StageConfig(seq_len=16, batch_size=2)))
    step2 = jax.jit(make_train_step(cfg, StageConfig(seq_len=16, batch_size=2, grad_accum_steps=2)))
    s_quiet, _ = step1(state, quiet)
    s_loud, _ = step1(state, loud)
    both = {k: jnp.concatenate([quiet[k], loud[k]]) for k in quiet}
    s_both, _ = step2(state, both)
    flat = lambda s: jax.tree_util.tree_leaves_with_path(s.fp8)  # noqa: E731
    for (path, q), (_, l), (_, b) in zip(flat(s_quiet), flat(s_loud), flat(s_both)):
        np.testing.assert_allclose(np.asarray(b), np.maximum(np.asarray(q), np.asarray(l)), rtol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    head = s_both.fp8["fp8_meta"]["head_gemm"]["grad"]["amax_history"]
    assert head.shape == (4,) and float(head[0]) > 0  # chunked head: per-chunk states merged, not summed


def _hidden_l2(coef):
    """A term of one's own on the final hidden states: coef x the squared norm of each real token's, summed."""
    def extra(h_BxLxD, params, batch):
        return {"hidden_l2": coef * jnp.sum(batch["mask"] * jnp.sum(jnp.square(h_BxLxD.astype(jnp.float32)), -1))}
    return extra


def test_a_loss_of_one_s_own_trains_through_the_whole_step():
    """make_train_step(loss=...): a term added through `loss_sums(extra=...)` is in the objective (it moves the
    weights), summed over micro-batches like the NLL and reported per real token as metrics["loss/<name>"] (equal to
    the term computed from the model's hidden states directly, float32 rtol 1e-5); at weight 0 the step is the
    default one. A loss whose sums lack the NLL is refused while tracing."""
    import functools

    from yxanul_jax.model.transformer import Yxanul

    cfg = _cfg(FP8Config(enabled=False))
    state = init_train_state(cfg, jax.random.key(0))
    batch = _batch(2, 2, 16, cfg.model.vocab_size)
    stage = StageConfig(seq_len=16, batch_size=2, grad_accum_steps=2)
    run = lambda loss: jax.jit(make_train_step(cfg, stage, loss=loss))(state, batch)  # noqa: E731
    s0, m0 = run(loss_sums)
    s_zero, m_zero = run(functools.partial(loss_sums, extra=_hidden_l2(0.0)))
    s1, m1 = run(functools.partial(loss_sums, extra=_hidden_l2(1e-3)))
    assert "loss/hidden_l2" not in m0 and float(m_zero["loss/hidden_l2"]) == 0.0
    for a, b in zip(jax.tree_util.tree_leaves(s0.params), jax.tree_util.tree_leaves(s_zero.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    flat = {k: v.reshape(4, 16) for k, v in batch.items()}
    h = Yxanul(cfg.model, cfg.fp8).apply({"params": state.params}, flat["inputs"], method=Yxanul.hidden)
    want = 1e-3 * float(jnp.sum(flat["mask"] * jnp.sum(jnp.square(h), -1)) / jnp.sum(flat["mask"]))
    np.testing.assert_allclose(float(m1["loss/hidden_l2"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(m1["loss"]), float(m0["loss"]), rtol=1e-6)  # "loss" stays the NLL
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(s0.params),
                                                                 jax.tree_util.tree_leaves(s1.params)))
    assert moved > 1e-6  # the term's gradient reached the weights
    with pytest.raises(ValueError, match="holding 'nll' and 'z'"):
        run(lambda *a: (loss_sums(*a)[0], {"nll": loss_sums(*a)[1]["nll"]}))
    with pytest.raises(ValueError, match=r"\['nll'\] are the step's own"):
        run(functools.partial(loss_sums, extra=lambda h, p, b: {"nll": jnp.sum(h)}))
    with pytest.raises(ValueError, match=r"\['hidden l2'\] is not letters, digits"):
        run(functools.partial(loss_sums, extra=lambda h, p, b: {"hidden l2": jnp.sum(h)}))
    _, m = run(functools.partial(loss_sums, extra=lambda h, p, b: {"const": 2.0}))  # a Python number is a term too
    np.testing.assert_allclose(float(m["loss/const"]), 2.0 * 2 / float(jnp.sum(batch["mask"])), rtol=1e-6)


@pytest.mark.slow
def test_loss_decreases_and_eval_matches_train_loss():
    cfg = _cfg(FP8Config(amax_history_len=8), )
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=1e-2, warmup_steps=0))
    state = init_train_state(cfg, jax.random.key(0))
    batch = _batch(1, 4, 16, cfg.model.vocab_size)
    stage = StageConfig(seq_len=16, batch_size=4)
    step = jax.jit(make_train_step(cfg, stage))
    first = jax.jit(make_train_step(fp8_bootstrap_config(cfg), stage))  # fills the delayed-scaling history
    eval_step = jax.jit(make_eval_step(fp8_bootstrap_config(cfg)))  # fresh state: current scaling
    nll, count = eval_step(state.params, state.fp8, {k: v[0] for k, v in batch.items()})
    losses = []
    for i in range(15):
        state, metrics = (first if i == 0 else step)(state, batch)
        assert float(metrics["fp8_nonfinite"]) == 0
        losses.append(float(metrics["loss"]))
    assert abs(losses[0] - float(nll / count)) < 1e-4  # same loss function, same scales
    assert losses[-1] < losses[0] - 1.0
    assert int(state.step) == 15


def test_bootstrap_only_for_delayed_xla_fp8():
    assert fp8_bootstrap_config(_cfg(FP8Config())).fp8.scaling == "current"
    for f in (FP8Config(scaling="current"), FP8Config(enabled=False), FP8Config(backend="none")):
        assert fp8_bootstrap_config(_cfg(f)) is None


@pytest.mark.parametrize("head,rank,d_model,fp8", [("tied", 32, 128, True), ("tied", 0, 128, False),
                                                   ("factorized", 32, 128, False), ("untied", 0, 128, False),
                                                   ("tied", 64, 512, False)])
def test_first_step_loss_is_ln_vocab(head, rank, d_model, fp8):
    # An untrained model should guess uniformly: loss ln V. The final norm's initial gain
    # (model.head_gain) holds the logits' std at 0.1, so the excess is about 0.005 nats; without it
    # the tied factorized head starts 0.10 (d 128) to 0.20 (d 768) above ln V. Tolerance: 0.02.
    # The start is a property of the initialization: FP8 (slow to compile on CPU) in the first case only.
    model = micro_model(vocab_size=4096, vocab_pad_to=1, d_model=d_model, n_heads=4, ffn_dim=3 * d_model,
                        embed_rank=rank, head=head)
    f8 = FP8Config(enabled=True, backend="xla", underflow_stats=True) if fp8 else FP8Config(enabled=False)
    cfg = dataclasses.replace(_cfg(f8), model=model)
    stage = StageConfig(seq_len=64, batch_size=8)
    _, metrics = jax.jit(make_train_step(cfg, stage))(init_train_state(cfg, jax.random.key(0)),
                                                      _batch(1, 8, 64, 4096, key=3))
    assert abs(float(metrics["loss"]) - np.log(4096)) < 0.02, float(metrics["loss"]) - np.log(4096)
    if fp8:
        assert 0 <= float(metrics["fp8_grad_underflow"]) < 1  # measured, a share
