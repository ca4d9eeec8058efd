"""The `yxanul` console script: `yxanul <command> ...` runs `python -m yxanul_jax.<command> ...`."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "plan": "parameter breakdown and memory plan of a config",
    "train": "train (or --eval-only) a model",
    "tokenizer": "train a BPE tokenizer or measure characters per token",
    "prepare": "tokenize a corpus into shards with a manifest",
    "analyze": "cost, memory and GEMM analysis of a compiled train step, here or for an H100 (--target)",
    "generate": "sample text from a trained model (KV cache)",
    "export": "write a trained model as a Hugging Face Llama folder",
    "evaluate": "downstream evaluation of a trained model with lm-eval-harness (the lm-eval extra)",
    "plot": "training / validation loss, tokens/s and lr of runs against tokens, in one PNG",
    "config": "every config key with its type, default, current value and doc (config show)",
}

# `inspect` shadowed the standard library's module when a file of the package ran as a script.
RENAMED = {"inspect": "analyze"}


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `yxanul` command itself: its subcommands are called with their arguments
        from yxanul_jax.core.args import command_stderr

        command_stderr()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: yxanul <command> [args]\n\ncommands:")
        for name, text in COMMANDS.items():
            print(f"  {name:<10} {text}")
        if not argv:  # a mistake like any other: its one error line on stderr, exit 2
            print("error: no command given; run 'yxanul <command> ...' with one of the commands above", file=sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name in RENAMED:
        print(f"error: command '{name}' is now '{RENAMED[name]}'; run 'yxanul {RENAMED[name]} ...'", file=sys.stderr)
        return 2
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"error: unknown command '{name}'{hint}; run 'yxanul --help'", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"yxanul_jax.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"yxanul_jax.{name}":
            print(f"error: command '{name}' is not available in this version", file=sys.stderr)
            return 2
        raise
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
