"""Shared fixtures of the data tests: real text (stdlib sources), a tiny trained BPE, prepared datasets.

Import the fixtures a test module uses (`from data_fixtures import tiny_tok, ...`). Nothing here
is mocked: the tokenizer is a real trained BPE, the inputs real parquet / jsonl / txt files.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from yxanul_jax.data.corpus import stdlib_files
from yxanul_jax.data.prepare import prepare_documents
from yxanul_jax.data.tokenizer import train_bpe

SHARED = Path(__file__).resolve().parents[2] / "shared"
C4 = SHARED / "data" / "validation" / "c4_validation_2k.parquet"
GSM8K = SHARED / "data" / "validation" / "gsm8k_validation.parquet"
SUPERBPE = SHARED / "tokenizers" / "superbpe-t80k"
GPT2 = SHARED / "tokenizers" / "gpt2"


def need_shared(path: Path = SHARED) -> Path:
    """Skip the calling test when the read-only shared data beside the checkout is absent."""
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (expected ../shared beside the checkout)")
    return path


def real_documents(n_files: int = 24) -> list[str]:
    """Documents of very different lengths cut from stdlib sources: many paragraphs, a few whole files."""
    files = stdlib_files(600_000)[:n_files]
    docs: list[str] = []
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        if i % 6 == 0:
            docs.append(text[:6000])  # long: spans several rows
        else:
            docs.extend(p for p in text.split("\n\n")[:25] if p.strip())
    return docs


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def run_cli(main, argv: list[str]) -> tuple[int, str, str]:
    """Run a `main(argv) -> int` entry point; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="session")
def docs() -> list[str]:
    return real_documents()


@pytest.fixture(scope="session")
def tiny_tok(docs):
    """A real byte-level BPE with a 384-entry vocabulary (EOS id 0), trained on `docs`."""
    return train_bpe([docs], 384)


@pytest.fixture(scope="session")
def tiny_tok_path(tmp_path_factory, tiny_tok) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tiny_tok.save(path)
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, docs, tiny_tok) -> Path:
    """A prepared dataset of `docs` with a 20 % validation split."""
    out = tmp_path_factory.mktemp("prepared") / "ds"
    prepare_documents([docs[i:i + 50] for i in range(0, len(docs), 50)], tiny_tok, out,
                      request={"fixture": "docs"}, val_fraction=0.2, progress=False)
    return out
