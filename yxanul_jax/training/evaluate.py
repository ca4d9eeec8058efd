"""Multi-domain validation: resolve `eval.domains`, tokenize raw validation files once, report loss/ppl.

A domain value is either a prepared dataset directory (its `val` split is used) or a raw input
file (parquet / jsonl / txt) with an optional text template after `::`, e.g.
`data/gsm8k.parquet::{question}\\n{answer}`. Raw files are tokenized with the training data's
tokenizer on first use into a cache keyed by file identity and tokenizer hash. A missing file is a
UserError (a run never validates on something other than what it was told). The training data's own
held-out split comes first, as domain `heldout` (a mixture: `heldout-<name>` per dataset), unless
`eval.in_domain` is false; `eval.domains` add to it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
from dataclasses import dataclass
from typing import Callable

from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import cache_root
from yxanul_jax.data.dataset import PreparedDataset, open_dataset
from yxanul_jax.data.layout import TOKENIZER, is_prepared
from yxanul_jax.data.loader import eval_batches


@dataclass
class Domain:
    name: str
    dataset: PreparedDataset
    split: str = "val"


def _prepare_raw(name: str, path: str, template: str | None, train_ds: PreparedDataset) -> PreparedDataset:
    from yxanul_jax.data.prepare import prepare_dataset
    from yxanul_jax.data.sources import DocumentSource

    if train_ds.tokenizer_path is None:
        raise UserError(f"eval domain '{name}': dataset '{train_ds.path}' has no {TOKENIZER} to tokenize "
                        f"'{path}' with; point eval.domains.{name} at a prepared dataset instead")
    st = os.stat(path)
    key = json.dumps([os.path.abspath(path), st.st_size, st.st_mtime_ns, template,
                      train_ds.manifest.get("tokenizer", {}).get("sha256"), train_ds.vocab_size, train_ds.eos_id])
    out = cache_root() / "eval" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not is_prepared(out):
        fix = (f"name its text with a template in the config: eval.domains.{name}={path}::{{column}} "
               "(several columns: ::{question}\\n{answer})")
        text = f" --text-template {shlex.quote(template)}" if template is not None else ""
        utf8_fix = (f"prepare it replacing such text (python -m yxanul_jax.prepare --input {shlex.quote(path)}{text} "
                    f"--bad-utf8 replace --tokenizer {shlex.quote(str(train_ds.tokenizer_path))} --val-fraction 1 "
                    f"--output DIR) and set eval.domains.{name}=DIR")
        source = DocumentSource([path], text_template=template, fix=fix, utf8_fix=utf8_fix)
        prepare_dataset(source, train_ds.tokenizer(), out, val_fraction=1.0, progress=False)
    return open_dataset(out)


IN_DOMAIN = "heldout"
"""The name of the training data's held-out split as a domain (a mixture's dataset `books`: `heldout-books`)."""


def in_domain_name(dataset: str) -> str:
    """The domain name of training dataset `dataset`'s held-out split ('' : one dataset)."""
    return f"{IN_DOMAIN}-{dataset}" if dataset else IN_DOMAIN


def resolve_domains(domains: dict[str, str], train_ds: PreparedDataset,
                    in_domain: dict[str, PreparedDataset] | None = None) -> list[Domain]:
    """Domains to validate on: the held-out split of every training dataset of `in_domain` (name -> dataset, ''
    for one dataset; None: `train_ds`'s), then `domains` in config order. UserError for a domain name that is
    taken, a missing path, or a training dataset without held-out documents."""
    in_domain = {"": train_ds} if in_domain is None else in_domain
    out = [Domain(in_domain_name(name), ds) for name, ds in in_domain.items()]
    for d in out:
        try:
            d.dataset.split(d.split)
        except UserError as e:
            raise UserError(f"{e}, or set eval.in_domain=false to validate on eval.domains only") from None
    taken = {d.name for d in out} | {"mean"}
    for name, spec in domains.items():
        if name in taken:
            raise UserError(f"eval domain '{name}': the name is taken (by the training data's held-out split, or "
                            f"'mean' by the average); rename eval.domains.{name}")
        path, _, template = spec.partition("::")
        template = template.replace("\\n", "\n") or None
        if not os.path.exists(path):
            raise UserError(f"eval domain '{name}': '{path}' does not exist; fix eval.domains.{name} or remove it "
                            "(a run never validates on something other than what it was told)")
        if is_prepared(path):
            ds = open_dataset(path)
        else:
            ds = _prepare_raw(name, path, template, train_ds)
        ds.check_vocab(train_ds.vocab_size)
        ds.check_tokenizer(train_ds, f"eval domain '{name}' ('{path}')", f"the training data ('{train_ds.path}')",
                           "prepare it with the training data's tokenizer (its tokenizer.json), or give "
                           f"eval.domains.{name} the raw text file to have it tokenized so")
        out.append(Domain(name, ds))
    for d in out:  # no validation split: a UserError now, not at the first validation after training
        d.dataset.split(d.split)
    return out


def evaluate(eval_step: Callable, params, fp8_state, domains: list[Domain], *, seq_len: int, batch_size: int,
             max_batches: int = 0, put: Callable = lambda b: b, process_index: int = 0,
             process_count: int = 1, should_stop: Callable[[], bool] | None = None) -> dict | None:
    """Per-domain mean loss and perplexity plus their token-weighted mean, as a flat metrics dict; None when
    `should_stop()` (asked before each batch; one process only: the others would wait in a collective)
    said to abandon it."""
    row: dict = {}
    total_nll, total_tokens = 0.0, 0.0
    for d in domains:
        nll, count = 0.0, 0.0
        for batch in eval_batches(d.dataset, seq_len=seq_len, batch_size=batch_size, split=d.split,
                                  max_batches=max_batches, process_index=process_index,
                                  process_count=process_count):
            if should_stop is not None and should_stop():
                return None
            s, c = eval_step(params, fp8_state, put(batch))
            nll, count = nll + float(s), count + float(c)
        loss = nll / max(count, 1.0)
        row[f"val/{d.name}/loss"] = loss
        row[f"val/{d.name}/ppl"] = math.exp(min(loss, 50.0))
        row[f"val/{d.name}/tokens"] = int(count)
        total_nll, total_tokens = total_nll + nll, total_tokens + count
    mean = total_nll / max(total_tokens, 1.0)
    row["val/mean/loss"] = mean
    row["val/mean/ppl"] = math.exp(min(mean, 50.0))
    return row


def format_eval(row: dict) -> str:
    names = [k.split("/")[1] for k in row if k.endswith("/loss")]
    lines = [f"{'domain':<12}{'tokens':>12}{'loss':>10}{'ppl':>14}"]
    for n in names:
        tokens = row.get(f"val/{n}/tokens", "")
        lines.append(f"{n:<12}{tokens!s:>12}{row[f'val/{n}/loss']:>10.4f}{row[f'val/{n}/ppl']:>14.2f}")
    return "\n".join(lines)
