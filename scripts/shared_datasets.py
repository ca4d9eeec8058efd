"""Datasets the scripts share: the shared Gutenberg books prepared once into the cache (one recipe, one path)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yxanul_jax.data import open_dataset  # noqa: E402
from yxanul_jax.errors import UserError  # noqa: E402
from yxanul_jax.prepare import prepare_dataset  # noqa: E402
from yxanul_jax.rundir import cache_root  # noqa: E402
from yxanul_jax.sources import DocumentSource  # noqa: E402


def gutenberg_superbpe() -> str:
    """../shared's 262 Gutenberg books, SuperBPE-tokenized, prepared once into `$YXANUL_CACHE`."""
    out = cache_root() / "bench-gutenberg-superbpe"
    if not (out / "manifest.json").is_file():
        if not SHARED.exists():
            raise UserError(f"no --data given and no shared data at {SHARED}; pass --data DIR (a prepared dataset)")
        source = DocumentSource([str(SHARED / "data/train/gutenberg-*.parquet")])
        prepare_dataset(source, str(SHARED / "tokenizers/superbpe-t80k"), str(out), progress=sys.stderr.isatty())
    open_dataset(out)
    return str(out)
