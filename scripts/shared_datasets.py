"""Datasets the scripts share: the shared Gutenberg books prepared once into the cache (one recipe, one path)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yxanul_jax.core.errors import UserError  # noqa: E402
from yxanul_jax.core.rundir import cache_root  # noqa: E402
from yxanul_jax.data.dataset import open_dataset  # noqa: E402
from yxanul_jax.data.layout import is_prepared  # noqa: E402
from yxanul_jax.data.prepare import prepare_dataset  # noqa: E402
from yxanul_jax.data.sources import DocumentSource  # noqa: E402


def gutenberg_superbpe() -> str:
    """../shared's 262 Gutenberg books, SuperBPE-tokenized, prepared once into `$YXANUL_CACHE`."""
    out = cache_root() / "bench-gutenberg-superbpe"
    if not is_prepared(out):
        if not SHARED.exists():
            raise UserError(f"no --data given and no shared data at {SHARED}; pass --data DIR (a prepared dataset)")
        source = DocumentSource([str(SHARED / "data/train/gutenberg-*.parquet")])
        prepare_dataset(source, str(SHARED / "tokenizers/superbpe-t80k"), str(out), progress=sys.stderr.isatty())
    open_dataset(out)
    return str(out)


def gutenberg_code_8k() -> str:
    """The study dataset: one quarter of the Gutenberg books plus the JAX / Flax Python sources, with
    an 8,192-entry byte-level BPE trained on the same text, prepared once into `$YXANUL_CACHE`
    (5 % of documents held out as the val split). Small enough that a ~1 M-parameter model is sized
    for it: its embedding is 8k rows, not SuperBPE's 200k."""
    from yxanul_jax.data.tokenizer import train_bpe

    out = cache_root() / "study-gutenberg-code-8k"
    if not is_prepared(out):
        if not SHARED.exists():
            raise UserError(f"no --data given and no shared data at {SHARED}; pass --data DIR (a prepared dataset)")
        inputs = [str(SHARED / "data/train/gutenberg-00000-of-00004.parquet"), str(SHARED / "data/train/python_code.parquet")]
        tok = train_bpe(DocumentSource(inputs).batches(), 8192)
        prepare_dataset(DocumentSource(inputs), tok, str(out), progress=sys.stderr.isatty())
    open_dataset(out)
    return str(out)


if __name__ == "__main__":  # prepare them: python scripts/shared_datasets.py [gutenberg_code_8k ...]
    for name in sys.argv[1:] or ["gutenberg_code_8k"]:
        print(globals()[name]())
