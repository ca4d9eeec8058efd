"""Tests of yxanul_jax/data/tokenizer.py and the `tokenizer` command: SuperBPE / GPT-2 loading and stats, capped BPE training, CLI."""
from __future__ import annotations

import json
import shutil

import pytest

from data_fixtures import (C4, GPT2, SUPERBPE, docs, need_shared, run_cli, tiny_tok,  # noqa: F401
                           tiny_tok_path, write_jsonl, write_parquet)
from yxanul_jax import tokenizer as tokenizer_cmd
from yxanul_jax.core.errors import UserError
from yxanul_jax.data import tokenizer as tk

SAMPLE = ("The rest of the world was watching as the committee, in a vote of 7 to 2, approved 1,250,000 "
          "dollars for the new park... Residents said: \"It's about time!\"\n\nMore at http://example.com/a/b.")


@pytest.fixture(scope="module")
def superbpe():
    return tk.load_tokenizer(need_shared(SUPERBPE))


def test_superbpe_loads_from_its_directory_with_special_tokens(superbpe):
    assert superbpe.superbpe
    assert superbpe.vocab_size == 200_005 and superbpe.eos_id == 200_004 and superbpe.eos_token == "<|endoftext|>"
    assert superbpe.tokenizer.token_to_id("<|padding|>") == 200_001
    ids = superbpe.encode_batch([SAMPLE])[0]
    pieces = [superbpe.tokenizer.id_to_token(int(i)) for i in ids]
    assert any(tk._SUPERWORD.search(p) for p in pieces)  # superwords are actually used
    assert superbpe.tokenizer.decode(ids.tolist()) == SAMPLE  # lossless
    assert superbpe.tokenizer.encode("a<|endoftext|>b").ids.count(200_004) == 1


def test_superbpe_pre_tokenizer_is_forcible_both_ways(superbpe):
    gpt2_forced = tk.load_tokenizer(GPT2, superbpe=True)
    gpt2 = tk.load_tokenizer(GPT2)
    assert gpt2_forced.superbpe and not gpt2.superbpe and gpt2.eos_id == 50256 and gpt2.vocab_size == 50257
    plain = tk.load_tokenizer(SUPERBPE, superbpe=False)
    assert not plain.superbpe
    assert len(plain.encode_batch([SAMPLE])[0]) > len(superbpe.encode_batch([SAMPLE])[0])
    assert tk.superword_fraction(json.loads((GPT2 / "vocab.json").read_text())) < tk.SUPERWORD_MIN_FRACTION


def test_saved_tokenizer_json_round_trips_superbpe(superbpe, tmp_path):
    path = tmp_path / "tokenizer.json"
    superbpe.save(path)
    again = tk.load_tokenizer(path)
    assert again.superbpe and again.eos_id == 200_004 and again.vocab_size == 200_005
    assert again.sha256 == superbpe.sha256
    assert (again.encode_batch([SAMPLE])[0] == superbpe.encode_batch([SAMPLE])[0]).all()


def _stats(tokenizer_path, *inputs):
    rc, out, err = run_cli(tokenizer_cmd.main, ["stats", "--tokenizer", tokenizer_path, "--input", *inputs, "--json"])
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_stats_on_c4_superbpe_about_6_8_gpt2_about_4_5_chars_per_token():
    need_shared(C4)
    sb, g2 = _stats(SUPERBPE, C4), _stats(GPT2, C4)
    assert sb["documents"] == g2["documents"] == 2000 and sb["characters"] == g2["characters"]
    assert sb["superbpe"] and sb["chars_per_token"] == pytest.approx(6.8, abs=0.15)
    assert g2["chars_per_token"] == pytest.approx(4.5, abs=0.1)
    assert sb["chars_per_token"] == pytest.approx(sb["characters"] / sb["tokens"])


def test_train_caps_the_vocabulary_and_covers_every_byte(docs):
    words = {w for d in docs for w in d.split()}
    tok = tk.train_bpe([docs], 300)
    assert 258 <= tok.vocab_size <= 300 < len(words)  # capped, never one entry per unique word
    assert tok.tokenizer.token_to_id("<|endoftext|>") == tok.eos_id
    text = "naïve café 日本語 🙂 — unseen bytes"
    assert tok.tokenizer.decode(tok.encode_batch([text])[0].tolist()) == text
    with pytest.raises(UserError, match="too small"):
        tk.train_bpe([docs], 200)


def test_train_cli_writes_tokenizer_json_and_refuses_an_existing_output(tmp_path, docs):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"body": d} for d in docs[:200]])
    out = tmp_path / "tok"
    rc, stdout, err = run_cli(tokenizer_cmd.main, ["train", "--input", src, "--text-column", "body",
                                        "--vocab-size", "320", "--output", out])
    assert rc == 0, err
    assert "(cap 320)" in stdout
    loaded = tk.load_tokenizer(out)
    assert loaded.vocab_size <= 320 and loaded.eos_token == "<|endoftext|>"
    before = (out / "tokenizer.json").read_bytes()
    rc, _, err = run_cli(tokenizer_cmd.main, ["train", "--input", src, "--text-column", "body", "--vocab-size", "400",
                                   "--output", out])
    assert rc == 2 and "already exists" in err and (out / "tokenizer.json").read_bytes() == before


def test_stats_cli_counts_documents_of_mixed_inputs(tmp_path, tiny_tok_path):
    pq_in = write_parquet(tmp_path / "a.parquet", {"text": ["one doc", "two doc", ""]})
    txt = tmp_path / "b.txt"
    txt.write_text("para one\n\npara two\n\npara three\n", encoding="utf-8")
    result = _stats(tiny_tok_path, pq_in, txt)
    assert result["documents"] == 5 and result["skipped_empty"] == 1
    assert result["characters"] == sum(map(len, ["one doc", "two doc", "para one\n", "para two\n", "para three\n"]))


def test_bad_tokenizers_and_inputs_are_one_line_errors(tmp_path, tiny_tok_path):
    src = write_parquet(tmp_path / "a.parquet", {"body": ["x"]})
    for path, needle in [(tmp_path / "missing.json", "does not exist"), (tmp_path, "neither tokenizer.json")]:
        rc, _, err = run_cli(tokenizer_cmd.main, ["stats", "--tokenizer", path, "--input", src, "--text-column", "body"])
        assert rc == 2 and needle in err and err.count("\n") == 1
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json")
    rc, _, err = run_cli(tokenizer_cmd.main, ["stats", "--tokenizer", garbage, "--input", src, "--text-column", "body"])
    assert rc == 2 and "garbage.json' does not parse" in err
    rc, _, err = run_cli(tokenizer_cmd.main, ["stats", "--tokenizer", tiny_tok_path, "--input", src])
    assert rc == 2 and "a.parquet' has no column 'text'" in err
    out = tmp_path / "newtok"
    rc, _, err = run_cli(tokenizer_cmd.main, ["train", "--input", tmp_path / "nope.txt", "--vocab-size", "300", "--output", out])
    assert rc == 2 and "does not exist" in err and not out.exists()
    text = tmp_path / "t.txt"
    text.write_text("some text\n\nmore text\n")
    for extra, needle in ((["--min-frequency", "-3"], "--min-frequency -3 must be >= 1"),
                          (["--vocab-size", "100"], "too small"),
                          (["--output", text / "under-a-file"], "is a file; choose another --output")):
        argv = ["train", "--input", text, "--vocab-size", "300", "--output", out, *extra]
        rc, _, err = run_cli(tokenizer_cmd.main, argv)
        assert rc == 2 and needle in err and err.count("\n") == 1 and not out.exists(), err


def test_added_tokens_must_continue_the_vocabulary(tmp_path):
    folder = tmp_path / "sb"
    shutil.copytree(need_shared(GPT2), folder)
    (folder / "added_tokens.json").write_text(json.dumps({"<|pad|>": 60000}))
    with pytest.raises(UserError, match="without gaps"):
        tk.load_tokenizer(folder)


def test_side_files_that_are_not_json_objects_are_one_line_errors(tmp_path):
    for name in ("added_tokens.json", "special_tokens_map.json", "tokenizer_config.json"):
        folder = tmp_path / name
        shutil.copytree(need_shared(GPT2), folder)
        (folder / name).write_text(json.dumps(["<|endoftext|>"]))
        with pytest.raises(UserError, match=f"{name}' holds a JSON list, not an object; fix or delete {name}"):
            tk.load_tokenizer(folder)
