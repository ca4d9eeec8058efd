"""The embedded default corpus: the installed Python standard library's own `.py` sources.

Real text that exists wherever Python does and needs no download. `ensure_demo_dataset()` trains a
small byte-level BPE on it and prepares it once into a cache directory, which is what
`python -m yxanul_jax.train` uses when no dataset is configured.

Selection (deterministic for a given Python installation): every `.py` file under
`sysconfig.get_paths()["stdlib"]`, skipping tests, site-packages, codec tables (`encodings`) and
generated docs (`pydoc_data`); files are taken in the order of a hash of their relative path (a
spread over the whole library rather than its alphabetical start) until `max_bytes`, then read
in sorted path order. One file is one document.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import sysconfig
import time
from pathlib import Path
from typing import Iterator

from yxanul_jax.core import console
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import cache_root

DEMO_VERSION = "demo-v2"
MAX_BYTES = 10_000_000
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings",
              "pydoc_data", "lib2to3"}


def stdlib_files(max_bytes: int = MAX_BYTES) -> list[Path]:
    """Standard-library `.py` files, about `max_bytes` in all, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if name.endswith(".py") and not name.startswith("test_"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    if not found:
        raise UserError(f"no Python sources under '{root}' for the demo corpus; set data.train to a prepared dataset")
    found.sort(key=lambda rp: hashlib.blake2b(rp[0].encode(), digest_size=8).digest())
    chosen, total = [], 0
    for rel, path in found:
        size = path.stat().st_size
        if total + size > max_bytes and chosen:
            continue
        chosen.append((rel, path))
        total += size
    return [p for _, p in sorted(chosen)]


def stdlib_documents(max_bytes: int = MAX_BYTES, batch: int = 64) -> Iterator[list[str]]:
    """Batches of document strings (one per file of `stdlib_files`); undecodable bytes become U+FFFD."""
    files = stdlib_files(max_bytes)
    for i in range(0, len(files), batch):
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in files[i:i + batch]]
        yield [t for t in texts if t.strip()]


def _request(vocab_size: int, max_bytes: int) -> dict:
    files = stdlib_files(max_bytes)
    return {"corpus": "python-stdlib", "demo": DEMO_VERSION, "vocab_cap": vocab_size,
            "python": platform.python_version(), "stdlib": sysconfig.get_paths()["stdlib"],
            "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def demo_dir_name(vocab_size: int) -> str:
    """The demo dataset's folder in the cache: one per corpus version, Python version (each has its own standard
    library, so its own text) and vocabulary size."""
    return f"{DEMO_VERSION}-py{platform.python_version()}-{vocab_size}"


def _ready(out: Path, vocab_size: int) -> bool:
    from yxanul_jax.data.dataset import open_dataset
    from yxanul_jax.data.layout import is_prepared

    if not is_prepared(out):
        return False
    manifest = open_dataset(out).manifest
    req = manifest.get("request", {})
    if req.get("corpus") != "python-stdlib" or req.get("vocab_cap") != vocab_size:
        raise UserError(f"'{out}' holds another dataset than the {vocab_size}-token demo corpus; "
                        "delete it or point YXANUL_CACHE elsewhere")
    if req.get("python") != platform.python_version():  # another Python's standard library: other text
        raise UserError(f"'{out}' holds the demo corpus of Python {req.get('python')}'s standard library, not of this "
                        f"Python {platform.python_version()}; delete it, or pass another cache_dir (or none: the default "
                        "cache keeps one folder per Python)")
    return True


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive advisory lock on `path` (no-op where fcntl is missing); racers wait, then reuse."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: atomic rename alone keeps the cache whole
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def training_dataset_path(train: str | dict | None, vocab_size: int) -> str:
    """The prepared dataset a run trains on, from its `data.train`: the path, a mixture's first (its datasets share
    one tokenizer), or without one the demo corpus's at `vocab_size` (built on first use)."""
    if train:
        return next(iter(train.values())) if isinstance(train, dict) else train
    return ensure_demo_dataset(vocab_size=vocab_size)


def ensure_demo_dataset(cache_dir: str | None = None, vocab_size: int = 4096, max_bytes: int = MAX_BYTES) -> str:
    """Path of the prepared demo dataset (stdlib sources, BPE of exactly `vocab_size`), built on first use.

    The BPE is trained with `vocab_size` as cap; the ~10 MB corpus runs out of merges long before
    200k entries, so a larger cap is filled with never-produced reserved entries (`pad_vocabulary`) and
    the dataset always matches `model.vocab_size`.

    Default location `cache_root() / demo_dir_name(vocab_size)` (`demo-v2-py3.12.3-4096`: a Python of another
    version reads other text and builds its own). Building is atomic (temp dir, then rename) and serialized by a
    lock file, so concurrent callers build it once.
    """
    from yxanul_jax.data.prepare import prepare_documents
    from yxanul_jax.data.tokenizer import check_bpe_args, pad_vocabulary, train_bpe

    check_bpe_args(vocab_size, 2, flag="model.vocab_size (the demo corpus trains its own BPE):")  # before its lock file
    out = Path(cache_dir).expanduser() if cache_dir else cache_root() / demo_dir_name(vocab_size)
    if _ready(out, vocab_size):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        if not _ready(out, vocab_size):
            started = time.perf_counter()
            console.info(f"demo corpus: training a {vocab_size:,}-token BPE on Python {platform.python_version()}'s "
                         f"standard library and writing its token shards to {out} (once)")
            tok = pad_vocabulary(train_bpe(stdlib_documents(max_bytes), vocab_size), vocab_size)
            tok.source = f"byte-level BPE trained on the Python {platform.python_version()} stdlib"
            prepare_documents(stdlib_documents(max_bytes), tok, out, request=_request(vocab_size, max_bytes),
                              val_fraction=0.05, progress=False)
            console.info(f"demo corpus ready in {time.perf_counter() - started:.1f} s")
    return str(out)
