"""`python -m yxanul_jax.export`: a trained model as a Hugging Face Llama folder that `transformers` loads.

    python -m yxanul_jax.export --run-dir runs/tiny --output hf/tiny [--dtype bfloat16|float32]
    python -m yxanul_jax.export --checkpoint runs/tiny/checkpoints/300 --output hf/tiny

Writes `config.json` (LlamaForCausalLM), `model.safetensors` (the `safetensors` library; the
factorized embedding materialized as E·P, see `yxanul_jax.model.hf`), `tokenizer.json` +
`tokenizer_config.json` (the run's tokenizer) and `generation_config.json` (EOS, and sampling as our
`generate` command samples by default). Everything is written into a temporary folder beside the output
and renamed into place at the end; an existing output is refused. Then:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("hf/tiny"); tok = AutoTokenizer.from_pretrained("hf/tiny")

The FP8 state is not exported: the exported weights are the float32 master weights (cast to
`--dtype`), as every FP8 training recipe ships them.
"""
from __future__ import annotations

import json
import sys

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, cli_entry, user_path
from yxanul_jax.core.rundir import check_new_output
from yxanul_jax.inference.hf_export import DTYPES, export  # noqa: F401  (export: the library function)
from yxanul_jax.inference.trained import add_source_args, load_trained

@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m yxanul_jax.export", description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--output", required=True, type=user_path, help="new folder for the Hugging Face model")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = p.parse_args(argv)
    check_new_output(args.output, "an export is never overwritten")  # before the restore
    summary = export(load_trained(args.run_dir, args.checkpoint), args.output, args.dtype)
    console.info(f"exported step {summary['step']} to {summary['output']}: {summary['tensors']} tensors, "
                 f"{summary['values']:,} values ({summary['dtype']}), tied embeddings {summary['tie_word_embeddings']}")
    console.info(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
