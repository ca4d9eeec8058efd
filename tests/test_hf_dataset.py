"""`prepare --hf-dataset`: a Hugging Face `datasets` dataset (save_to_disk folder, data file, cached name) prepared
exactly as the same texts from parquet, and every mistake one `error:` line (yxanul_jax/data/hf_source.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from yxanul_jax.prepare import main

from data_fixtures import docs, run_cli, tiny_tok, tiny_tok_path, write_parquet  # noqa: F401  (fixtures)

datasets = pytest.importorskip("datasets")  # the `hf` extra (in `dev`)


def prepare(*args) -> tuple[int, str, str]:
    return run_cli(main, [*args, "--no-progress"])


def token_content(out) -> dict:
    """What a prepared dataset holds, without where it came from: the manifest's splits and every shard's bytes."""
    manifest = json.loads((out / "manifest.json").read_text())
    shards = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.npy"))}
    return {"splits": manifest["splits"], "vocab": manifest["vocab_size"], "tokenizer": manifest["tokenizer"]["sha256"],
            "shards": shards}


def one_error(rc: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_saved_dataset_and_a_data_file_give_the_shards_of_the_same_parquet(tmp_path, docs, tiny_tok_path):
    texts = docs[:120]
    write_parquet(tmp_path / "docs.parquet", {"text": texts})
    datasets.Dataset.from_dict({"text": texts, "id": list(range(len(texts)))}).save_to_disk(str(tmp_path / "saved"))
    rc, _, err = prepare("--input", tmp_path / "docs.parquet", "--tokenizer", tiny_tok_path, "--output", tmp_path / "p")
    assert rc == 0, err
    want = token_content(tmp_path / "p")
    assert want["splits"]["train"]["documents"] + want["splits"]["val"]["documents"] == len(texts)
    for ref, out in ((tmp_path / "saved", "s"), (tmp_path / "docs.parquet", "f")):
        rc, _, err = prepare("--hf-dataset", ref, "--tokenizer", tiny_tok_path, "--output", tmp_path / out)
        assert rc == 0, err
        assert token_content(tmp_path / out) == want  # byte-identical shards, same counts
    # a rerun of the same request is a no-op; the request names the dataset
    rc, _, err = prepare("--hf-dataset", tmp_path / "saved", "--tokenizer", tiny_tok_path, "--output", tmp_path / "s")
    assert rc == 0 and "nothing to do" in err
    request = json.loads((tmp_path / "s" / "manifest.json").read_text())["request"]
    assert request["inputs"][0]["hf_dataset"] == str((tmp_path / "saved").resolve())


def test_splits_columns_and_templates_of_a_dataset_dict(tmp_path, docs, tiny_tok_path):
    qa = {"question": docs[:40], "answer": docs[40:80]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(qa),
                          "test": datasets.Dataset.from_dict({k: v[:10] for k, v in qa.items()})}
                         ).save_to_disk(str(tmp_path / "dd"))
    base = ["--hf-dataset", tmp_path / "dd", "--tokenizer", tiny_tok_path]
    line = one_error(*prepare(*base, "--output", tmp_path / "x")[:3:2])  # default column 'text' is missing
    assert "no column 'text'" in line and "(columns: question, answer)" in line and "--text-template" in line
    assert not (tmp_path / "x").exists()
    line = one_error(*prepare(*base, "--split", "validation", "--text-column", "question", "--output",
                              tmp_path / "x")[:3:2])
    assert "no split 'validation'" in line and "(splits: train, test)" in line
    rc, _, err = prepare(*base, "--split", "test", "--text-template", r"{question}\n{answer}", "--output", tmp_path / "t")
    assert rc == 0, err
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["documents"] == 10 and manifest["request"]["text"]["split"] == "test"
    # the same texts written as parquet give the same tokens
    write_parquet(tmp_path / "qa.parquet", {k: v[:10] for k, v in qa.items()})
    rc, _, err = prepare("--input", tmp_path / "qa.parquet", "--text-template", r"{question}\n{answer}",
                         "--tokenizer", tiny_tok_path, "--output", tmp_path / "tp")
    assert rc == 0, err
    assert token_content(tmp_path / "t") == token_content(tmp_path / "tp")


def test_command_line_mistakes_are_one_line(tmp_path, tiny_tok_path):
    write_parquet(tmp_path / "a.parquet", {"text": ["some text"] * 3})
    out = ["--tokenizer", tiny_tok_path, "--output", tmp_path / "o"]
    assert "one of them" in one_error(*prepare(*out)[:3:2])
    assert "one of them" in one_error(*prepare("--input", tmp_path / "a.parquet", "--hf-dataset", tmp_path, *out)[:3:2])
    assert "--split" in one_error(*prepare("--input", tmp_path / "a.parquet", "--split", "train", *out)[:3:2])
    for missing in (tmp_path / "missing", "./missing", "some/where/else", "corpus.parquet", "data/train.jsonl"):
        line = one_error(*prepare("--hf-dataset", missing, *out)[:3:2])
        assert f"--hf-dataset '{missing}' does not exist" in line and "save_to_disk folder" in line
    assert not (tmp_path / "o").exists()


def test_without_datasets_installed_the_error_names_the_extra(tmp_path, tiny_tok_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # what `import datasets` meets without the package
    line = one_error(*prepare("--hf-dataset", tmp_path, "--tokenizer", tiny_tok_path, "--output", tmp_path / "o")[:3:2])
    assert "yxanul-jax[hf]" in line


_CACHE_A_NAME = """
import sys
from datasets.data_files import DataFilesDict
from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

files = DataFilesDict.from_patterns({"train": [sys.argv[1]]})

class Cached(Parquet):  # what a download of a parquet dataset named 'yxanul-demo' leaves in the cache
    BUILDER_CONFIGS = [ParquetConfig(name="default", data_files=files)]

Cached(dataset_name="yxanul-demo", config_name="default", hash="0123456789abcdef").download_and_prepare()
"""


@pytest.mark.slow
def test_a_name_is_read_from_the_local_cache_offline(tmp_path, docs, tiny_tok_path):
    # Subprocesses: `datasets` reads HF_HOME and the offline switches when it is imported.
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    texts = docs[:60]
    write_parquet(tmp_path / "docs.parquet", {"text": texts})
    subprocess.run([sys.executable, "-c", _CACHE_A_NAME, str(tmp_path / "docs.parquet")], env=env, check=True,
                   capture_output=True, timeout=300)
    (tmp_path / "docs.parquet").rename(tmp_path / "gone.parquet")  # only the cache holds the texts now

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "yxanul_jax.prepare", *map(str, args), "--no-progress",
                               "--tokenizer", str(tiny_tok_path)], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)

    proc = cli("--hf-dataset", "yxanul-demo", "--output", tmp_path / "named")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, _, err = prepare("--input", tmp_path / "gone.parquet", "--tokenizer", tiny_tok_path, "--output", tmp_path / "p")
    assert rc == 0, err
    assert token_content(tmp_path / "named") == token_content(tmp_path / "p")
    proc = cli("--hf-dataset", "yxanul-demo", "--split", "test", "--output", tmp_path / "x")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "(splits: train)" in lines[0], proc.stderr[-2000:]
    proc = cli("--hf-dataset", "nobody/nothing", "--output", tmp_path / "x")
    assert proc.returncode == 2 and "local Hugging Face cache" in proc.stderr
    assert not (tmp_path / "x").exists() and np.load(tmp_path / "named" / "train" / "00000.tokens.npy").size > 0
