"""Tests of yxanul_jax/data/prepare.py, the `prepare` command and yxanul_jax/data/sources.py: shards, manifest, split, reruns, bad input."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_fixtures import (GPT2, GSM8K, docs, need_shared, run_cli, tiny_tok, tiny_tok_path,  # noqa: F401
                           write_jsonl, write_parquet)
from yxanul_jax import prepare
from yxanul_jax.data import layout
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.prepare import prepare_documents, split_of
from yxanul_jax.data.sources import DocumentSource


def read_split(out, split):
    ds = open_dataset(out)
    idx = ds.split(split)
    return [tuple(int(t) for t in idx.doc_slice(d, 0, int(idx.lengths[d]))) for d in range(idx.num_documents)]


def assert_nothing_written(tmp_path, out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


def test_prepare_writes_shards_and_manifest_matching_the_tokenizer(tmp_path, docs, tiny_tok, tiny_tok_path):
    src = write_parquet(tmp_path / "in.parquet", {"text": docs, "n": list(range(len(docs)))})
    out = tmp_path / "out"
    rc, stdout, _ = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", out,
                                           "--val-fraction", "0.2", "--no-progress", "--workers", "2"])
    assert rc == 0 and "train" in stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["vocab_size"] == tiny_tok.vocab_size and m["eos_id"] == tiny_tok.eos_id and m["dtype"] == "uint16"
    assert m["tokenizer"]["sha256"] == tiny_tok.sha256
    train, val = m["splits"]["train"], m["splits"]["val"]
    assert train["documents"] + val["documents"] == m["documents"] == len(docs)
    assert train["characters"] + val["characters"] == sum(map(len, docs))
    assert train["chars_per_token"] == pytest.approx(train["characters"] / train["tokens"])
    assert 0.1 < val["documents"] / len(docs) < 0.3
    # shard contents are exactly the tokenizer's output, documents in input order per split
    expected = {"train": [], "val": []}
    for text, ids in zip(docs, tiny_tok.encode_batch(docs)):
        expected[split_of(text, 0.2)].append(tuple(int(t) for t in ids))
    assert read_split(out, "train") == expected["train"] and read_split(out, "val") == expected["val"]
    assert sum(len(d) for d in expected["train"]) == train["tokens"]
    assert open_dataset(out).tokenizer_path == str(out / "tokenizer.json")


def test_split_is_disjoint_and_stable_across_order_and_batching(tmp_path, docs, tiny_tok):
    a, b = tmp_path / "a", tmp_path / "b"
    prepare_documents([docs], tiny_tok, a, request={"r": 1}, val_fraction=0.25, progress=False)
    shuffled = list(reversed(docs))
    prepare_documents([shuffled[i:i + 7] for i in range(0, len(docs), 7)], tiny_tok, b,
                              request={"r": 2}, val_fraction=0.25, progress=False, shard_tokens=2000)
    assert len(json.loads((b / "manifest.json").read_text())["splits"]["train"]["shards"]) > 1
    val_a, val_b = set(read_split(a, "val")), set(read_split(b, "val"))
    train_a = set(read_split(a, "train"))
    assert val_a == val_b and train_a == set(read_split(b, "train"))
    assert val_a and not (val_a & train_a)


def test_the_written_files_are_named_by_the_layout(tmp_path, docs, tiny_tok):
    out = tmp_path / "out"
    assert not layout.is_prepared(out)
    prepare_documents([docs], tiny_tok, out, request={"r": 1}, val_fraction=0.25, progress=False, shard_tokens=2000)
    assert layout.is_prepared(out) and layout.manifest_path(out) == out / layout.MANIFEST
    m = json.loads(layout.manifest_path(out).read_text())
    assert m["tokenizer"]["file"] == layout.TOKENIZER and (out / layout.TOKENIZER).is_file()
    for split in layout.SPLITS:
        shards = m["splits"][split]["shards"]
        assert [(s["tokens"], s["offsets"]) for s in shards] == \
            [(layout.tokens_file(split, k), layout.offsets_file(split, k)) for k in range(len(shards))]
        assert sorted(p.name for p in (out / split).glob(layout.TOKENS_GLOB)) == \
            [os.path.basename(s["tokens"]) for s in shards]
    assert layout.tokens_file("train", 3) == "train/00003.tokens.npy"


def test_rerun_is_a_noop_and_a_different_request_is_refused(tmp_path, docs, tiny_tok_path):
    src = write_parquet(tmp_path / "in.parquet", {"text": docs[:60]})
    out = tmp_path / "out"
    args = ["--input", src, "--tokenizer", tiny_tok_path, "--output", out, "--no-progress"]
    assert run_cli(prepare.main, args)[0] == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    rc, _, err = run_cli(prepare.main, args)
    assert rc == 0 and "nothing to do" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    rc, _, err = run_cli(prepare.main, args + ["--val-fraction", "0.5"])
    assert rc == 2 and "different request" in err and err.count("\n") == 1
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # never mixed
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    rc, _, err = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", foreign])
    assert rc == 2 and "not a prepared dataset" in err and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_jsonl_gz_template_txt_paragraphs_directory_and_glob_inputs(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    with gzip.open(data / "sub" / "qa.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"question": "What is 2+2?", "answer": 4}) + "\n")
        fh.write(json.dumps({"question": "Name a prime.", "answer": None}) + "\n")
    (data / "notes.txt").write_text("First paragraph\nstill first.\n\n \nSecond one.\n", encoding="utf-8")
    source = DocumentSource([str(data / "sub" / "*.jsonl.gz")], text_template="Q: {question}\nA: {answer}")
    assert [d for b in source.batches() for d in b] == ["Q: What is 2+2?\nA: 4", "Q: Name a prime.\nA: "]
    source = DocumentSource([str(data)], text_template="{question}")  # a directory: both files, sorted
    assert source.files[0].name == "notes.txt"
    txt = DocumentSource([str(data / "notes.txt")])
    assert [d for b in txt.batches() for d in b] == ["First paragraph\nstill first.\n", "Second one.\n"]
    whole = DocumentSource([str(data / "notes.txt")], txt_docs="file")
    assert len([d for b in whole.batches() for d in b]) == 1
    parquet = write_parquet(tmp_path / "p.parquet", {"text": ["a", "", None, "  ", "b"]})
    src = DocumentSource([str(parquet)])
    assert [d for b in src.batches() for d in b] == ["a", "b"] and src.skipped_empty == 3


def test_gsm8k_has_no_text_column_but_a_template_works(tmp_path):
    need_shared(GSM8K)
    out = tmp_path / "gsm"
    rc, _, err = run_cli(prepare.main, ["--input", GSM8K, "--tokenizer", GPT2, "--output", out])
    assert rc == 2 and "no column 'text'" in err and "question, answer" in err and str(GSM8K) in err
    assert_nothing_written(tmp_path, out)
    rc, _, _ = run_cli(prepare.main, ["--input", GSM8K, "--tokenizer", GPT2, "--output", out, "--no-progress",
                                      "--text-template", r"{question}\n{answer}", "--val-fraction", "1"])
    m = json.loads((out / "manifest.json").read_text())
    assert rc == 0 and m["splits"]["val"]["documents"] == 1319 and m["eos_id"] == 50256
    first = open_dataset(out).split("val")
    from yxanul_jax.data.tokenizer import load_tokenizer
    text = load_tokenizer(GPT2).tokenizer.decode(np.asarray(first.doc_slice(0, 0, int(first.lengths[0]))).tolist())
    assert "\n" in text and "####" in text  # question, a real newline, then the answer


# ---- bad input: one line naming the file/column, exit 2, nothing written


def bad(tmp_path, tok_path, inputs, *extra):
    out = tmp_path / "out"
    argv = ["--input", *inputs, "--tokenizer", tok_path, "--output", out, "--no-progress", *extra]
    rc, _, err = run_cli(prepare.main, argv)
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert_nothing_written(tmp_path, out)
    return err


def test_missing_path(tmp_path, tiny_tok_path):
    assert "does not exist" in bad(tmp_path, tiny_tok_path, [tmp_path / "missing.parquet"])
    assert "matches no" in bad(tmp_path, tiny_tok_path, [str(tmp_path / "none-*.parquet")])


def test_empty_input(tmp_path, tiny_tok_path):
    (tmp_path / "empty_dir").mkdir()
    assert "holds no" in bad(tmp_path, tiny_tok_path, [tmp_path / "empty_dir"])
    blank = write_parquet(tmp_path / "blank.parquet", {"text": ["", "  ", None]})
    assert "no documents" in bad(tmp_path, tiny_tok_path, [blank])


def test_missing_column_and_template_column(tmp_path, tiny_tok_path):
    src = write_parquet(tmp_path / "qa.parquet", {"question": ["q?"], "answer": ["a."]})
    err = bad(tmp_path, tiny_tok_path, [src])
    assert "qa.parquet" in err and "'text'" in err and "--text-template" in err
    err = bad(tmp_path, tiny_tok_path, [src], "--text-template", "{question} {solution}")
    assert "qa.parquet" in err and "'solution'" in err and "question, answer" in err
    jl = write_jsonl(tmp_path / "rows.jsonl", [{"text": "ok"}, {"body": "no text here"}])
    err = bad(tmp_path, tiny_tok_path, [jl])
    assert "rows.jsonl' line 2" in err and "'text'" in err


def test_non_utf8_fails_by_default_and_is_counted_when_replaced(tmp_path, tiny_tok_path):
    good = tmp_path / "a_good.txt"
    good.write_text("fine text\n\nmore fine text\n", encoding="utf-8")
    broken = tmp_path / "b_broken.txt"
    broken.write_bytes(b"caf\xe9 au lait\n\nok \xff\xfe bytes\n")
    err = bad(tmp_path, tiny_tok_path, [good, broken])  # fails on the second file: nothing half-written
    assert "b_broken.txt' line 1" in err and "--bad-utf8 replace" in err
    out = tmp_path / "out"
    rc, _, err = run_cli(prepare.main, ["--input", good, broken, "--tokenizer", tiny_tok_path, "--output", out,
                                        "--no-progress", "--bad-utf8", "replace"])
    assert rc == 0 and "replaced 3 invalid UTF-8" in err  # \xe9, \xff, \xfe
    assert json.loads((out / "manifest.json").read_text())["replaced_utf8"] == 3
    bad_parquet = tmp_path / "p"
    bad_parquet.mkdir()
    invalid = pa.array([b"ok", b"caf\xe9"], type=pa.binary()).view(pa.string())  # a string column, bad bytes
    pq.write_table(pa.table({"text": invalid}), bad_parquet / "bad.parquet")
    err = bad(bad_parquet, tiny_tok_path, [bad_parquet / "bad.parquet"])
    assert "column 'text' of" in err and "bad.parquet' row 1" in err
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    jl = fresh / "bad.jsonl"
    jl.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert "bad.jsonl' line 2" in bad(fresh, tiny_tok_path, [jl])


def test_json_lines_count_each_bad_sequence_once_and_refuse_lone_surrogates(tmp_path, tiny_tok_path):
    first = tmp_path / "first.jsonl"  # a bad byte on line 1, the line the column check reads first
    first.write_bytes(b'{"text": "caf\xe9 au lait"}\n{"text": "more text"}\n')
    out = tmp_path / "out1"
    rc, _, err = run_cli(prepare.main, ["--input", first, "--tokenizer", tiny_tok_path, "--output", out,
                                        "--no-progress", "--bad-utf8", "replace"])
    assert rc == 0 and json.loads((out / "manifest.json").read_text())["replaced_utf8"] == 1, err
    # a JSON escape of half a UTF-16 pair is valid JSON and no character: refused like bad bytes, or replaced
    lone = tmp_path / "lone"
    lone.mkdir()
    jl = lone / "lone.jsonl"
    jl.write_text('{"text": "a pair \\ud83d\\ude00 is fine"}\n{"text": "half \\ud800 is not"}\n', encoding="ascii")
    err = bad(lone, tiny_tok_path, [jl])
    assert "lone.jsonl' line 2 holds a lone UTF-16 surrogate (\\ud800" in err and "--bad-utf8 replace" in err
    out = tmp_path / "out2"
    rc, _, err = run_cli(prepare.main, ["--input", jl, "--tokenizer", tiny_tok_path, "--output", out,
                                       "--no-progress", "--bad-utf8", "replace"])
    assert rc == 0 and json.loads((out / "manifest.json").read_text())["replaced_utf8"] == 1, err


def test_tokenizer_file_that_does_not_parse(tmp_path, docs):
    src = write_parquet(tmp_path / "in.parquet", {"text": docs[:5]})
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": [1, 2')
    assert "does not parse" in bad(tmp_path, broken, [src]) and "tokenizer.json" in bad(tmp_path, broken, [src])
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "vocab.json").write_text('{"a": 0, "b": 1, "ab": 2}')
    (vm / "merges.txt").write_text("#version: 0.2\na b c d\n")
    assert "do not parse" in bad(tmp_path, vm, [src])


def test_a_damaged_parquet_page_is_one_line_and_no_progress_bar_off_a_terminal(tmp_path, docs, tiny_tok_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": docs * 4}), src, row_group_size=len(docs))  # snappy pages
    data = bytearray(src.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 2000] = b"\xff" * 2000  # inside the pages, far from the footer
    src.write_bytes(bytes(data))
    assert "in.parquet' is damaged after row" in bad(tmp_path, tiny_tok_path, [src])
    out = tmp_path / "out"  # progress asked for, but stderr is no terminal: no bar, the error is the one line
    rc, _, err = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", out])
    assert rc == 2 and "tokenizing" not in err and err.count("\n") == 1 and err.startswith("error: input"), err


def test_temp_dirs_of_dead_runs_are_removed_and_live_ones_kept(tmp_path, docs, tiny_tok_path):
    src = write_parquet(tmp_path / "in.parquet", {"text": docs[:20]})
    dead = tmp_path / ".out.tmp-4194305-0badcafe"  # above Linux's largest pid: that process is gone
    live = tmp_path / f".out.tmp-{os.getppid()}-0badcafe"  # pytest's parent: alive (a racing writer)
    for d in (dead, live):
        (d / "train").mkdir(parents=True)
    rc, _, err = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", tmp_path / "out",
                                        "--no-progress"])
    assert rc == 0, err
    assert not dead.exists() and live.exists() and (tmp_path / "out" / "manifest.json").is_file()


def test_column_options_for_text_files_only_and_an_empty_output_are_refused(tmp_path, tiny_tok_path):
    """--text-column / --text-template name columns: on .txt inputs alone they would be silently ignored, so
    they are refused (next to a .jsonl they apply to it); an empty --output is not the working directory."""
    txt = tmp_path / "a.txt"
    txt.write_text("one paragraph\n\nanother one\n", encoding="utf-8")
    for flag, value in (("--text-column", "nope"), ("--text-template", "{nope}")):
        err = bad(tmp_path, tiny_tok_path, [txt], flag, value)
        assert f"{flag} applies to .jsonl / .parquet inputs only" in err and "a.txt" in err and f"drop {flag}" in err
    jl = write_jsonl(tmp_path / "b.jsonl", [{"body": "from a column"}])
    out = tmp_path / "mixed"
    rc, _, err = run_cli(prepare.main, ["--input", txt, jl, "--tokenizer", tiny_tok_path, "--output", out,
                                        "--no-progress", "--text-column", "body", "--val-fraction", "0"])
    assert rc == 0 and json.loads((out / "manifest.json").read_text())["documents"] == 3, err
    rc, _, err = run_cli(prepare.main, ["--input", txt, "--tokenizer", tiny_tok_path, "--output", ""])
    assert rc == 2 and err == "error: --output is empty (an unset shell variable?); give it a value\n", err
    (tmp_path / "afile").write_text("x")  # a file where the output's folder would be: named before tokenizing
    inside = tmp_path / "afile" / "x"
    rc, _, err = run_cli(prepare.main, ["--input", txt, "--tokenizer", tiny_tok_path, "--output", inside])
    assert rc == 2 and err == f"error: --output '{inside}': '{tmp_path / 'afile'}' is a file; choose another --output\n"


def test_an_output_the_system_refuses_is_one_line_naming_it_not_a_temp_path(tmp_path, tiny_tok_path):
    txt = tmp_path / "a.txt"
    txt.write_text("one paragraph\n", encoding="utf-8")
    rc, _, err = run_cli(prepare.main, ["--input", txt, "--tokenizer", tiny_tok_path, "--output", "/proc/yxanul-x"])
    assert rc == 2 and "'/proc/yxanul-x'" in err and err.count("\n") == 1, err  # as root: /proc refuses new files
    assert ".tmp-" not in err and not [p for p in os.listdir("/proc") if p.startswith(".yxanul-x")]


def test_a_bad_template_says_how_to_write_columns_and_braces():
    from yxanul_jax.core.errors import UserError
    from yxanul_jax.data.sources import template_fields

    with pytest.raises(UserError) as e:
        template_fields("{question")
    assert str(e.value).endswith("write columns as {name} and literal braces as {{ }}"), e.value
