"""The prepared-dataset layout: the names of the files a prepared dataset directory holds, in one place.

    DIR/manifest.json                  `MANIFEST`: what is inside (`yxanul_jax.data.dataset`)
    DIR/tokenizer.json                 `TOKENIZER`: a copy of the tokenizer used (self-contained)
    DIR/special_tokens_map.json        its EOS (`data.tokenizer.SPECIAL_TOKENS_MAP`; the manifest's eos_id too)
    DIR/<split>/NNNNN.tokens.npy       `tokens_file(split, k)`: shard k's tokens, documents back to back
    DIR/<split>/NNNNN.offsets.npy      `offsets_file(split, k)`: shard k's document offsets

with <split> one of `SPLITS`. The manifest lists every shard's two files by these relative paths,
so a reader takes them from the manifest; the patterns here are for writers and for tests.
"""
from __future__ import annotations

import os
from pathlib import Path

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
SPLITS = ("train", "val")
TOKENS_SUFFIX = ".tokens.npy"
OFFSETS_SUFFIX = ".offsets.npy"
TOKENS_GLOB = "*" + TOKENS_SUFFIX
"""Matches the token shards inside one split's folder."""


def shard_stem(split: str, k: int) -> str:
    """'train/00003': split `split`'s shard `k`, relative to the dataset directory, without suffix."""
    return f"{split}/{k:05d}"


def tokens_file(split: str, k: int) -> str:
    """Shard `k`'s token file relative to the dataset directory ('train/00000.tokens.npy')."""
    return shard_stem(split, k) + TOKENS_SUFFIX


def offsets_file(split: str, k: int) -> str:
    """Shard `k`'s offsets file relative to the dataset directory ('train/00000.offsets.npy')."""
    return shard_stem(split, k) + OFFSETS_SUFFIX


def manifest_path(directory: str | os.PathLike) -> Path:
    """`directory`'s manifest file (which may not exist)."""
    return Path(directory) / MANIFEST


def is_prepared(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a finished prepared dataset (its manifest is written last)."""
    return manifest_path(directory).is_file()
