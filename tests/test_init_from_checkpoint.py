"""`init.from_checkpoint`: a fresh run on another run's weights (a fresh optimizer from step 0, its own optimizer,
data and schedule), the refusal of a resume with another optimizer that names it, and its mistakes in one line."""
import os
import shutil

import jax
import numpy as np

from yxanul_jax.core.config import load_config
from yxanul_jax.training.checkpoint import read_checkpoint
from yxanul_jax.training.steps import abstract_train_state

from conftest import TRAINED_RUN
from data_fixtures import docs, run_cli  # noqa: F401  (fixture)


def cli(*args) -> tuple[int, str, str]:
    from yxanul_jax.cli import main

    return run_cli(main, ["train", *args])


def params_of(path, overrides=()) -> dict:
    abstract = abstract_train_state(load_config(None, [*TRAINED_RUN, *overrides])).model_parts()
    _, model, _ = read_checkpoint(str(path), {"params": abstract["params"]}, partial=True)
    return jax.tree.map(np.asarray, model["params"])


def test_a_resume_under_another_optimizer_names_the_start_that_takes_its_weights(trained_run, tmp_path):
    """The refusal names init.from_checkpoint; the run it names starts from the checkpoint's parameters (at a
    learning rate of 1e-12, one AdamW step leaves them as they were) with AdamW's fresh state at step 0. (The
    trained run is Muon's, the default.)"""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    rc, _, err = cli("--run-dir", run, *TRAINED_RUN, "optim.name=adamw")
    assert rc == 2 and err.count("\n") == 1, err
    named = f"init.from_checkpoint={run / 'checkpoints'}"
    assert "'optim.name' is 'muon', not 'adamw', which a resume cannot change" in err and named in err, err
    # --checkpoint (its whole state, into another folder): the same refusal in one line, before anything is written
    rc, _, err = cli("--run-dir", tmp_path / "elsewhere", "--checkpoint", run / "checkpoints", *TRAINED_RUN,
                     "optim.name=adamw", "train.steps=20")
    assert rc == 2 and err.count("\n") == 1 and not (tmp_path / "elsewhere").exists(), err
    assert ("was saved with optim.name=muon, but optim.name=adamw is given here, and --checkpoint continues its "
            f"optimizer state: pass optim.name=muon, or {named} instead of --checkpoint") in err, err

    fresh = tmp_path / "adamw"
    tiny_rates = ["optim.lr=1e-12", "optim.muon_lr=1e-12", "train.steps=1", "checkpoint.interval=1"]
    rc, out, err = cli("--run-dir", fresh, *TRAINED_RUN, "optim.name=adamw", *tiny_rates, named)
    assert rc == 0, err[-2000:]
    assert "initialized from step 6 of" in out + err
    before, after = params_of(run / "checkpoints"), params_of(fresh / "checkpoints", ["optim.name=adamw"])
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after)):
        np.testing.assert_allclose(b, a, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    _, state, meta = read_checkpoint(str(fresh / "checkpoints"),
                                     abstract_train_state(load_config(None, [*TRAINED_RUN, "optim.name=adamw"])))
    assert int(state.step) == 1 and meta["tokens"] == 8 * 32  # one step of its own, its own data position

    # the run resumes as any run does, its source read only at its start: gone by now, it is not missed
    shutil.rmtree(run)
    rc, out, err = cli("--run-dir", fresh, *TRAINED_RUN, "optim.name=adamw", *tiny_rates[:2], "train.steps=2", named)
    assert rc == 0 and "initialized from" not in out + err and "resumed from step 1" in out + err, err[-2000:]
    said = out + err  # the changed setting is named once the run has resumed, after the line that says so
    assert said.index("resumed from step 1") < said.index("setting(s) differ from the run's config.yaml and are taken "
                                                           "from here on: train.steps 1 -> 2"), said[-2000:]
    # its latest checkpoint damaged: the sizes come from the one the restore falls back to, as the resume itself
    for f in (fresh / "checkpoints" / "2").rglob("*"):
        if f.is_file():
            f.write_bytes(b"damaged")
    rc, out, err = cli("--run-dir", fresh, *TRAINED_RUN, "optim.name=adamw", *tiny_rates[:2], "train.steps=3", named)
    assert rc == 0 and "resumed from step 1" in out + err and "corrupt" in out + err, err[-2000:]
    # resumed without the init key: the run's start source is carried over (its sizes from its own checkpoints), so
    # config.yaml keeps naming it and the original command still resumes after
    more = ["optim.name=adamw", *tiny_rates[:2], "train.extend=decay"]
    rc, out, err = cli("--run-dir", fresh, *TRAINED_RUN, *more, "train.steps=4")
    assert rc == 0 and "resumed from step 3" in out + err and "init.from_checkpoint" not in err, err[-2000:]
    import yaml
    assert yaml.safe_load((fresh / "config.yaml").read_text())["init"]["from_checkpoint"] == str(run / "checkpoints")
    rc, out, err = cli("--run-dir", fresh, *TRAINED_RUN, *more, "train.steps=5", named)
    assert rc == 0 and "resumed from step 4" in out + err, err[-2000:]
    # another source: refused, naming the run's own start as the way to resume
    rc, _, err = cli("--run-dir", fresh, *TRAINED_RUN, *more, "train.steps=6", f"init.from_checkpoint={fresh / 'ckpt'}")
    assert rc == 2 and f"a run started from {named}, which training would resume instead" in err, err[-2000:]
    assert f"or pass {named} or leave init.from_checkpoint out to resume it" in err, err[-2000:]


def test_its_mistakes_are_one_line_and_write_nothing(trained_run, tmp_path, docs):  # noqa: F811
    from yxanul_jax.data.prepare import prepare_documents
    from yxanul_jax.data.tokenizer import train_bpe

    ckpt = str(trained_run / "checkpoints")
    other = tmp_path / "other-tokenizer"  # the same vocabulary size, other token ids
    prepare_documents([docs[:200]], train_bpe([docs[::-1][:200]], 512), other, request={"t": 1}, val_fraction=0.1,
                      progress=False)
    out = tmp_path / "new"
    cases = [
        ([f"init.from_checkpoint={tmp_path / 'nowhere'}"], "init.from_checkpoint '"),
        ([f"init.from_checkpoint={ckpt}", "--checkpoint", ckpt], "pass one of them"),
        ([f"init.from_checkpoint={ckpt}", "init.from_hf=somewhere"], "both name the starting weights; keep one"),
        ([f"init.from_checkpoint={ckpt}", f"data.train={other}"], "was trained on text of another tokenizer"),
    ]
    for args, needle in cases:
        rc, _, err = cli("--run-dir", out, *TRAINED_RUN, *args)
        assert rc == 2 and err.count("\n") == 1 and needle in err, (args, err[-2000:])
        assert not os.path.exists(out)
    # given to a run directory that holds checkpoints (a forgotten --run-dir): refused, not ignored for a resume
    own = tmp_path / "own"
    shutil.copytree(trained_run, own)
    before = {p: p.read_bytes() for p in own.rglob("*") if p.is_file()}
    rc, _, err = cli("--run-dir", own, *TRAINED_RUN, "train.steps=8", "train.extend=decay",
                     f"init.from_checkpoint={ckpt}")
    assert rc == 2 and err.count("\n") == 1, err[-2000:]
    assert (f"init.from_checkpoint={ckpt} starts a fresh run from those weights, but run directory '{own}' holds "
            "checkpoints (latest step 6), which training would resume instead; pass a new --run-dir, or --overwrite"
            ) in err, err
    assert {p: p.read_bytes() for p in own.rglob("*") if p.is_file()} == before
    rc, _, err = cli("--run-dir", out, *TRAINED_RUN, "model.d_model=32", f"init.from_checkpoint={ckpt}",
                     "train.steps=1")
    assert rc == 0 and "the model's sizes are those of" in err and "model.d_model 32 -> 64" in err, err[-2000:]


def test_a_checkpoint_continued_on_other_data_leaves_no_run_directory(trained_run, tmp_path, docs):  # noqa: F811
    """--checkpoint with another data.train: the stream's restore refuses it (by content), after the new folder was
    made; the folder is removed again, so that a retry does not find a config.yaml that contradicts it."""
    from yxanul_jax.data.prepare import prepare_documents
    from yxanul_jax.data.tokenizer import load_tokenizer

    other = tmp_path / "same-tokenizer"  # the run's own tokenizer, other documents
    prepare_documents([docs[:200]], load_tokenizer(trained_run / "tokenizer.json"), other, request={"t": 2},
                      val_fraction=0.1, progress=False)
    out = tmp_path / "new"
    rc, _, err = cli("--run-dir", out, *TRAINED_RUN, "train.steps=8", "train.extend=decay", f"data.train={other}",
                     "--checkpoint", trained_run / "checkpoints")
    assert rc == 2 and "belongs to another dataset" in err.strip().splitlines()[-1], err[-2000:]
    assert not out.exists()
