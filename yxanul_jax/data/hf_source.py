"""Documents from a Hugging Face `datasets` dataset, for `prepare --hf-dataset` (the optional `hf` extra).

`HFDatasetSource(ref, split=..., text_column=... | text_template=...)` reads one split of
  * a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (memory-mapped Arrow),
  * a folder or file of data files `datasets` reads (parquet, json, csv, text), streamed (`streaming=True`),
  * a dataset name already in the local Hugging Face cache (memory-mapped Arrow; with
    `HF_DATASETS_OFFLINE=1` nothing is looked up online),
in stored order, a batch of rows at a time, so memory stays flat. One row is one document, its text from
`text_column` or `text_template` exactly as for parquet (`sources.DocumentSource`, whose batching, empty-
document rule and column errors this reuses): the same texts prepared from parquet give the same shards.
"""
from __future__ import annotations

import argparse
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from yxanul_jax.core.errors import UserError, one_line
from yxanul_jax.data.sources import DocumentSource, template_fields, text_args

EXTRA = "hf"
"""The optional dependency group that installs `datasets` (pyproject.toml)."""
_ROWS_PER_READ = 1024


def import_datasets() -> types.ModuleType:
    """The `datasets` module, or a UserError naming the extra that installs it."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"--hf-dataset needs the Hugging Face `datasets` package; install the extra: "
                        f"pip install 'yxanul-jax[{EXTRA}]' (or pip install 'datasets>=2.19')") from None
    return datasets


def _is_saved(path: Path) -> bool:
    """Whether `path` is a folder written by `save_to_disk` (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file()
                              or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file()))


DATA_FILE_SUFFIXES = (".parquet", ".json", ".jsonl", ".csv", ".tsv", ".txt", ".arrow", ".gz", ".zst")
"""Endings that make an --hf-dataset a file's path, never a dataset's name (`data/train.parquet`)."""


@dataclass
class HFDatasetSource(DocumentSource):
    """One split of a `datasets` dataset as documents (module docstring); `inputs` is [NAME_OR_PATH]."""

    split: str | None = None
    """The split to read; None: the only one, else 'train'."""

    def __post_init__(self):
        self.ref = str(self.inputs[0])
        self.fields = template_fields(self.text_template) if self.text_template is not None else None
        self.documents = self.skipped_empty = self.replaced_utf8 = 0
        self.dataset = self._open()
        self.files = [self.ref]  # what `batches()` walks: the one dataset
        self.check()

    def _open(self):
        datasets = import_datasets()
        path = Path(self.ref).expanduser()
        try:
            if _is_saved(path):
                loaded = datasets.load_from_disk(str(path))
            elif path.is_file():  # one data file: read lazily, never copied into the cache
                loaded = datasets.load_dataset(str(path.parent), data_files=path.name, streaming=True)
            elif path.exists():  # a folder of data files, the same
                loaded = datasets.load_dataset(str(path), streaming=True)
            elif (self.ref.startswith((".", "/", "~")) or self.ref.count("/") > 1
                  or path.suffix.lower() in DATA_FILE_SUFFIXES):
                raise UserError(f"--hf-dataset '{self.ref}' does not exist (a path: a dataset's name is NAME or "
                                "OWNER/NAME); pass an existing save_to_disk folder, data file or folder of them")
            else:
                loaded = datasets.load_dataset(self.ref)
        except UserError:
            raise
        except Exception as e:  # datasets raises many kinds (FileNotFoundError, ConnectionError, ValueError, ...)
            raise UserError(f"--hf-dataset '{self.ref}' cannot be read as a Hugging Face dataset ({one_line(e)}); "
                            "pass a save_to_disk folder, a folder of data files, or the name of a dataset in the "
                            "local Hugging Face cache") from None
        splits = list(loaded) if isinstance(loaded, dict) else None  # (Iterable)DatasetDict are dicts
        if splits is None:  # one Dataset (save_to_disk of a split)
            own = None if loaded.split is None else str(loaded.split)
            if self.split is not None and self.split != own:
                raise UserError(f"--hf-dataset '{self.ref}' is one split ({own or 'unnamed'}), not '{self.split}'; "
                                "leave out --split")
            self.split = own
            return loaded
        if self.split is None:
            if len(splits) != 1 and "train" not in splits:
                raise UserError(f"--hf-dataset '{self.ref}' has the splits {', '.join(splits)}; choose one with "
                                "--split S")
            self.split = splits[0] if len(splits) == 1 else "train"
        if self.split not in splits:
            raise UserError(f"--hf-dataset '{self.ref}' has no split '{self.split}' (splits: {', '.join(splits)}); "
                            "pass --split with one of them")
        return loaded[self.split]

    def _where(self) -> str:
        return f"{self.ref}[{self.split}]" if self.split else self.ref

    def identity(self) -> list[dict]:
        """What a rerun compares: the dataset (files with size and mtime, or the cached dataset's fingerprint) and split."""
        path = Path(self.ref).expanduser()
        if path.exists():
            files = [p for p in sorted(path.rglob("*") if path.is_dir() else [path]) if p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(path).parts if path.is_dir())]
            return [{"hf_dataset": str(path.resolve()), "split": self.split}] + [
                {"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in files]
        return [{"hf_dataset": self.ref, "split": self.split,
                 "fingerprint": getattr(self.dataset, "_fingerprint", None)}]

    def text_spec(self) -> dict:
        return {**super().text_spec(), "split": self.split}

    def documents_hint(self) -> int | None:
        return getattr(self.dataset, "num_rows", None)

    def check(self) -> None:
        """UserError if the split lacks a column the text needs (listing the columns it has)."""
        names = self.dataset.column_names
        if names is None:  # a streamed dataset whose features are unknown until read: its first row
            names = list(next(iter(self.dataset), {}))
        self._check_columns(self._where(), list(names))

    def _documents(self, _ref) -> Iterator[str]:
        rows = self.dataset.select_columns(self._needed())
        for batch in rows.iter(batch_size=_ROWS_PER_READ):
            columns = [batch[c] for c in self._needed()]
            for values in zip(*columns):
                yield self._from_record(self._where(), dict(zip(self._needed(), values)))


def hf_source_from_args(args: argparse.Namespace) -> HFDatasetSource:
    """The `prepare --hf-dataset REF [--split S] [--text-column C | --text-template T]` source."""
    return HFDatasetSource([args.hf_dataset], **text_args(args), split=args.split)
