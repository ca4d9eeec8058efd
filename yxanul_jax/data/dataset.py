"""Opening a prepared dataset directory: the manifest checked, each split's document table, memory maps.

Written by `yxanul_jax.data.prepare`; the file names are `yxanul_jax.data.layout`'s. The manifest
(`layout.MANIFEST`) names the format (`FORMAT`, version in `SUPPORTED_VERSIONS`), the vocabulary and
EOS id, the tokenizer copy (`layout.TOKENIZER`) and per split its shards: each a token file (uint16
or uint32, documents back to back, no EOS) and an offsets file (int64 [docs + 1]). Token files are
memory-mapped; only the per-document offsets are held in memory, never the corpus.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from yxanul_jax.core.errors import UserError, one_line
from yxanul_jax.core.names import inside
from yxanul_jax.data.layout import MANIFEST, TOKENIZER, manifest_path

FORMAT = "yxanul-tokens"
SUPPORTED_VERSIONS = (1,)


class SplitIndex:
    """One split's document table; token shards are memory-mapped on first use (per process)."""

    def __init__(self, root: Path, split: str, info: dict):
        self.split = split
        self.paths = [str(inside(root, s["tokens"], "a token shard")) for s in info["shards"]]  # never outside root
        doc_lengths, shard_of, start_in = [], [], []
        for k, s in enumerate(info["shards"]):
            path = inside(root, s["offsets"], "an offsets file")
            if not path.is_file() or not Path(self.paths[k]).is_file():
                raise UserError(f"prepared dataset '{root}' is missing '{s['offsets']}' or '{s['tokens']}'; "
                                "it is incomplete: prepare it again into a new directory")
            try:
                offsets = np.load(path)
                tokens = np.load(self.paths[k], mmap_mode="r")  # maps only: the header and the size
            except (ValueError, OSError, EOFError) as e:  # e.g. a shard cut short by a full disk or a copy
                raise UserError(f"prepared dataset '{root}': shard '{s['tokens']}' or its offsets cannot be read "
                                f"({one_line(e)}); it is damaged: prepare the dataset again")
            if offsets.ndim != 1 or len(offsets) != s["documents"] + 1 or offsets[-1] != s["num_tokens"] \
                    or tokens.shape != (s["num_tokens"],):
                raise UserError(f"'{path}' or its token shard does not match {MANIFEST}; prepare the dataset again")
            del tokens
            doc_lengths.append(np.diff(offsets))
            shard_of.append(np.full(len(offsets) - 1, k, dtype=np.int32))
            start_in.append(offsets[:-1])
        empty = np.zeros(0, np.int64)
        self.lengths = np.concatenate(doc_lengths) if doc_lengths else empty
        self.shard_of = np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32)
        self.start_in_shard = np.concatenate(start_in) if start_in else empty
        self.num_documents = len(self.lengths)
        self.num_tokens = int(self.lengths.sum())
        self._maps: list[np.ndarray] | None = None
        self._order: str | None = None

    def order_digest(self) -> str:
        """A digest of the document lengths in stored order: the same files prepared in another order (another
        glob, renamed files, an export of another order) give another, so a saved stream position is not read as
        pointing at the documents it did."""
        if self._order is None:
            self._order = hashlib.blake2b(self.lengths.astype("<i8").tobytes(), digest_size=16).hexdigest()
        return self._order

    def __getstate__(self):  # never pickle memory maps (that would copy the shards)
        return {**self.__dict__, "_maps": None}

    def doc_slice(self, doc: int, a: int, b: int) -> np.ndarray:
        """Tokens [a, b) of document `doc` (a view into a memory-mapped shard)."""
        if self._maps is None:
            self._maps = [np.load(p, mmap_mode="r") for p in self.paths]
        base = self.start_in_shard[doc]
        return self._maps[self.shard_of[doc]][base + a:base + b]


class PreparedDataset:
    """A prepared dataset directory: manifest, tokenizer identity and lazily opened splits."""

    def __init__(self, path: str | os.PathLike, manifest: dict):
        self.path = str(path)
        self.manifest = manifest
        self.vocab_size: int = int(manifest["vocab_size"])
        self.eos_id: int = int(manifest["eos_id"])
        tok = inside(path, manifest.get("tokenizer", {}).get("file", TOKENIZER), "its tokenizer")  # never elsewhere
        self.tokenizer_path: str | None = str(tok) if tok.is_file() else None
        self._splits: dict[str, SplitIndex] = {}

    def __repr__(self) -> str:
        return f"PreparedDataset({self.path!r}, vocab={self.vocab_size}, eos={self.eos_id})"

    @property
    def eos_token(self) -> str | None:
        """The end-of-text token's text, as the manifest records it (None in a manifest without it)."""
        return self.manifest.get("tokenizer", {}).get("eos_token")

    def tokenizer(self):
        """The tokenizer copy this dataset holds (`data.tokenizer.LoadedTokenizer`; UserError without one), its EOS
        the manifest's: the id that ends each document here, whatever a copy alone would guess."""
        from yxanul_jax.data.tokenizer import load_tokenizer

        if self.tokenizer_path is None:
            raise UserError(f"dataset '{self.path}' has no {TOKENIZER}; prepare it again")
        return load_tokenizer(self.tokenizer_path, eos_id=self.eos_id)

    def check_vocab(self, model_vocab_size: int, init_key: str = "", init_path: str = "") -> None:
        """UserError unless the model's embedding has exactly the dataset tokenizer's vocabulary. `init_key`
        (`init.from_hf` or `init.from_checkpoint`) and `init_path`: where the model's sizes come from, whose
        vocabulary no config key changes."""
        if model_vocab_size != self.vocab_size:
            src = self.manifest.get("tokenizer", {}).get("source", "its tokenizer")
            said = f"dataset '{self.path}' was tokenized with vocab {self.vocab_size} ({src}) but "
            if init_key:
                theirs = ("that model's tokenizer (its tokenizer.json)" if init_key == "init.from_hf" else
                          "the tokenizer its run trained with (the run directory's tokenizer.json)")
                raise UserError(f"{said}the model of {init_key} ('{init_path}') has {model_vocab_size} entries; "
                                f"prepare the data with {theirs}")
            raise UserError(f"{said}model.vocab_size is {model_vocab_size}; set model.vocab_size={self.vocab_size} "
                            f"or prepare the data with a {model_vocab_size}-entry tokenizer")

    def check_tokenizer(self, first: "PreparedDataset", said: str, first_said: str, fix: str) -> None:
        """UserError unless this dataset was tokenized with `first`'s tokenizer (the sha256 of its tokenizer.json in
        the manifests) and ends its documents with the same EOS: two tokenizers of one vocabulary size give the same
        ids other meanings, and one tokenizer may have been taken with another EOS (a copy without the
        special_tokens_map.json that names it). `said`/`first_said` name the two in the message, `fix` ends it."""
        ours, theirs = (d.manifest.get("tokenizer", {}) for d in (self, first))
        if ours.get("sha256") != theirs.get("sha256"):
            raise UserError(f"{said} was tokenized with another tokenizer ({ours.get('source', '?')}, sha256 "
                            f"{str(ours.get('sha256'))[:12]}) than {first_said} ({theirs.get('source', '?')}, sha256 "
                            f"{str(theirs.get('sha256'))[:12]}); {fix}")
        if self.eos_id != first.eos_id:
            raise UserError(f"{said} ends its documents with token {self.eos_id} ({self.eos_token!r}), {first_said} "
                            f"with {first.eos_id} ({first.eos_token!r}), by one tokenizer; prepare it again from a "
                            f"folder holding that tokenizer.json and a special_tokens_map.json that names "
                            f"{first.eos_token!r} its eos_token")

    def split(self, name: str) -> SplitIndex:
        """The document table of split `name` ('train' or 'val'); UserError if it has no documents."""
        if name not in self._splits:
            info = self.manifest.get("splits", {}).get(name)
            if info is None:
                raise UserError(f"dataset '{self.path}' has no split '{name}' (splits: "
                                f"{', '.join(self.manifest.get('splits', {}))})")
            self._splits[name] = SplitIndex(Path(self.path), name, info)
        index = self._splits[name]
        if index.num_documents == 0:
            hint = "--val-fraction > 0" if name == "val" else "--val-fraction < 1"
            raise UserError(f"dataset '{self.path}' has no '{name}' documents; prepare it with {hint}")
        return index

    def num_documents(self, split: str) -> int:
        return int(self.manifest["splits"][split]["documents"])

    def num_tokens(self, split: str) -> int:
        return int(self.manifest["splits"][split]["tokens"])

    def fingerprint(self, split: str = "train") -> dict:
        """What a saved stream position is only valid for (`same_dataset` compares two): the split's size, the
        tokenizer, and the order of its documents (`SplitIndex.order_digest`)."""
        return {"documents": self.num_documents(split), "tokens": self.num_tokens(split),
                "tokenizer_sha256": self.manifest.get("tokenizer", {}).get("sha256"),
                "order": self.split(split).order_digest()}


LATER_FINGERPRINT_KEYS = ("order",)  # keys a stream position saved before they existed lacks


def same_dataset(saved: object, now: dict) -> bool:
    """Whether a saved stream position's dataset `fingerprint` is `now`'s. A key in LATER_FINGERPRINT_KEYS is
    compared only when the saved one has it (a checkpoint written before it existed still resumes)."""
    return isinstance(saved, dict) and all(saved.get(k) == v for k, v in now.items()
                                           if k in saved or k not in LATER_FINGERPRINT_KEYS)


def open_dataset(path: str | os.PathLike) -> PreparedDataset:
    """Open a prepared dataset directory (reads its manifest only); UserError if missing or corrupt."""
    root = Path(path).expanduser()
    fix = "prepare one with `python -m yxanul_jax.prepare --input ... --tokenizer ... --output DIR`"
    if not root.exists():
        raise UserError(f"dataset '{path}' does not exist; {fix}")
    manifest_file = manifest_path(root)
    if not manifest_file.is_file():
        raise UserError(f"'{path}' is not a prepared dataset (no {MANIFEST}); {fix}")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        ok = (isinstance(manifest, dict) and manifest.get("format") == FORMAT
              and isinstance(manifest.get("splits"), dict) and "vocab_size" in manifest and "eos_id" in manifest)
    except (json.JSONDecodeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise UserError(f"'{manifest_file}' is corrupt or not a yxanul manifest; prepare the dataset again "
                        "into a new directory")
    if manifest.get("version") not in SUPPORTED_VERSIONS:
        raise UserError(f"'{manifest_file}' has format version {manifest.get('version')}, this code reads "
                        f"{SUPPORTED_VERSIONS}; prepare the dataset again with this version")
    return PreparedDataset(root, manifest)
