"""`python -m yxanul_jax.export`: a trained model as a Hugging Face Llama folder that `transformers` loads.

    python -m yxanul_jax.export --run-dir runs/tiny --output hf/tiny [--dtype bfloat16|float32]
    python -m yxanul_jax.export --checkpoint runs/tiny/checkpoints/300 --output hf/tiny

Writes `config.json` (LlamaForCausalLM), `model.safetensors` (the `safetensors` library; the
factorized embedding materialized as E·P, see `yxanul_jax.model.hf`), `tokenizer.json` +
`tokenizer_config.json` (the run's tokenizer) and `generation_config.json` (EOS). Everything is
written into a temporary folder beside the output and renamed into place at the end; an existing
output is refused. Then:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("hf/tiny"); tok = AutoTokenizer.from_pretrained("hf/tiny")

The FP8 state is not exported: the exported weights are the float32 master weights (cast to
`--dtype`), as every FP8 training recipe ships them.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, cli_entry
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import check_new_output, staged_dir
from yxanul_jax.inference.trained import add_source_args, load_trained
from yxanul_jax.model.hf import hf_config, to_hf

DTYPES = ("bfloat16", "float32")


def export(trained, output: str, dtype: str = "bfloat16") -> dict:
    """Write the HF folder of a `trained.Trained` to `output` (atomically); returns a summary dict."""
    import jax.numpy as jnp
    from safetensors.flax import save_file

    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    output = str(check_new_output(output, "an export is never overwritten"))
    tok = trained.tokenizer()
    m = trained.cfg.model
    tied, tensors = to_hf(m, trained.params)
    with staged_dir(output) as tmp:  # an empty folder the user made at `output` is replaced
        jdt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        weights = os.path.join(tmp, "model.safetensors")
        save_file({k: jnp.asarray(v, jdt) for k, v in tensors.items()}, weights, metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(weights, 0o666 & ~umask)  # safetensors writes it owner-only; the folder's other files are not
        _write_json(tmp, "config.json", hf_config(m, tied, tok.eos_id, dtype))
        _write_json(tmp, "generation_config.json", {"bos_token_id": tok.eos_id, "eos_token_id": tok.eos_id,
                                                     "do_sample": False})
        shutil.copyfile(trained.tokenizer_path, os.path.join(tmp, "tokenizer.json"))
        _write_json(tmp, "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                    "eos_token": tok.eos_token, "bos_token": tok.eos_token,
                                                    "model_max_length": m.max_position, "add_bos_token": False})
    n = sum(int(v.size) for v in tensors.values())
    return {"output": output, "step": trained.step, "tensors": len(tensors), "values": n, "dtype": dtype,
            "tie_word_embeddings": tied, "vocab_size": m.vocab_size}


def _write_json(folder: str, name: str, obj: dict) -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m yxanul_jax.export", description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--output", required=True, help="new folder for the Hugging Face model")
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
