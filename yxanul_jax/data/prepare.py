"""Corpus preparation: tokenize documents once into memory-mappable token shards plus a manifest
(the `prepare` command is `yxanul_jax/prepare.py`).

Output (written into a hidden temp dir next to DIR, renamed to DIR only when complete; the file
names are `yxanul_jax.data.layout`'s):

    layout.MANIFEST                   what is inside (see `prepare_documents`), format version 1
    layout.TOKENIZER                  a copy of the tokenizer used (self-contained dataset)
    {train,val}/NNNNN.tokens.npy      uint16 (vocab <= 65,536) or uint32 [n_tokens]: the documents'
                                      tokens back to back, no EOS (the reader inserts it)
    {train,val}/NNNNN.offsets.npy     int64 [n_docs + 1]: document i is tokens[off[i]:off[i+1]]

The split is by document content: a document goes to `val` when the first 8 bytes of the BLAKE2b
hash of its UTF-8 text, read as a fraction of 2**64, are below `val_fraction`. It does not depend
on input order, worker count or batch size, and identical duplicates always land in the same split.
Rerunning into an existing DIR prepared from the same request (inputs, text spec, tokenizer,
val_fraction) does nothing; anything else there is refused, never mixed.
"""
from __future__ import annotations

import hashlib
import json
import os
import itertools
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm import tqdm

from yxanul_jax.core import console
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import staged_dir
from yxanul_jax.data.dataset import FORMAT
from yxanul_jax.data.layout import SPLITS, TOKENIZER, manifest_path, offsets_file, tokens_file
from yxanul_jax.data.sources import DocumentSource
from yxanul_jax.data.tokenizer import LoadedTokenizer, load_tokenizer

VERSION = 1
SHARD_TOKENS = 1 << 25  # 32 Mi tokens (128 MiB as uint32) per shard file


def split_of(text: str, val_fraction: float) -> str:
    """'val' or 'train' for a document, from a hash of its text alone (stable, order-free)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "little") < val_fraction * 2.0**64 else "train"


class _ShardWriter:
    """Accumulates one split's documents and writes NNNNN.tokens.npy / NNNNN.offsets.npy files."""

    def __init__(self, root: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.root, self.split, self.dtype, self.shard_tokens = root, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self.documents = self.tokens = self.characters = 0
        self._arrays: list[np.ndarray] = []
        self._pending = 0

    def add(self, ids: np.ndarray, characters: int) -> None:
        self._arrays.append(ids)
        self._pending += len(ids)
        self.documents += 1
        self.tokens += len(ids)
        self.characters += characters
        if self._pending >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._arrays:
            return
        (self.root / self.split).mkdir(exist_ok=True)
        k = len(self.shards)
        tokens_name, offsets_name = tokens_file(self.split, k), offsets_file(self.split, k)
        lengths = np.fromiter((len(a) for a in self._arrays), dtype=np.int64, count=len(self._arrays))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        np.save(self.root / tokens_name, np.concatenate(self._arrays).astype(self.dtype, copy=False))
        np.save(self.root / offsets_name, offsets)
        self.shards.append({"tokens": tokens_name, "offsets": offsets_name,
                            "documents": len(self._arrays), "num_tokens": int(offsets[-1])})
        self._arrays, self._pending = [], 0

    def summary(self) -> dict:
        return {"documents": self.documents, "tokens": self.tokens, "characters": self.characters,
                "chars_per_token": self.characters / self.tokens if self.tokens else 0.0,
                "shards": self.shards}


def _encode(tokenizer: LoadedTokenizer, batch: list[str], val_fraction: float) -> list[tuple[str, np.ndarray, int]]:
    """(split, token ids, characters) per document; runs in a pool thread (the encoder drops the GIL)."""
    return [(split_of(t, val_fraction), ids, len(t)) for t, ids in zip(batch, tokenizer.encode_batch(batch))]


def _existing(output: Path, request: dict) -> dict | None:
    """The manifest of a finished identical preparation at `output`, None if `output` is free."""
    if not output.exists() or (output.is_dir() and not any(output.iterdir())):
        return None
    manifest = manifest_path(output)
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = {}
        if old.get("request") == request:
            return old
        raise UserError(f"output '{output}' holds a dataset prepared from a different request (inputs, text, "
                        "tokenizer or val fraction); choose another --output or delete it")
    raise UserError(f"output '{output}' exists and is not a prepared dataset; choose another --output or delete it")


def prepare_documents(batches: Iterable[list[str]], tokenizer: LoadedTokenizer, output: str | os.PathLike, *,
                      request: dict, val_fraction: float = 0.05, documents_hint: int | None = None,
                      progress: bool = True, shard_tokens: int = SHARD_TOKENS,
                      read_stats: Callable[[], dict] | None = None) -> dict:
    """Tokenize batches of document strings into a prepared dataset at `output`; return its manifest.

    `request` describes where the documents came from; a rerun with an equal request is a no-op.
    `read_stats()`, called after the last batch, adds reader counts (skipped, replaced) to the manifest.
    Raises UserError if `output` holds something else or no document is non-empty.
    """
    if not 0.0 <= val_fraction <= 1.0:
        raise UserError(f"--val-fraction must be in [0, 1], got {val_fraction}")
    output = Path(output).expanduser().absolute()
    request = {**request, "format": FORMAT, "version": VERSION, "tokenizer_sha256": tokenizer.sha256,
               "val_fraction": val_fraction}
    if (old := _existing(output, request)) is not None:
        console.note(f"'{output}' is already prepared from the same request; nothing to do")
        return old
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    start = time.perf_counter()
    try:
        with staged_dir(output) as tmp:
            tokenizer.save(tmp / TOKENIZER, with_eos=True)
            writers = {s: _ShardWriter(tmp, s, dtype, shard_tokens) for s in SPLITS}
            bar = tqdm(total=documents_hint, unit="doc", disable=not console.progress_wanted(progress),
                       desc="tokenizing", file=sys.stderr)  # on a terminal only: no bar line in a log
            console.set_live(bar)  # an error ends the bar's line first, never lands at its tail
            tokens = 0
            # Two batches encode at once so that the Rust thread pool never idles at the tail of one
            # batch (a few long documents); the main thread reads the next batch and writes meanwhile.
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="encode") as pool:
                pending: deque = deque()
                for batch in itertools.chain(batches, [None]):
                    if batch is not None:
                        pending.append(pool.submit(_encode, tokenizer, batch, val_fraction))
                    while pending and (batch is None or len(pending) > 2):
                        done = pending.popleft().result()
                        for split, ids, chars in done:
                            writers[split].add(ids, chars)
                            tokens += len(ids)
                        bar.update(len(done))
                        bar.set_postfix(tokens=f"{tokens:,}", refresh=False)
            console.set_live(None)
            bar.close()
            if sum(w.documents for w in writers.values()) == 0:
                raise UserError("the input holds no documents (every text is empty); "
                                "check --input and --text-column / --text-template")
            for w in writers.values():
                w.flush()
            elapsed = time.perf_counter() - start
            splits = {s: w.summary() for s, w in writers.items()}
            manifest = {
                "format": FORMAT, "version": VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id, "dtype": dtype.name,
                "tokenizer": {"file": TOKENIZER, **tokenizer.describe()},
                "val_fraction": val_fraction,
                "split_rule": "val iff blake2b-64(utf8 text) / 2**64 < val_fraction",
                "splits": splits,
                "documents": sum(v["documents"] for v in splits.values()),
                "tokens": tokens, "characters": sum(v["characters"] for v in splits.values()),
                "elapsed_s": round(elapsed, 3), "tokens_per_sec": round(tokens / max(elapsed, 1e-9)),
                **(read_stats() if read_stats else {}),
                "request": request,
            }
            manifest["chars_per_token"] = manifest["characters"] / max(tokens, 1)
            manifest_path(tmp).write_text(json.dumps(manifest, indent=1))
    except FileExistsError:
        if (old := _existing(output, request)) is not None:  # a racing identical run finished first
            return old
        raise UserError(f"output '{output}' appeared while preparing; choose another --output")
    return manifest


def prepare_dataset(source: DocumentSource, tokenizer: LoadedTokenizer | str, output: str | os.PathLike, *,
                    val_fraction: float = 0.05, progress: bool = True, shard_tokens: int = SHARD_TOKENS) -> dict:
    """Tokenize every document of `source` into a prepared dataset at `output`; return its manifest."""
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    request = {"inputs": source.identity(), "text": source.text_spec()}
    return prepare_documents(source.batches(), tok, output, request=request, val_fraction=val_fraction,
                             documents_hint=source.documents_hint(), progress=progress, shard_tokens=shard_tokens,
                             read_stats=lambda: {"skipped_empty": source.skipped_empty,
                                                 "replaced_utf8": source.replaced_utf8})
