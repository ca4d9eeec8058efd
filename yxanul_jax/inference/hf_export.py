"""A trained model written as a Hugging Face Llama folder (the `export` command's work, and `evaluate`'s)."""
from __future__ import annotations

import json
import os

from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import check_new_output, staged_dir
from yxanul_jax.inference import sampling
from yxanul_jax.inference.trained import Trained
from yxanul_jax.model.hf import hf_config, to_hf

DTYPES = ("bfloat16", "float32")


def export(trained: Trained, output: str, dtype: str = "bfloat16") -> dict:
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
        _write_json(tmp, "generation_config.json", generation_config(tok.eos_id))
        with open(trained.tokenizer_path, encoding="utf-8") as fh:
            text = fh.read()
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as fh:
            fh.write(as_trained(text))
        _write_json(tmp, "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                    "eos_token": tok.eos_token, "bos_token": tok.eos_token,
                                                    "model_max_length": m.max_position, "add_bos_token": False})
    n = sum(int(v.size) for v in tensors.values())
    return {"output": output, "step": trained.step, "tensors": len(tensors), "values": n, "dtype": dtype,
            "tie_word_embeddings": tied, "vocab_size": m.vocab_size}


ADDING_PROCESSORS = ("TemplateProcessing", "BertProcessing", "RobertaProcessing")
"""tokenizers' post-processors that add special tokens (a BOS, [CLS] ... [SEP]) around every encoded text."""


def as_trained(tokenizer_json: str) -> str:
    """The tokenizer.json text that encodes as the training data was encoded (`add_special_tokens=False`): without
    a post-processor that adds special tokens, which `transformers` would apply to every prompt (a BOS the model
    never saw at the start). Returned unchanged when there is none."""
    data = json.loads(tokenizer_json)
    post = data.get("post_processor")
    if not isinstance(post, dict):
        return tokenizer_json
    if post.get("type") in ADDING_PROCESSORS:
        data["post_processor"] = None
    elif post.get("type") == "Sequence" and any(p.get("type") in ADDING_PROCESSORS for p in post["processors"]):
        kept = [p for p in post["processors"] if p.get("type") not in ADDING_PROCESSORS]
        data["post_processor"] = {**post, "processors": kept} if kept else None
    else:
        return tokenizer_json
    return json.dumps(data, ensure_ascii=False)


def generation_config(eos_id: int) -> dict:
    """`generation_config.json`: what `transformers`' `generate` and pipelines do with the export unless told
    otherwise. It samples as our `generate` command does by default (`sampling.TEMPERATURE` and the rest): greedy
    decoding sends a small model into a loop of one token, which reads as a broken export. No length: a
    `max_new_tokens` here would override every caller's `max_length` (lm-eval's generation tasks, through `evaluate`,
    would stop at it). The tokenizer has no BOS (`add_bos_token: false`); its EOS separates documents, so it also
    stands for BOS and padding."""
    return {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": True,
            "temperature": sampling.TEMPERATURE, "top_k": sampling.TOP_K, "top_p": sampling.TOP_P}


def _write_json(folder: str, name: str, obj: dict) -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
