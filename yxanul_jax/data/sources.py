"""Input readers: parquet, JSON lines (optionally gzipped) and plain text, as streams of documents.

One `DocumentSource` reads any mix of inputs lazily, in a fixed order, and yields batches of
document strings. Every way an input can be wrong (missing path, nothing matched, missing column,
a template naming a missing column, invalid JSON, non-UTF-8 bytes) raises `UserError` with one
line naming the file (and column or line) and the fix.

Document boundaries:
  parquet  one row = one document (`--text-column`, default `text`, or `--text-template`);
  .jsonl   one line = one document (same column / template rules, `.jsonl.gz` too);
  .txt     paragraphs separated by blank lines (`txt_docs="paragraph"`, the default), or the whole
           file as one document (`txt_docs="file"`); `.txt.gz` too.
Documents that are empty or only whitespace are skipped and counted (`skipped_empty`).

Non-UTF-8 policy: by default invalid UTF-8 is an error naming the file and byte offset / line
(`bad_utf8="fail"`); with `bad_utf8="replace"` each invalid sequence becomes U+FFFD, the count is
kept in `replaced_utf8` and reported as a warning (and recorded in a prepared dataset's manifest).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from yxanul_jax.core import console
from yxanul_jax.core.args import user_path
from yxanul_jax.core.errors import UserError, one_line

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".txt", ".txt.gz")
TEXT_COLUMN = "text"
"""The column read when neither --text-column nor --text-template is given."""
_REPLACEMENT_UTF8 = "\ufffd".encode()
_SURROGATE = re.compile("[\ud800-\udfff]")  # what a JSON escape may decode to and UTF-8 cannot hold


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix.split(".")[1]  # parquet | jsonl | txt
    return None


def expand_inputs(inputs: Sequence[str], flag: str = "--input") -> list[Path]:
    """Files named by `inputs` (files, directories searched recursively, or globs), in order.

    Each input's matches are sorted; duplicates are dropped. Raises UserError for a missing path,
    a pattern or directory that matches no supported file, or an unsupported file type, naming the inputs as the
    command-line `flag` that gave them (prepare's `--input` as "input").
    """
    noun = "input" if flag == "--input" else flag
    if not inputs:
        raise UserError(f"no input given; pass {flag} with a parquet/jsonl/txt file, directory or glob")
    files: list[Path] = []
    for text in inputs:
        path = Path(text).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p)
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not found:
                raise UserError(f"{noun} directory '{text}' holds no {'/'.join(SUFFIXES)} files; "
                                f"point {flag} at a directory with data files")
        elif path.is_file():
            if not _kind(path):
                raise UserError(f"{noun} '{text}' has an unsupported type; use {', '.join(SUFFIXES)}")
            found = [path]
        elif glob.has_magic(text):
            found = sorted(Path(p) for p in glob.glob(os.path.expanduser(text), recursive=True)
                           if Path(p).is_file() and _kind(Path(p)))
            if not found:
                raise UserError(f"{noun} pattern '{text}' matches no {'/'.join(SUFFIXES)} files; check the glob")
        else:
            raise UserError(f"{noun} '{text}' does not exist; check the path")
        files.extend(found)
    return list(dict.fromkeys(p.resolve() for p in files))


def unescape_template(text: str) -> str:
    """Turn the two-character escapes `\\n`, `\\t`, `\\\\` typed on a command line into characters."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def template_fields(template: str) -> list[str]:
    """Column names a `str.format` template refers to; UserError for positional or dotted fields."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise UserError(f"--text-template {template!r} is not a valid format string ({e}); "
                        f"write columns as {{name}} and literal braces as {{{{ }}}}")
    for name in names:
        if not name or not name.isidentifier():
            raise UserError(f"--text-template field {{{name}}} must be a plain column name like {{question}}")
    if not names:
        raise UserError(f"--text-template {template!r} names no column; write e.g. '{{question}}\\n{{answer}}'")
    return list(dict.fromkeys(names))


@dataclass
class DocumentSource:
    """Documents from parquet / jsonl / txt inputs, read lazily in input order.

    `batches()` yields lists of document strings; after iterating, `documents`, `skipped_empty`
    and `replaced_utf8` hold the counts. Column problems are checked for every file up front
    (`check()`), before any document is read.
    """

    inputs: Sequence[str]
    text_column: str = TEXT_COLUMN
    text_template: str | None = None
    bad_utf8: str = "fail"
    txt_docs: str = "paragraph"
    fix: str | None = None
    """How the caller names the text, for column errors (None: the CLI's --text-column / --text-template)."""
    utf8_fix: str | None = None
    """How the caller replaces text that is no UTF-8, for those errors (None: the CLI's --bad-utf8 replace)."""
    flag: str = "--input"
    """The command-line flag that named `inputs`, for errors about them (`expand_inputs`)."""

    def __post_init__(self):
        if self.bad_utf8 not in ("fail", "replace"):
            raise UserError(f"bad_utf8 must be 'fail' or 'replace', got {self.bad_utf8!r}")
        if self.txt_docs not in ("paragraph", "file"):
            raise UserError(f"txt_docs must be 'paragraph' or 'file', got {self.txt_docs!r}")
        self.files = expand_inputs(self.inputs, self.flag)
        self.fields = template_fields(self.text_template) if self.text_template is not None else None
        self.documents = 0
        self.skipped_empty = 0
        self.replaced_utf8 = 0
        self.check()

    # ---- description

    def identity(self) -> list[dict]:
        """Path, size and mtime of every input file (what a rerun compares to decide "same input")."""
        out = []
        for p in self.files:
            st = p.stat()
            out.append({"path": str(p), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
        return out

    def text_spec(self) -> dict:
        spec = {"template": self.text_template} if self.text_template is not None else {"column": self.text_column}
        return {**spec, "bad_utf8": self.bad_utf8, "txt_docs": self.txt_docs}

    def documents_hint(self) -> int | None:
        """Number of rows when every input is parquet (for a progress bar), else None."""
        if any(_kind(p) != "parquet" for p in self.files):
            return None
        return sum(pq.ParquetFile(p).metadata.num_rows for p in self.files)

    def _needed(self) -> list[str]:
        return self.fields if self.fields is not None else [self.text_column]

    def _not_text_fix(self) -> str:
        return self.fix or "pass --text-column naming a text column or use --text-template"

    def _utf8_fix(self) -> str:
        return self.utf8_fix or "pass --bad-utf8 replace to substitute U+FFFD"

    def _what(self) -> str:
        return "--text-template" if self.fields is not None else "--text-column"

    def check(self) -> None:
        """Raise UserError if any parquet file lacks a needed column, or the first JSON line does."""
        for p in self.files:
            kind = _kind(p)
            if kind == "parquet":
                try:
                    schema = pq.read_schema(p)
                except (pa.ArrowException, OSError) as e:
                    raise UserError(f"input '{p}' is not a readable parquet file ({one_line(e)})")
                self._check_columns(p, schema.names)
                if self.fields is None:
                    tp = schema.field(self.text_column).type
                    if not (pa.types.is_string(tp) or pa.types.is_large_string(tp)
                            or pa.types.is_binary(tp) or pa.types.is_large_binary(tp)):
                        raise UserError(f"column '{self.text_column}' of '{p}' has type {tp}, not text; "
                                        + self._not_text_fix())
            elif kind == "jsonl":
                replaced = self.replaced_utf8  # the read decodes this line again and counts it then
                for lineno, record in self._json_records(p, limit=1):
                    self._check_columns(p, list(record), lineno)
                self.replaced_utf8 = replaced

    def refuse_text_option(self, flag: str | None) -> None:
        """UserError when `flag` (the --text-column / --text-template given; None: neither) names columns but
        every input is a .txt file, which has none: the option would be silently ignored."""
        if flag and all(_kind(Path(p)) == "txt" for p in self.files):
            what = f"input '{self.files[0]}' is" if len(self.files) == 1 else "every input is"
            raise UserError(f"{flag} applies to .jsonl / .parquet inputs only, and {what} plain text (no columns); "
                            f"drop {flag}")

    def _check_columns(self, path: Path, names: list[str], lineno: int | None = None) -> None:
        missing = [c for c in self._needed() if c not in names]
        if missing:
            where = f"'{path}'" + (f" line {lineno}" if lineno else "")
            fix = self.fix or ("fix --text-template" if self.fields is not None
                               else "pass --text-column C or --text-template T")
            what = f" named by {self._what()}" if self.fix is None else ""
            raise UserError(f"{where} has no column '{missing[0]}'{what} (columns: {', '.join(names) or 'none'}); {fix}")

    # ---- reading

    def batches(self, max_docs: int = 512, max_chars: int = 4_000_000) -> Iterator[list[str]]:
        """Yield lists of non-empty documents (each list <= max_docs docs, about <= max_chars)."""
        batch: list[str] = []
        chars = 0
        for p in self.files:
            for text in self._documents(p):
                if not text.strip():
                    self.skipped_empty += 1
                    continue
                self.documents += 1
                batch.append(text)
                chars += len(text)
                if len(batch) >= max_docs or chars >= max_chars:
                    yield batch
                    batch, chars = [], 0
        if batch:
            yield batch

    def _documents(self, path: Path) -> Iterator[str]:
        kind = _kind(path)
        if kind == "parquet":
            yield from self._parquet(path)
        elif kind == "jsonl":
            for lineno, record in self._json_records(path):
                yield self._unpaired(self._from_record(path, record, lineno), f"'{path}' line {lineno}")
        else:
            yield from self._txt(path)

    def _decode(self, data: bytes, where: str) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.bad_utf8 == "fail":
                raise UserError(f"{where} holds invalid UTF-8 at byte {e.start} ({data[e.start:e.start + 4]!r}); "
                                f"fix the file or {self._utf8_fix()}")
            text = data.decode("utf-8", errors="replace")
            self.replaced_utf8 += text.count("\ufffd") - data.count(_REPLACEMENT_UTF8)
            return text

    def _unpaired(self, text: str, where: str) -> str:
        """`text` of a JSON record, whose escapes may spell a lone UTF-16 surrogate (\\ud800): not a character, so no
        UTF-8 and no tokenizer takes it. As invalid UTF-8 is: an error, or (`bad_utf8="replace"`) U+FFFD, counted."""
        bad = _SURROGATE.search(text)
        if bad is None:
            return text
        if self.bad_utf8 == "fail":
            raise UserError(f"{where} holds a lone UTF-16 surrogate (\\u{ord(bad.group()):04x}, a JSON escape that is "
                            f"no character); fix the file or {self._utf8_fix()}")
        text, n = _SURROGATE.subn("\ufffd", text)
        self.replaced_utf8 += n
        return text

    def _from_record(self, path: Path, record: dict, lineno: int | None = None) -> str:
        if self.fields is None:
            value = record.get(self.text_column)
            if value is not None and not isinstance(value, str):
                where = f"'{path}'" + (f" line {lineno}" if lineno else "")
                raise UserError(f"{where}: column '{self.text_column}' holds {type(value).__name__}, not text; "
                                + self._not_text_fix())
            return value or ""
        values = {k: ("" if record.get(k) is None else record[k]) for k in self.fields}
        return self.text_template.format_map(values)

    def _parquet(self, path: Path) -> Iterator[str]:
        columns = self._needed()
        row0 = 0
        for rb in self._parquet_batches(path, columns):
            cols = {name: self._column_values(path, name, rb.column(name), row0) for name in columns}
            n = rb.num_rows
            row0 += n
            if self.fields is None:
                yield from (v or "" for v in cols[self.text_column])
            else:
                for i in range(n):
                    yield self.text_template.format_map(
                        {k: ("" if cols[k][i] is None else cols[k][i]) for k in self.fields})

    @staticmethod
    def _parquet_batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The file's record batches; a damaged page (or a file cut short) is a UserError naming the file."""
        row0 = 0
        try:
            for rb in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=columns):
                yield rb
                row0 += rb.num_rows
        except (OSError, pa.ArrowException) as e:
            raise UserError(f"input '{path}' is damaged after row {row0} ({one_line(e)}); re-create or "
                            "re-download it, or leave it out of --input")

    def _column_values(self, path: Path, name: str, arr: pa.Array, row0: int) -> list:
        tp = arr.type
        is_bin = pa.types.is_binary(tp) or pa.types.is_large_binary(tp)
        if not is_bin:
            try:
                return arr.to_pylist()
            except UnicodeDecodeError:  # a string column with invalid bytes: re-read it as bytes
                arr = arr.view(pa.large_binary() if pa.types.is_large_string(tp) else pa.binary())
        return [None if b is None else self._decode(b, f"column '{name}' of '{path}' row {row0 + i}")
                for i, b in enumerate(arr.to_pylist())]

    def _json_records(self, path: Path, limit: int | None = None) -> Iterator[tuple[int, dict]]:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        seen = 0
        try:
            with opener(path, "rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    if not raw.strip():
                        continue
                    line = self._decode(raw, f"'{path}' line {lineno}")
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise UserError(f"'{path}' line {lineno} is not valid JSON ({e.msg}); "
                                        "each line of a .jsonl file must be one JSON object")
                    if not isinstance(record, dict):
                        raise UserError(f"'{path}' line {lineno} is a JSON {type(record).__name__}, "
                                        "not an object; each line must be one object with named columns")
                    self._check_columns(path, list(record), lineno)
                    yield lineno, record
                    seen += 1
                    if limit is not None and seen >= limit:
                        return
        except (OSError, EOFError) as e:  # e.g. a truncated or non-gzip .gz file
            raise UserError(f"input '{path}' cannot be read ({one_line(e)}); check the file")

    def _txt(self, path: Path) -> Iterator[str]:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        lines: list[str] = []
        try:
            with opener(path, "rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    line = self._decode(raw, f"'{path}' line {lineno}")
                    if self.txt_docs == "paragraph" and not line.strip():
                        if lines:
                            yield "".join(lines)
                            lines = []
                        continue
                    lines.append(line)
        except (OSError, EOFError) as e:
            raise UserError(f"input '{path}' cannot be read ({one_line(e)}); check the file")
        if lines:
            yield "".join(lines)


# --------------------------------------------------------------------------------------------
# The command-line form of a source (the `tokenizer` and `prepare` commands)


def add_source_args(parser: argparse.ArgumentParser, input_required: bool = True) -> None:
    """--input / --text-column / --text-template / --bad-utf8 / --txt-docs, of `tokenizer` and `prepare`
    (`input_required=False`: the command has another source, e.g. prepare's --hf-dataset, and checks itself)."""
    parser.add_argument("--input", nargs="+", required=input_required, type=user_path, metavar="PATH",
                        help="parquet / .jsonl[.gz] / .txt[.gz] files, directories or globs")
    text = parser.add_mutually_exclusive_group()
    text.add_argument("--text-column", default=None, help=f"column holding the text (default: {TEXT_COLUMN})")
    text.add_argument("--text-template", default=None,
                      help=r"build the text from columns, e.g. '{question}\n{answer}' (\n, \t understood)")
    parser.add_argument("--bad-utf8", choices=("fail", "replace"), default="fail",
                        help="invalid UTF-8: fail (default) or replace with U+FFFD and report a count")
    parser.add_argument("--txt-docs", choices=("paragraph", "file"), default="paragraph",
                        help=".txt documents: blank-line separated paragraphs (default) or whole files")


def text_args(args: argparse.Namespace) -> dict[str, str | None]:
    """A source's `text_column` and `text_template` from --text-column / --text-template (neither: `TEXT_COLUMN`)."""
    template = unescape_template(args.text_template) if args.text_template is not None else None
    return {"text_column": TEXT_COLUMN if args.text_column is None else args.text_column, "text_template": template}


def source_from_args(args: argparse.Namespace) -> DocumentSource:
    """The `--input ...` source of `tokenizer` and `prepare`; a column option for text files only is refused."""
    source = DocumentSource(args.input, **text_args(args), bad_utf8=args.bad_utf8, txt_docs=args.txt_docs)
    source.refuse_text_option("--text-template" if args.text_template is not None
                              else "--text-column" if args.text_column is not None else None)
    return source


def warn_replaced(source: DocumentSource) -> None:
    if source.replaced_utf8:
        console.warn(f"replaced {source.replaced_utf8} invalid UTF-8 sequences with U+FFFD (--bad-utf8 replace)")
