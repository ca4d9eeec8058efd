"""The end-of-text token a tokenizer's copies keep: a tokenizer.json alone does not say which special token ends a
document, so every copy (a prepared dataset's, a run directory's) has a special_tokens_map.json naming it, and a
dataset's manifest EOS wins over a guess (yxanul_jax/data/tokenizer.py, dataset.py, core/rundir.py)."""
from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken

from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import TOKENIZER_EOS_FILE, prepare_run_dir
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.prepare import prepare_documents
from yxanul_jax.data.tokenizer import SPECIAL_TOKENS_MAP, load_tokenizer, train_bpe
from yxanul_jax.inference.trained import run_tokenizer
from yxanul_jax.training.evaluate import resolve_domains

from data_fixtures import docs, write_parquet  # noqa: F401  (fixtures)


def _second_candidate_eos(docs, folder):
    """A BPE holding both <|endoftext|> (the first guess) and </s>, whose special_tokens_map.json names </s>."""
    tok = train_bpe([docs[:200]], 400)
    tok.tokenizer.add_special_tokens([AddedToken("</s>", special=True, normalized=False)])
    folder.mkdir()
    tok.tokenizer.save(str(folder / "tokenizer.json"))
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps({"eos_token": "</s>"}))
    return load_tokenizer(folder)


def test_every_copy_keeps_the_eos_its_source_named(docs, tmp_path):
    assert SPECIAL_TOKENS_MAP == TOKENIZER_EOS_FILE
    tok = _second_candidate_eos(docs, tmp_path / "tok")
    eos = tok.tokenizer.token_to_id("</s>")
    assert tok.eos_token == "</s>" and tok.eos_id == eos != tok.tokenizer.token_to_id("<|endoftext|>")

    data = tmp_path / "data"
    prepare_documents([docs[:200]], tok, data, request={"t": 1}, val_fraction=0.2, progress=False)
    ds = open_dataset(data)
    assert ds.eos_id == eos and ds.eos_token == "</s>"
    assert load_tokenizer(ds.tokenizer_path).eos_id == eos  # the copy's special_tokens_map.json names it
    assert ds.tokenizer().eos_id == eos

    # a dataset prepared before the copy had one: a bare copy guesses the first candidate, the manifest corrects it
    (data / SPECIAL_TOKENS_MAP).unlink()
    assert load_tokenizer(ds.tokenizer_path).eos_token == "<|endoftext|>"
    assert ds.tokenizer().eos_id == eos
    # a raw-text eval domain is tokenized with the training data's EOS, not the guess
    raw = write_parquet(tmp_path / "web.parquet", {"text": docs[200:230]})
    (web,) = resolve_domains({"web": str(raw)}, ds, in_domain={})
    assert web.dataset.eos_id == eos

    # the run directory's copy names it too, and what sampling and export load from there reads it
    cfg = load_config(None, ["model.d_model=64", f"data.train={data}", f"model.vocab_size={ds.vocab_size}"])
    run = tmp_path / "run"
    prepare_run_dir(str(run), cfg, tokenizer=ds.tokenizer_path, tokenizer_eos=ds.eos_token)
    assert json.loads((run / TOKENIZER_EOS_FILE).read_text()) == {"eos_token": "</s>"}
    assert run_tokenizer(cfg, str(run)).eos_id == eos
    assert run_tokenizer(cfg).eos_id == eos  # no run directory: the dataset's copy with the manifest's EOS
    (run / TOKENIZER_EOS_FILE).unlink()  # a run directory from before its copy named the EOS: the manifest's
    assert run_tokenizer(cfg, str(run)).eos_id == eos

    # one tokenizer taken with another EOS (a copy without its map, before this was written): not mixed with it
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tmp_path / "tok" / "tokenizer.json").read_bytes())
    guessed = load_tokenizer(bare)
    assert guessed.eos_token == "<|endoftext|>" and guessed.sha256 == tok.sha256
    prepare_documents([docs[200:260]], guessed, tmp_path / "guessed", request={"t": 2}, val_fraction=0.5,
                      progress=False)
    with pytest.raises(UserError, match=rf"eval domain 'web' .* ends its documents with token {guessed.eos_id} "
                                        rf"\('<\|endoftext\|>'\), the training data .* with {eos} \('</s>'\), by one "
                                        "tokenizer; prepare it"):
        resolve_domains({"web": str(tmp_path / "guessed")}, ds, in_domain={})


def test_prompts_and_the_export_encode_as_the_training_data_did(docs):
    """A tokenizer.json whose post-processor adds a token (a BOS, Llama-3's way): training data is encoded without it,
    so prompts are too (`LoadedTokenizer.encode`) and the HF export's tokenizer.json drops it (`as_trained`)."""
    from tokenizers import Tokenizer, processors

    from yxanul_jax.inference.hf_export import as_trained

    tok = train_bpe([docs[:200]], 400)
    text = "def main():\n    return 1\n"
    plain = tok.encode(text)
    bos = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.eos_id)])
    for post in (bos, processors.Sequence([processors.ByteLevel(trim_offsets=False), bos])):
        tok.tokenizer.post_processor = post
        assert tok.tokenizer.encode(text).ids == [tok.eos_id, *plain]  # what a plain encode would feed the model
        assert tok.encode(text) == plain == tok.encode_batch([text])[0].tolist()
        exported = Tokenizer.from_str(as_trained(tok.tokenizer.to_str()))
        assert exported.encode(text).ids == plain
    tok.tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)  # adds nothing: left as it is
    assert as_trained(tok.tokenizer.to_str()) == tok.tokenizer.to_str()
