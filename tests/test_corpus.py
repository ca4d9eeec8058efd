"""Tests of yxanul_jax/data/corpus.py: the stdlib demo corpus and its cached, race-safe preparation."""
from __future__ import annotations

import json
import multiprocessing as mp
import platform
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from yxanul_jax.core.errors import UserError
from yxanul_jax.data import corpus
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.loader import TrainStream, eval_batches


def test_stdlib_files_are_deterministic_sorted_capped_and_skip_tests():
    files = corpus.stdlib_files(1_000_000)
    assert files == corpus.stdlib_files(1_000_000) and files == sorted(files)
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = [f.relative_to(root).parts for f in files]
    assert all(not ({"test", "tests", "site-packages"} & set(parts)) for parts in rel)
    assert len({parts[0] for parts in rel}) > 10  # spread over the library, not just its 'a...' start
    total = sum(f.stat().st_size for f in files)
    assert 500_000 < total <= 1_000_000


def test_demo_dataset_is_built_once_into_the_cache_and_streams(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    path = corpus.ensure_demo_dataset()
    said = capsys.readouterr().out  # the first use says what the seconds before the first step are spent on
    assert "demo corpus: training a 4,096-token BPE on Python" in said and "demo corpus ready in" in said
    assert Path(path) == tmp_path / "cache" / f"demo-v2-py{platform.python_version()}-4096"
    ds = open_dataset(path)
    assert ds.vocab_size == 4096 and ds.manifest["tokens"] > 500_000
    assert ds.manifest["tokenizer"]["vocab_size"] == 4096 and ds.tokenizer_path
    stamp = (Path(path) / "manifest.json").stat().st_mtime_ns
    assert corpus.ensure_demo_dataset() == path  # cached: not rebuilt, nothing said
    assert capsys.readouterr().out == ""
    assert (Path(path) / "manifest.json").stat().st_mtime_ns == stamp
    batch = TrainStream(ds, seed=0).next_batch(128, 4)
    assert batch["inputs"].shape == (4, 128) and batch["inputs"].max() < 4096
    assert next(eval_batches(ds, seq_len=128, batch_size=4))["mask"].sum() > 0


def _build(args):
    cache_dir, vocab = args
    return corpus.ensure_demo_dataset(cache_dir, vocab, max_bytes=300_000)


def test_two_racing_processes_build_one_dataset(tmp_path):
    target = str(tmp_path / "demo")
    with mp.get_context("spawn").Pool(2) as pool:
        paths = pool.map(_build, [(target, 512), (target, 512)])
    assert paths == [target, target]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".demo.tmp")] == []
    ds = open_dataset(target)
    assert ds.vocab_size == 512 and np.all(TrainStream(ds, seed=0).next_batch(16, 2)["inputs"] < 512)


def test_a_foreign_dataset_in_the_cache_slot_is_refused(tmp_path):
    target = tmp_path / "demo"
    corpus.ensure_demo_dataset(str(target), 512, max_bytes=200_000)
    with pytest.raises(UserError, match="another dataset"):
        corpus.ensure_demo_dataset(str(target), 640, max_bytes=200_000)


def test_another_python_s_demo_corpus_is_refused_not_reused(tmp_path):
    """Each Python has its own standard library, so its own demo text: a folder built by another Python is not taken
    for this one's (the default cache keeps one folder per Python version)."""
    target = tmp_path / "demo"
    corpus.ensure_demo_dataset(str(target), 512, max_bytes=200_000)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["request"]["python"] = "3.9.0"
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"Python 3\.9\.0's standard library, not of this Python"):
        corpus.ensure_demo_dataset(str(target), 512, max_bytes=200_000)


def test_demo_vocab_equals_a_cap_larger_than_the_corpus_supports(tmp_path):
    ds = open_dataset(corpus.ensure_demo_dataset(str(tmp_path / "demo"), 20_000, max_bytes=200_000))
    assert ds.vocab_size == 20_000  # matches model.vocab_size although merges ran out earlier
    from yxanul_jax.data.tokenizer import load_tokenizer

    tok = load_tokenizer(ds.tokenizer_path)
    assert tok.vocab_size == 20_000 and tok.tokenizer.token_to_id("<|reserved_19999|>") == 19_999
    train = ds.split("train")
    ids = np.concatenate([np.asarray(train.doc_slice(d, 0, int(train.lengths[d]))) for d in range(train.num_documents)])
    first_reserved = min(i for t, i in tok.tokenizer.get_vocab().items() if t.startswith("<|reserved_"))
    assert ids.max() < first_reserved  # reserved entries are never produced
