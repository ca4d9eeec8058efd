"""Tokenizers: load (tokenizer.json, or vocab.json + merges.txt with SuperBPE detection), train a
capped byte-level BPE, and measure characters per token (the `tokenizer` command is
`yxanul_jax/tokenizer.py`).

SuperBPE (github.com/PythonNut/superbpe) tokenizers ship as vocab.json + merges.txt whose later
merges join words across spaces ("ĠofĠthe"). They only work with the pre-tokenizer they were
trained with: split off digit groups, runs of 2+ punctuation and runs of spaces, then byte-level
mapping without GPT-2's word regex. `load_tokenizer` picks it when more than 1 % of the vocabulary
holds such superwords (GPT-2 holds 3 of 50,257), or when forced with `superbpe=True`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from yxanul_jax.core.errors import UserError, one_line, writing
from yxanul_jax.core.rundir import TOKENIZER_EOS_FILE, eos_map
from yxanul_jax.data.sources import DocumentSource

# The stage-2 pre-tokenizer regex of SuperBPE (scripts/extend_tokenizer.sh in PythonNut/superbpe).
SUPERBPE_REGEX = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)"
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")
SPECIAL_TOKENS_MAP = TOKENIZER_EOS_FILE  # without it, EOS_CANDIDATES is a guess
SUPERWORD_MIN_FRACTION = 0.01
_SUPERWORD = re.compile("[^Ġ]Ġ")  # a space marker after some other character: a multi-word token


def superbpe_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """SuperBPE's pre-tokenizer: isolate digit groups, punctuation runs, space runs; bytes to symbols."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SUPERBPE_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def superword_fraction(vocab: dict[str, int]) -> float:
    """Fraction of vocabulary entries that span a word boundary (e.g. 'ĠofĠthe')."""
    return sum(1 for t in vocab if _SUPERWORD.search(t)) / max(len(vocab), 1)


@dataclass
class LoadedTokenizer:
    """A `tokenizers.Tokenizer` plus what the data pipeline needs to know about it."""

    tokenizer: Tokenizer
    source: str
    eos_id: int
    eos_token: str
    superbpe: bool
    _sha: str | None = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        """Rows an embedding table needs: the largest id + 1, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def sha256(self) -> str:
        """Hash of the serialized tokenizer (model, pre-tokenizer, added tokens): its identity."""
        if self._sha is None:
            self._sha = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()
        return self._sha

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (uint32[n_i]), encoded in parallel by the Rust library."""
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encode(texts, add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        """Token ids of one text as the training data holds them: no special tokens added (a tokenizer.json whose
        post-processor adds a BOS would put a token the model never saw there in front of every prompt)."""
        return list(map(int, self.tokenizer.encode(text, add_special_tokens=False).ids))

    def describe(self) -> dict:
        return {"source": self.source, "sha256": self.sha256, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "eos_token": self.eos_token, "superbpe": self.superbpe}

    def save(self, path: str | os.PathLike, with_eos: bool = False) -> None:
        """Write tokenizer.json to `path` (with_eos: and SPECIAL_TOKENS_MAP naming its EOS beside it); a
        full or read-only disk is one UserError line naming it."""
        with writing(path):  # the Rust library raises a bare Exception "... (os error 28)"
            self.tokenizer.save(str(path))
        if with_eos:
            side = Path(path).parent / SPECIAL_TOKENS_MAP
            with writing(side):
                side.write_bytes(eos_map(self.eos_token))


def _read_json(path: Path, what: str) -> dict:
    """A tokenizer side file's JSON object; UserError naming `what` to do when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"tokenizer file '{path}' does not parse as JSON ({e}); {what}")
    if not isinstance(data, dict):
        raise UserError(f"tokenizer file '{path}' holds a JSON {type(data).__name__}, not an object; {what}")
    return data


def _special_names(folder: Path) -> tuple[set[str], str | None]:
    """Special-token contents and the EOS content from special_tokens_map.json / tokenizer_config.json."""
    specials: set[str] = set()
    eos = None
    stm = folder / SPECIAL_TOKENS_MAP
    if stm.is_file():
        for key, value in _read_json(stm, f"fix or delete {SPECIAL_TOKENS_MAP}").items():
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str):
                specials.add(content)
                if key == "eos_token":
                    eos = content
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        data = _read_json(cfg, "fix or delete tokenizer_config.json")
        for item in (data.get("added_tokens_decoder") or {}).values():
            if isinstance(item, dict) and item.get("special") and isinstance(item.get("content"), str):
                specials.add(item["content"])
        if eos is None and isinstance(data.get("eos_token"), str):
            eos = data["eos_token"]
    return specials, eos


def _find_eos(tok: Tokenizer, hint: str | None, where: str) -> tuple[int, str]:
    for name in ([hint] if hint else []) + list(EOS_CANDIDATES):
        i = tok.token_to_id(name)
        if i is not None:
            return i, name
    raise UserError(f"tokenizer '{where}' has no end-of-text token (looked for {', '.join(EOS_CANDIDATES)}); "
                    "add one as a special token (e.g. train with `yxanul tokenizer train`)")


def _load_vocab_merges(folder: Path, superbpe: bool | None) -> LoadedTokenizer:
    vocab_path, merges_path = folder / "vocab.json", folder / "merges.txt"
    vocab = _read_json(vocab_path, "pass a GPT-2 style vocab.json (token -> id)")
    try:
        tok = Tokenizer(BPE.from_file(str(vocab_path), str(merges_path)))
    except Exception as e:  # the Rust library raises plain Exception for malformed files
        raise UserError(f"tokenizer files '{vocab_path}' + '{merges_path}' do not parse ({one_line(e)}); "
                        "pass a valid vocab.json and merges.txt")
    use_superbpe = superword_fraction(vocab) > SUPERWORD_MIN_FRACTION if superbpe is None else superbpe
    tok.pre_tokenizer = superbpe_pre_tokenizer() if use_superbpe else pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials, eos_hint = _special_names(folder)
    added_path = folder / "added_tokens.json"
    added = _read_json(added_path, "fix or delete added_tokens.json") if added_path.is_file() else {}
    if not all(isinstance(i, int) for i in added.values()):
        raise UserError(f"tokenizer file '{added_path}' maps a token to a non-integer id; fix or delete "
                        "added_tokens.json")
    for content, want in sorted(added.items(), key=lambda kv: kv[1]):
        if tok.token_to_id(content) is not None:
            continue
        special = content in specials
        token = AddedToken(content, special=special, normalized=not special)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
        if tok.token_to_id(content) != want:
            raise UserError(f"'{added_path}' gives '{content}' id {want} but it lands at {tok.token_to_id(content)}; "
                            "added ids must continue the vocabulary without gaps")
    for content in sorted(specials):  # e.g. GPT-2's <|endoftext|>: in vocab.json, make it match as a whole
        if tok.token_to_id(content) is not None:
            tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    eos_id, eos = _find_eos(tok, eos_hint, str(folder))
    return LoadedTokenizer(tok, str(folder), eos_id, eos, use_superbpe)


def load_tokenizer(path: str | os.PathLike, *, superbpe: bool | None = None,
                   eos_id: int | None = None) -> LoadedTokenizer:
    """Load a tokenizer.json file, or a directory with tokenizer.json or vocab.json + merges.txt.

    superbpe: None picks the SuperBPE pre-tokenizer for vocab.json + merges.txt when the vocabulary
    holds superwords (a tokenizer.json keeps its own pre-tokenizer); True / False force it on / off.
    eos_id: the end-of-text id when the caller knows it (a prepared dataset's manifest); otherwise the
    SPECIAL_TOKENS_MAP / tokenizer_config.json beside the file names it, else the first of EOS_CANDIDATES.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"tokenizer '{path}' does not exist; pass a tokenizer.json or a directory "
                        "with vocab.json + merges.txt")
    if p.is_file() and p.name == "vocab.json" and (p.parent / "merges.txt").is_file():
        p = p.parent
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            p = p / "tokenizer.json"
        elif (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            return _load_vocab_merges(p, superbpe)
        else:
            raise UserError(f"tokenizer directory '{path}' has neither tokenizer.json nor vocab.json + merges.txt")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise UserError(f"tokenizer file '{p}' does not parse ({one_line(e)}); pass a valid tokenizer.json")
    if superbpe is True:
        tok.pre_tokenizer = superbpe_pre_tokenizer()
    elif superbpe is False and _is_superbpe(tok):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if eos_id is not None and tok.id_to_token(eos_id) is not None:
        return LoadedTokenizer(tok, str(p), eos_id, tok.id_to_token(eos_id), _is_superbpe(tok))
    _, eos_hint = _special_names(p.parent)
    eos_id, eos = _find_eos(tok, eos_hint, str(p))
    return LoadedTokenizer(tok, str(p), eos_id, eos, _is_superbpe(tok))


def _is_superbpe(tok: Tokenizer) -> bool:
    pre = tok.pre_tokenizer
    return pre is not None and json.dumps(SUPERBPE_REGEX)[1:-1] in pre.__getstate__().decode()


# --------------------------------------------------------------------------------------------
# Training and measuring


MIN_BPE_VOCAB = 258
"""The smallest byte-level BPE: 256 bytes + the end-of-text token + one merge."""
BPE_VOCAB_WHY = "too small otherwise: a byte-level BPE needs 256 bytes + the end-of-text token + one merge"
MAX_BPE_VOCAB = 2**21
"""The largest BPE trained here (2,097,152 entries; the largest vocabularies in use hold 256k-1M): the trainer
reserves memory per entry up front, and at 10^10 it aborted the process (a Rust out-of-memory abort, exit 134)."""


def check_bpe_args(vocab_size: int, min_frequency: int, flag: str = "--vocab-size") -> None:
    """UserError unless a byte-level BPE can be trained with these settings; `flag` names the vocabulary size as
    the user gave it (`model.vocab_size` for the demo corpus's BPE)."""
    if not MIN_BPE_VOCAB <= vocab_size <= MAX_BPE_VOCAB:
        raise UserError(f"{flag} {vocab_size} must be in [{MIN_BPE_VOCAB}, {MAX_BPE_VOCAB:,}] for a byte-level BPE "
                        f"({BPE_VOCAB_WHY if vocab_size < MIN_BPE_VOCAB else 'the trainer reserves memory per entry'})")
    if min_frequency < 1:
        raise UserError(f"--min-frequency {min_frequency} must be >= 1 (the least count of a pair worth a merge)")


def train_bpe(batches: Iterable[list[str]], vocab_size: int, *, eos_token: str = "<|endoftext|>",
              min_frequency: int = 2, show_progress: bool = False) -> LoadedTokenizer:
    """Train a byte-level BPE whose vocabulary (256 bytes + EOS + merges) has at most `vocab_size` entries.

    The cap is what keeps the embedding table small: the trainer stops at `vocab_size` (or earlier
    when no pair occurs `min_frequency` times), it never keeps one entry per unique word.
    """
    check_bpe_args(vocab_size, min_frequency)
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
                         special_tokens=[AddedToken(eos_token, special=True, normalized=False)],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((text for batch in batches for text in batch), trainer)
    return LoadedTokenizer(tok, "<trained>", tok.token_to_id(eos_token), eos_token, False)


def pad_vocabulary(tok: LoadedTokenizer, size: int) -> LoadedTokenizer:
    """Grow a trained BPE's vocabulary to exactly `size` with never-produced `<|reserved_i|>` entries.

    For a small corpus whose merges run out below the cap: encoding is unchanged (no merge makes the
    new entries), but the vocabulary then matches an embedding table of `size` rows.
    """
    have = tok.vocab_size
    if have >= size:
        return tok
    data = json.loads(tok.tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for i in range(have, size):
        vocab[f"<|reserved_{i}|>"] = i
    padded = Tokenizer.from_str(json.dumps(data))
    return LoadedTokenizer(padded, tok.source, tok.eos_id, tok.eos_token, tok.superbpe)


def measure(tok: LoadedTokenizer, source: DocumentSource) -> dict:
    """Documents, characters, UTF-8 bytes, tokens and their ratios over every document of `source`."""
    docs = chars = nbytes = tokens = 0
    for batch in source.batches():
        docs += len(batch)
        chars += sum(len(t) for t in batch)
        nbytes += sum(len(t.encode("utf-8", "surrogatepass")) for t in batch)
        tokens += sum(len(ids) for ids in tok.encode_batch(batch))
    if docs == 0:
        raise UserError(f"input {', '.join(map(str, source.inputs))} holds no documents (all empty); "
                        "check --text-column / --text-template")
    return {"documents": docs, "characters": chars, "bytes": nbytes, "tokens": tokens,
            "chars_per_token": chars / max(tokens, 1), "bytes_per_token": nbytes / max(tokens, 1),
            "vocab_size": tok.vocab_size, "skipped_empty": source.skipped_empty,
            "replaced_utf8": source.replaced_utf8}


SUPERBPE_CHOICES = ("auto", "on", "off")


def superbpe_flag(value: str) -> bool | None:
    """The `--superbpe auto|on|off` argument as `load_tokenizer`'s `superbpe` (None: detect)."""
    return {"auto": None, "on": True, "off": False}[value]
