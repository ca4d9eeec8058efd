"""`python -m yxanul_jax.generate`: sample text from a trained model with a KV cache.

    python -m yxanul_jax.generate --run-dir runs/tiny --prompt "def parse(" [--prompt ...]
        [--prompt-file F] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
        [--seed 0] [--num-samples 1] [--disable-fp8] [--json]

Prompts of different lengths are decoded together as one batch; a row stops at the tokenizer's EOS.
`--temperature 0` is greedy; otherwise top-k, then top-p (nucleus) filtering, then sampling (how, and the
defaults `--help` prints: `yxanul_jax/inference/sampling.py`). Prints each sample, then prefill and decode
tokens/s measured after compilation (compile time reported apart); `--json` adds one JSON line with those numbers.
"""
from __future__ import annotations

import json
import sys

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, Ranged, cli_entry, user_path
from yxanul_jax.core.config import FP8Config, MAX_SEED
from yxanul_jax.core.errors import UserError
from yxanul_jax.inference import sampling


def _prompts(args) -> list[str]:
    """The prompts of --prompt and --prompt-file, each checked before the checkpoint is read."""
    prompts = list(args.prompt or [])
    for text in prompts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # the shell passed bytes that are not UTF-8 (Python keeps them as surrogates)
            raise UserError("--prompt holds bytes that are not UTF-8 text; pass UTF-8 text, or --prompt-file "
                            "FILE") from None
    for path in args.prompt_file or []:
        try:
            with open(path, encoding="utf-8-sig") as fh:  # an editor's byte-order mark is no part of the prompt
                prompts.append(fh.read())
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--prompt-file '{path}' cannot be read ({type(e).__name__}); pass a UTF-8 text file")
        if not prompts[-1]:
            raise UserError(f"--prompt-file '{path}' is empty; put the prompt's text in it")
    if not prompts:
        raise UserError("give a prompt: --prompt TEXT (repeatable) or --prompt-file FILE")
    return prompts


def speed_report(result: dict, batch: int) -> dict:
    """The speed line of a `sampling.generate` result, and its numbers for --json: prefill and decode
    tokens/s over running time only, compilation timed apart (`tokens_per_sec` is the decode rate)."""
    prefill = result["prompt_tokens"] / max(result["prefill_s"], 1e-9)
    decode = result["new_tokens"] / max(result["decode_s"], 1e-9)
    line = (f"prefill {result['prompt_tokens']} prompt tokens in {result['prefill_s']:.3f} s ({prefill:,.0f} "
            f"tokens/s); decode {result['new_tokens']} tokens in {result['decode_s']:.2f} s ({decode:,.0f} tokens/s, "
            f"batch {batch}); compile {result['compile_s']:.2f} s before them, not counted")
    numbers = {"prompt_tokens": result["prompt_tokens"], "new_tokens": result["new_tokens"],
               "prefill_s": result["prefill_s"], "decode_s": result["decode_s"], "compile_s": result["compile_s"],
               "prefill_tokens_per_sec": prefill, "decode_tokens_per_sec": decode, "tokens_per_sec": decode}
    return {"line": line, "numbers": numbers}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    from yxanul_jax.inference.trained import add_source_args, load_trained  # deferred: generate() needs no checkpoint code

    p = ArgumentParser(prog="python -m yxanul_jax.generate", description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable: decoded as one batch)")
    p.add_argument("--prompt-file", action="append", type=user_path,
                   help="a file whose whole text is one prompt (repeatable)")
    p.add_argument("--max-new-tokens", type=Ranged(int, 1), default=sampling.MAX_NEW_TOKENS,
                   help="default %(default)s")
    p.add_argument("--temperature", type=Ranged(float, 0), default=sampling.TEMPERATURE,
                   help="0 for greedy decoding; default %(default)s")
    p.add_argument("--top-k", type=Ranged(int, 0), default=sampling.TOP_K,
                   help="0 keeps every token; default %(default)s")
    p.add_argument("--top-p", type=Ranged(float, 0, 1, lo_open=True), default=sampling.TOP_P,
                   help="nucleus mass; 1 keeps every token; default %(default)s")
    p.add_argument("--seed", type=Ranged(int, 0, MAX_SEED), default=0)
    p.add_argument("--num-samples", type=Ranged(int, 1), default=1, help="samples per prompt")
    p.add_argument("--disable-fp8", action="store_true", help="decode with BF16 GEMMs even if the model trained in FP8")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_args(argv)
    texts = _prompts(args)
    trained = load_trained(args.run_dir, args.checkpoint)
    tok = trained.tokenizer()
    fp8 = trained.cfg.fp8
    variables = trained.variables
    if args.disable_fp8:
        fp8, variables = FP8Config(enabled=False), {"params": trained.params}
    prompts = [tok.encode(t) for t in texts for _ in range(args.num_samples)]
    result = sampling.generate(trained.cfg.model, fp8, variables, prompts, args.max_new_tokens,
                               temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                               eos_id=tok.eos_id)
    samples = []
    for i, new in enumerate(result["tokens"]):
        text = tok.tokenizer.decode([t for t in new if t != tok.eos_id])
        samples.append({"prompt": texts[i // args.num_samples], "completion": text, "tokens": len(new)})
        console.info(f"--- sample {i + 1} (step {trained.step}) ---\n{samples[-1]['prompt']}{text}")
    report = speed_report(result, len(prompts))
    console.info(report["line"])
    if args.json:
        console.info(json.dumps({"step": trained.step, "samples": samples, **report["numbers"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
