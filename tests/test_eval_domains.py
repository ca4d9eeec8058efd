"""`eval.domains` adds validation domains beside the training data's held-out split, which stays unless
`eval.in_domain=false` (yxanul_jax/training/evaluate.py)."""
from __future__ import annotations

import dataclasses

import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.prepare import prepare_documents
from yxanul_jax.training.evaluate import resolve_domains

from conftest import TRAINED_RUN
from data_fixtures import docs, prepared, tiny_tok, write_parquet  # noqa: F401  (fixtures)


def test_domains_add_to_the_held_out_split_unless_it_is_turned_off(prepared, tmp_path, docs):
    ds = open_dataset(prepared)
    code = write_parquet(tmp_path / "code.parquet", {"text": docs[:30]})
    names = [d.name for d in resolve_domains({"code": str(code)}, ds)]
    assert names == ["heldout", "code"]
    assert [d.name for d in resolve_domains({}, ds)] == ["heldout"]
    assert [d.name for d in resolve_domains({"code": str(code)}, ds, in_domain={})] == ["code"]
    mixture = resolve_domains({"code": str(code)}, ds, in_domain={"books": ds, "web": ds})
    assert [d.name for d in mixture] == ["heldout-books", "heldout-web", "code"]


def test_taken_names_and_a_missing_held_out_split_are_one_line(prepared, tmp_path, docs, tiny_tok):
    ds = open_dataset(prepared)
    code = str(write_parquet(tmp_path / "code.parquet", {"text": docs[:30]}))
    for name in ("heldout", "mean"):
        with pytest.raises(UserError, match=f"eval domain '{name}': the name is taken.*rename eval.domains.{name}"):
            resolve_domains({name: code}, ds)
    prepare_documents([docs[:100]], tiny_tok, tmp_path / "train-only", request={"t": 1}, val_fraction=0.0,
                      progress=False)
    train_only = open_dataset(tmp_path / "train-only")
    with pytest.raises(UserError, match="no 'val' documents.*or set eval.in_domain=false") as e:
        resolve_domains({"code": code}, train_only)
    assert "\n" not in str(e.value)
    assert [d.name for d in resolve_domains({"code": code}, train_only, in_domain={})] == ["code"]


def test_a_prepared_domain_of_another_tokenizer_is_refused(prepared, tmp_path, docs):
    from yxanul_jax.data.tokenizer import train_bpe

    ds = open_dataset(prepared)
    other = train_bpe([docs[::-1][:200]], ds.vocab_size)  # another tokenizer of the same vocabulary size
    prepare_documents([docs[:100]], other, tmp_path / "other", request={"t": 1}, val_fraction=0.5, progress=False)
    assert open_dataset(tmp_path / "other").vocab_size == ds.vocab_size  # the vocabulary check alone passes
    with pytest.raises(UserError, match=r"eval domain 'web' \('.*other'\) was tokenized with another tokenizer "
                                        r".* than the training data .*prepare it with the training data's tokenizer"):
        resolve_domains({"web": str(tmp_path / "other")}, ds)
    # the same tokenizer's prepared dataset is taken
    assert [d.name for d in resolve_domains({"same": str(prepared)}, ds, in_domain={})] == ["same"]


def test_in_domain_off_needs_a_domain():
    with pytest.raises(UserError, match="eval.in_domain.*nothing to validate on"):
        load_config(None, ["eval.in_domain=false"])
    assert load_config(None, ["eval.in_domain=false", "eval.domains.code=/x"]).eval.in_domain is False


def test_eval_only_reports_the_held_out_split_beside_the_domains(trained_run, tmp_path, docs):
    from yxanul_jax.training.session import evaluate_checkpoint

    code = str(write_parquet(tmp_path / "code.parquet", {"text": docs[:40]}))
    cfg = load_config(None, TRAINED_RUN + [f"eval.domains.code={code}"])
    step, row = evaluate_checkpoint(cfg, str(trained_run))
    assert step == 6 and row["val/heldout/tokens"] > 0 and row["val/code/tokens"] > 0
    total = row["val/heldout/tokens"] + row["val/code/tokens"]
    mean = (row["val/heldout/loss"] * row["val/heldout/tokens"] + row["val/code/loss"] * row["val/code/tokens"]) / total
    assert row["val/mean/loss"] == pytest.approx(mean, rel=1e-9)
    only = evaluate_checkpoint(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, in_domain=False)),
                               str(trained_run))[1]
    assert "val/heldout/loss" not in only and only["val/code/loss"] == pytest.approx(row["val/code/loss"], rel=1e-6)


def test_a_raw_domain_that_is_no_utf8_names_the_prepare_command_that_replaces_it(prepared, tmp_path, monkeypatch):
    """eval.domains has no --bad-utf8: the error names the `prepare` command that replaces such text, and the
    dataset that command writes is a domain."""
    import re
    import shlex

    from yxanul_jax import prepare

    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    ds = open_dataset(prepared)
    broken = tmp_path / "broken text.txt"  # a space: the command quotes it
    broken.write_bytes(b"a paragraph of text\n\nbad \xff\xfe bytes\n")
    with pytest.raises(UserError, match="invalid UTF-8") as e:
        resolve_domains({"web": str(broken)}, ds, in_domain={})
    message = str(e.value)
    assert "\n" not in message and message.endswith("and set eval.domains.web=DIR"), message
    command = shlex.split(re.search(r"\(python -m yxanul_jax\.prepare (.*)\)", message).group(1))
    out = tmp_path / "web"
    assert prepare.main([str(out) if a == "DIR" else a for a in command] + ["--no-progress"]) == 0
    (domain,) = resolve_domains({"web": str(out)}, ds, in_domain={})
    assert domain.name == "web" and domain.dataset.num_tokens("val") > 0
