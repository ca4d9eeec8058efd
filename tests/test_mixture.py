"""A weighted mixture of prepared datasets (`data.train: {books: DIR, code: DIR}`, `data.weights`): the schedule,
exact resume (stream and training), the realized shares in the metrics, and the refusals (yxanul_jax/data/mixture.py)."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.loader import TrainStream
from yxanul_jax.data.mixture import MixtureStream, row_domains
from yxanul_jax.data.prepare import prepare_documents
from yxanul_jax.data.tokenizer import train_bpe

from conftest import shared_path, stop_after
from data_fixtures import docs, run_cli, tiny_tok  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, tiny_tok):
    """Two prepared datasets of real shared text, one tokenizer: Shakespeare paragraphs ('books') and Python
    files ('code')."""
    books = [p for p in shared_path("data", "heldout", "tinyshakespeare.txt").read_text().split("\n\n") if p.strip()]
    code = pq.read_table(shared_path("data", "train", "python_code.parquet")).column("text").to_pylist()
    root = tmp_path_factory.mktemp("mixture")
    for name, texts in (("books", books[:1500]), ("code", [t[:3000] for t in code[:300]])):
        prepare_documents([texts], tiny_tok, root / name, request={"test": name}, val_fraction=0.1, progress=False)
    return root


def test_the_schedule_draws_rows_by_weight_from_the_seed_alone():
    d_N = row_domains(0, [0.7, 0.3], 0, 40_000)
    share = np.mean(d_N == 0)
    assert abs(share - 0.7) < 4 * math.sqrt(0.7 * 0.3 / 40_000), share
    assert np.array_equal(row_domains(0, [0.7, 0.3], 1000, 500), d_N[1000:1500])  # row j's dataset: a function of j
    assert not np.array_equal(row_domains(1, [0.7, 0.3], 0, 500), d_N[:500])  # and of the seed
    assert set(row_domains(5, [0.2, 0.5, 0.3], 0, 3000)) == {0, 1, 2}


def test_one_dataset_as_a_mixture_is_the_plain_stream(corpora):
    ds = open_dataset(corpora / "books")
    mixed, plain = MixtureStream({"books": ds}, {"books": 1.0}, seed=3, lanes=4), TrainStream(ds, seed=3, lanes=4)
    for seq_len, batch in ((16, 8), (16, 8), (32, 4), (8, 16), (64, 4)):
        a, b = mixed.next_batch(seq_len, batch), plain.next_batch(seq_len, batch)
        assert all(np.array_equal(a[k], b[k]) for k in ("inputs", "targets", "mask"))


def test_each_dataset_reads_on_as_its_own_stream_and_shares_follow_the_weights(corpora):
    books, code = open_dataset(corpora / "books"), open_dataset(corpora / "code")
    mixed = MixtureStream({"books": books, "code": code}, {"books": 0.7, "code": 0.3}, seed=1, lanes=1)
    batches = [mixed.next_batch(8, 64) for _ in range(40)]
    domain_N = row_domains(1, [0.7, 0.3], 0, 40 * 64)
    targets_NxL = np.concatenate([b["targets"] for b in batches])
    for d, ds in enumerate((books, code)):  # a dataset's rows, in order, are its own stream's rows
        rows = int(np.sum(domain_N == d))
        own = TrainStream(ds, seed=1, lanes=1).next_batch(8, rows)["targets"]
        assert np.array_equal(targets_NxL[domain_N == d], own)
    tokens = mixed.domain_tokens()
    assert tokens == {"books": 8 * int(np.sum(domain_N == 0)), "code": 8 * int(np.sum(domain_N == 1))}
    assert abs(tokens["books"] / sum(tokens.values()) - 0.7) < 4 * math.sqrt(0.21 / len(domain_N))


def test_restore_gives_the_same_batches_across_shapes_processes_and_workers(corpora):
    sets = {"books": open_dataset(corpora / "books"), "code": open_dataset(corpora / "code")}
    weights = {"books": 0.7, "code": 0.3}
    first = MixtureStream(sets, weights, seed=2, lanes=2)
    for _ in range(5):
        first.next_batch(16, 8)
    state = json.loads(json.dumps(first.get_state()))  # JSON, as a checkpoint keeps it
    want = [first.next_batch(*shape) for shape in ((16, 8), (32, 4), (32, 4))]
    with MixtureStream(sets, weights, seed=2, lanes=2, num_workers=2) as resumed:
        resumed.set_state(state)
        got = [resumed.next_batch(*shape) for shape in ((16, 8), (32, 4), (32, 4))]
    for a, b in zip(want, got):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    parts = [MixtureStream(sets, weights, seed=2, lanes=2, process_index=p, process_count=2) for p in range(2)]
    for p in parts:
        p.set_state(state)
    halves = [p.next_batch(16, 8) for p in parts]
    assert np.array_equal(np.concatenate([h["inputs"] for h in halves]), want[0]["inputs"])
    whole = MixtureStream(sets, weights, seed=2, lanes=2)
    whole.set_state(state)
    whole.next_batch(16, 8)
    assert parts[0].get_state() == parts[1].get_state() == whole.get_state()  # every process keeps the same position
    other = MixtureStream(sets, {"books": 0.5, "code": 0.5}, seed=2, lanes=2)
    with pytest.raises(Exception, match="data.weights"):
        other.set_state(state)
    with pytest.raises(Exception, match="mixture"):
        TrainStream(sets["books"], seed=2, lanes=2).set_state(state)


def _cfg(corpora, *extra):
    return ["model.vocab_size=384", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
            "model.ffn_dim=128", "model.embed_rank=16", "curriculum=[{start_step: 0, seq_len: 16, batch_size: 32}]",
            "train.steps=10", "train.log_every=2", "eval.interval=0", "eval.max_batches=1", "eval.batch_size=4",
            "checkpoint.interval=0", "checkpoint.async_save=false", "optim.warmup_steps=2", "train.sample_tokens=0",
            f"data.train={{books: {corpora / 'books'}, code: {corpora / 'code'}}}", "data.weights.books=0.7",
            "data.weights.code=0.3", *extra]


def _rows(run, key):
    with open(os.path.join(run, "metrics.jsonl")) as fh:
        return [r for r in map(json.loads, fh) if key in r]


def test_training_on_a_mixture_resumes_bit_exactly_and_logs_the_shares(corpora, tmp_path):
    from yxanul_jax.training.loop import fit

    cfg = load_config(None, _cfg(corpora))
    whole = fit(cfg, str(tmp_path / "whole"))
    stopped = fit(cfg, str(tmp_path / "split"), hooks=[stop_after(5)])
    assert stopped.step == 5 and stopped.interrupted
    resumed = fit(cfg, str(tmp_path / "split"))
    assert resumed.step == 10
    want = {r["step"]: r["loss"] for r in _rows(tmp_path / "whole", "loss")}
    assert {r["step"]: r["loss"] for r in _rows(tmp_path / "split", "loss")} == want and len(want) == 5
    shares = _rows(tmp_path / "whole", "data/share/books")
    assert [r["step"] for r in shares] == [2, 4, 6, 8, 10]
    assert all(abs(r["data/share/books"] + r["data/share/code"] - 1) < 1e-9 for r in shares)
    end = shares[-1]
    assert end == _rows(tmp_path / "split", "data/share/books")[-1]  # the same draws, counted across the resume
    rows = 10 * 32
    assert end["data/tokens/books"] + end["data/tokens/code"] == rows * 16
    assert abs(end["data/tokens/books"] / (rows * 16) - 0.7) < 4 * math.sqrt(0.21 / rows)
    # every dataset's own held-out split is validated
    assert whole.validation["val/heldout-books/tokens"] > 0 and whole.validation["val/heldout-code/tokens"] > 0


def test_mixture_mistakes_are_one_line_and_write_nothing(corpora, tmp_path, docs):
    from yxanul_jax.cli import main

    other = train_bpe([docs[::-1][:200]], 384)  # another tokenizer with the same vocabulary size
    prepare_documents([docs[:300]], other, tmp_path / "other", request={"test": "other"}, val_fraction=0.1,
                      progress=False)
    cases = [(["data.train={books: %s, code: %s}" % (corpora / "books", tmp_path / "other")],
              "data.train.code ("),
             (["data.weights.books=0"], "must be a positive number"),
             (["data.weights.books=-1"], "must be a positive number"),
             (["data.weights.bookz=0.5"], "did you mean 'data.weights.books'"),
             ([f"data.train={{books: {corpora / 'books'}, ../code: {corpora / 'code'}}}"], "not a dataset name"),
             ([f"data.train={{books: {corpora / 'books'}, a/b: {corpora / 'code'}}}"], "not a dataset name")]
    for extra, needle in cases:
        run = tmp_path / "run"
        rc, _, err = run_cli(main, ["train", "--run-dir", run, *_cfg(corpora, *extra)])
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (extra, err)
        assert not run.exists()
        if extra[0].startswith("data.train={books: ") and "other" in extra[0]:
            assert "another tokenizer" in lines[0]
