"""`python -m yxanul_jax.tokenizer` (`yxanul tokenizer`): train a capped byte-level BPE, or measure a tokenizer.

    python -m yxanul_jax.tokenizer train --input PATH... --vocab-size N --output DIR
    python -m yxanul_jax.tokenizer stats --tokenizer PATH --input PATH... [--json]

The tokenizers themselves (loading with SuperBPE detection, training, measuring) live in
`yxanul_jax/data/tokenizer.py`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, Ranged, cli_entry, user_path
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import check_new_output, staged_dir
from yxanul_jax.data.sources import add_source_args, source_from_args, warn_replaced
from yxanul_jax.data.tokenizer import (BPE_VOCAB_WHY, MIN_BPE_VOCAB, SUPERBPE_CHOICES, check_bpe_args, load_tokenizer,
                                       measure, superbpe_flag, train_bpe)


def _cmd_train(args) -> int:
    check_new_output(args.output, "a trained tokenizer is never overwritten")  # before the long part
    check_bpe_args(args.vocab_size, args.min_frequency)
    source = source_from_args(args)
    tok = train_bpe(source.batches(), args.vocab_size, min_frequency=args.min_frequency,
                    show_progress=sys.stderr.isatty())
    if source.documents == 0:
        raise UserError(f"input {', '.join(args.input)} holds no documents (all empty); "
                        "check --text-column / --text-template")
    if tok.vocab_size < MIN_BPE_VOCAB:  # nothing merged: a byte tokenizer, 1 character a token (nothing written)
        raise UserError(f"no pair of the input occurs --min-frequency {args.min_frequency} times, so the BPE learned "
                        f"no merge (vocab {tok.vocab_size}: bytes alone); lower --min-frequency or give more text")
    warn_replaced(source)
    try:
        with staged_dir(args.output) as tmp:
            tok.save(tmp / "tokenizer.json")
    except FileExistsError:
        raise UserError(f"output '{args.output}' appeared while training; choose another --output")
    out = Path(args.output) / "tokenizer.json"
    console.info(f"trained byte-level BPE on {source.documents} documents: vocab {tok.vocab_size} "
          f"(cap {args.vocab_size}), EOS {tok.eos_token!r} = {tok.eos_id} -> {out}")
    return 0


def _cmd_stats(args) -> int:
    tok = load_tokenizer(args.tokenizer, superbpe=superbpe_flag(args.superbpe))
    source = source_from_args(args)
    result = measure(tok, source)
    warn_replaced(source)
    result = {"tokenizer": tok.source, "superbpe": tok.superbpe, **result}
    rows = [("tokenizer", tok.source), ("pre-tokenizer", "SuperBPE" if tok.superbpe else "standard"),
            ("vocab size", f"{tok.vocab_size:,}"), ("EOS", f"{tok.eos_token} = {tok.eos_id}"),
            ("documents", f"{result['documents']:,}"), ("characters", f"{result['characters']:,}"),
            ("tokens", f"{result['tokens']:,}"), ("characters/token", f"{result['chars_per_token']:.3f}"),
            ("bytes/token", f"{result['bytes_per_token']:.3f}")]
    for key, value in rows:
        console.info(f"{key:<18} {value}")
    if args.json:
        console.info(json.dumps(result))
    return 0


@cli_entry
def main(argv: Sequence[str] | None = None) -> int:
    """`tokenizer train` and `tokenizer stats`; returns the exit code."""
    parser = ArgumentParser(prog="yxanul tokenizer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a byte-level BPE with a capped vocabulary")
    add_source_args(train)
    train.add_argument("--vocab-size", type=Ranged(int, MIN_BPE_VOCAB, why=BPE_VOCAB_WHY), required=True,
                       help="vocabulary cap, EOS and 256 bytes included")
    train.add_argument("--output", required=True, type=user_path, help="new directory for tokenizer.json")
    train.add_argument("--min-frequency", type=Ranged(int, 1), default=2, help="least count of a pair to merge it")
    stats = sub.add_parser("stats", help="documents, characters, tokens and characters per token")
    stats.add_argument("--tokenizer", required=True, type=user_path, help="tokenizer.json, or a directory with it or vocab.json + merges.txt")
    add_source_args(stats)
    stats.add_argument("--superbpe", choices=SUPERBPE_CHOICES, default="auto",
                       help="SuperBPE pre-tokenizer for vocab.json + merges.txt (auto: when superwords exist)")
    stats.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    return _cmd_train(args) if args.command == "train" else _cmd_stats(args)


if __name__ == "__main__":
    sys.exit(main())
