"""`python -m yxanul_jax.prepare` (`yxanul prepare`): tokenize a corpus once into token shards + manifest.

    python -m yxanul_jax.prepare --input PATH... | --hf-dataset NAME_OR_PATH [--split S] --tokenizer PATH --output DIR
        [--text-column C | --text-template T] [--val-fraction 0.05] [--workers N]

What it writes, and how the split is chosen: `yxanul_jax/data/prepare.py`.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, Ranged, cli_entry, user_path
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import check_output_parent
from yxanul_jax.data.hf_source import hf_source_from_args
from yxanul_jax.data.prepare import prepare_dataset
from yxanul_jax.data.sources import add_source_args, source_from_args, warn_replaced
from yxanul_jax.data.tokenizer import SUPERBPE_CHOICES, load_tokenizer, superbpe_flag


def _print_summary(manifest: dict, output: str) -> None:
    console.info(f"{'split':<6} {'documents':>10} {'tokens':>14} {'characters':>15} {'chars/token':>11}")
    for name, s in manifest["splits"].items():
        console.info(f"{name:<6} {s['documents']:>10,} {s['tokens']:>14,} {s['characters']:>15,} {s['chars_per_token']:>11.3f}")
    console.info(f"vocab {manifest['vocab_size']:,}, EOS {manifest['eos_id']}, {manifest['dtype']} shards, "
          f"{manifest['tokens_per_sec']:,} tokens/s -> {output}")


@cli_entry
def main(argv: Sequence[str] | None = None) -> int:
    """`prepare`: tokenize inputs into token shards + a manifest (`data.layout`); returns the exit code."""
    parser = ArgumentParser(prog="yxanul prepare", description=__doc__.split("\n\n")[0])
    add_source_args(parser, input_required=False)
    parser.add_argument("--hf-dataset", default=None, type=user_path, metavar="NAME_OR_PATH",
                        help="instead of --input: a Hugging Face `datasets` dataset (a save_to_disk folder, a folder "
                             "of data files, or a name in the local cache); needs the `hf` extra")
    parser.add_argument("--split", default=None, help="--hf-dataset's split (default: its only one, else train)")
    parser.add_argument("--tokenizer", required=True, type=user_path, help="tokenizer.json, or a directory with it or vocab.json + merges.txt")
    parser.add_argument("--output", required=True, type=user_path, help="new directory for the prepared dataset")
    parser.add_argument("--val-fraction", type=Ranged(float, 0, 1), default=0.05,
                        help="share of documents held out (default 0.05)")
    parser.add_argument("--workers", type=Ranged(int, 1), default=None,
                        help="encoder threads (default: all cores); set before the tokenizer is first used")
    parser.add_argument("--superbpe", choices=SUPERBPE_CHOICES, default="auto",
                        help="SuperBPE pre-tokenizer for vocab.json + merges.txt (auto: when superwords exist)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if bool(args.input) == bool(args.hf_dataset):
        raise UserError("pass the documents as --input PATH... or as --hf-dataset NAME_OR_PATH (one of them)")
    if args.split is not None and not args.hf_dataset:
        raise UserError("--split chooses a split of --hf-dataset; leave it out with --input")
    check_output_parent(args.output)  # its folder can be made: no file in the way, writable (before any tokenizing)
    if args.workers is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.workers)  # read once, at the encoder's first use
    tok = load_tokenizer(args.tokenizer, superbpe=superbpe_flag(args.superbpe))
    source = hf_source_from_args(args) if args.hf_dataset else source_from_args(args)
    manifest = prepare_dataset(source, tok, args.output, val_fraction=args.val_fraction,
                               progress=not args.no_progress)
    warn_replaced(source)
    _print_summary(manifest, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
