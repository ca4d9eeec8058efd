"""Sampling from a Yxanul model with a KV cache: logit filtering (temperature, top-k, top-p) and `generate`.

Decoding uses the training model's own code (`Yxanul.decode`): one prefill of every prompt, then
one step per generated token, both compiled ahead of time (and timed apart from running them); the
cache holds keys and values of the kv heads only. Prompts of different lengths are decoded together
(each row at its own positions). A row stops at the tokenizer's EOS. `temperature=0` is greedy;
otherwise top-k, then top-p (nucleus) filtering, then sampling. The `generate` command
(`yxanul_jax/generate.py`) and the end-of-run sample call it.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.core.config import FP8Config, ModelConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model import fp8 as fp8_lib
from yxanul_jax.model.transformer import DTYPES, Yxanul, init_cache


# What a sample is drawn with unless asked otherwise: the `generate` command's defaults, the end-of-run sample's, and
# (all but the length) the `generation_config.json` an export writes, so `transformers` samples as we do.
TEMPERATURE = 0.8
TOP_K = 50
TOP_P = 0.95
MAX_NEW_TOKENS = 64


def describe(temperature: float = TEMPERATURE, top_k: int = TOP_K, top_p: float = TOP_P) -> str:
    """How tokens are drawn, in words ("temperature 0.8, top-k 50, top-p 0.95"; "greedy")."""
    if temperature <= 0:
        return "greedy"
    return ", ".join([f"temperature {temperature:g}", *([f"top-k {top_k}"] if top_k else []),
                      *([f"top-p {top_p:g}"] if top_p < 1 else [])])


def filter_logits(logits_BxV: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Logits scaled by 1/temperature with everything outside the top-k and the top-p mass at -inf. Each row's
    largest logit is subtracted first (the same distribution): a tiny temperature then leaves the top logit at 0 and
    the rest far below, nearly greedy, where dividing as they are overflowed every positive logit to +inf."""
    logits_BxV = logits_BxV.astype(jnp.float32)
    logits_BxV = (logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True)) / temperature
    V = logits_BxV.shape[-1]
    if 0 < top_k < V:
        kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
        logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
    if top_p < 1.0:
        sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
        cum_BxV = jnp.cumsum(jax.nn.softmax(sorted_BxV, axis=-1), axis=-1)
        # keep the smallest prefix whose mass reaches top_p (always at least the most likely token)
        cutoff_idx_B = jnp.minimum(jnp.sum(cum_BxV < top_p, axis=-1), V - 1)
        cutoff_Bx1 = jnp.take_along_axis(sorted_BxV, cutoff_idx_B[:, None], axis=-1)
        logits_BxV = jnp.where(logits_BxV < cutoff_Bx1, -jnp.inf, logits_BxV)
    return logits_BxV


@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p"))
def sample(logits_BxV: jax.Array, key: jax.Array, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0) -> jax.Array:
    """Next token per row: argmax when temperature is 0, else a draw from the filtered distribution."""
    if temperature <= 0:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, filter_logits(logits_BxV, temperature, top_k, top_p)).astype(jnp.int32)


class _Programs:
    """The jitted prefill, one-token step and sampler of one model config, and their executables compiled
    ahead of time per argument shapes, kept across `generate` calls: sampling again at shapes seen before
    (an evaluation loop, the next prompt) compiles nothing, and `generate` times compilation apart from
    decoding."""

    def __init__(self, model_cfg: ModelConfig, fp8: FP8Config):
        # an FP8 model decodes in the form its train step would take here, compiled with what that form needs
        fp8 = dataclasses.replace(fp8, gemm_form=fp8_lib.gemm_form(fp8))
        self.xla_options = fp8_lib.required_xla_options(fp8) or None
        model = Yxanul(model_cfg, fp8)

        def prefill(v, tokens_BxP, positions_BxP, cache, last_B):
            logits_BxPxV, cache = model.apply(v, tokens_BxP, positions_BxP, cache, method=Yxanul.decode)
            return logits_BxPxV[jnp.arange(tokens_BxP.shape[0]), last_B], cache  # each row's last prompt token

        def step(v, tokens_Bx1, positions_Bx1, cache):
            logits_Bx1xV, cache = model.apply(v, tokens_Bx1, positions_Bx1, cache, method=Yxanul.decode)
            return logits_Bx1xV[:, 0], cache

        def next_token(logits_BxV, key, temperature, top_k, top_p):
            key, sub = jax.random.split(key)
            return sample(logits_BxV, sub, temperature=temperature, top_k=top_k, top_p=top_p), key

        self.prefill, self.step = jax.jit(prefill), jax.jit(step)
        self.next_token = jax.jit(next_token, static_argnames=("temperature", "top_k", "top_p"))
        self.executables: dict = {}

    def compiled(self, fn, *args, **static):
        """`fn` lowered and compiled for the shapes and dtypes of `args` (arrays or ShapeDtypeStructs), once."""
        leaves, tree = jax.tree.flatten(args)
        key = (fn, tree, tuple((tuple(a.shape), str(a.dtype)) for a in leaves), tuple(sorted(static.items())))
        if key not in self.executables:
            if len(self.executables) >= 64:  # many prompt lengths: keep memory bounded
                self.executables.clear()
            self.executables[key] = fn.lower(*args, **static).compile(compiler_options=self.xla_options)
        return self.executables[key]


@functools.lru_cache(maxsize=8)
def _programs(model_cfg: ModelConfig, fp8: FP8Config) -> _Programs:
    return _Programs(model_cfg, fp8)


def generate(model_cfg: ModelConfig, fp8: FP8Config, variables: dict, prompts: list[list[int]],
             max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, eos_id: int | None = None, should_stop: Callable[[], bool] | None = None) -> dict:
    """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

    Returns {"tokens": one list of new token ids per prompt (up to and including EOS), "prompt_tokens",
    "new_tokens", "compile_s", "prefill_s", "decode_s", "stopped"}. The prefill, the one-token step and the
    sampler are compiled first (`compile_s`; 0 for shapes compiled before), so `prefill_s` and `decode_s`
    time running them only. `should_stop()`, asked after the prefill and before each token, ends the
    decoding early ("stopped": True; a compile under way finishes first). Raises UserError for an empty
    prompt, or when prompt plus new tokens exceed model.max_position.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("a prompt is empty; give at least one token of text")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens (--max-new-tokens) must be >= 1, got {max_new_tokens}")
    longest = max(len(p) for p in prompts)
    total = longest + max_new_tokens
    if total > model_cfg.max_position:
        raise UserError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = {total} exceeds the "
                        f"model's max_position ({model_cfg.max_position}); shorten the prompt or generate fewer tokens")
    if not 0 < top_p <= 1 or top_k < 0 or temperature < 0:
        raise UserError(f"need temperature >= 0, top_k >= 0 and 0 < top_p <= 1 (--temperature, --top-k, --top-p); "
                        f"got {temperature}, {top_k}, {top_p}")
    programs = _programs(model_cfg, fp8)
    B = len(prompts)
    lengths_B = np.array([len(p) for p in prompts], np.int32)
    tokens_BxP = np.zeros((B, longest), np.int32)
    for i, p in enumerate(prompts):
        tokens_BxP[i, :len(p)] = p
    positions_BxP = np.broadcast_to(np.arange(longest, dtype=np.int32), (B, longest))
    variables = jax.device_put(variables)  # once, not with every step
    cache = init_cache(model_cfg, B, total, DTYPES[model_cfg.dtype])
    key = jax.random.key(seed)
    jax.block_until_ready((variables, cache, key))  # neither transfer is timed as prefill
    static = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}

    start = time.perf_counter()
    one_BxI = jax.ShapeDtypeStruct((B, 1), jnp.int32)
    prefill = programs.compiled(programs.prefill, variables, tokens_BxP, positions_BxP, cache, lengths_B)
    step = programs.compiled(programs.step, variables, one_BxI, one_BxI, cache)
    next_token = programs.compiled(programs.next_token, jax.ShapeDtypeStruct((B, model_cfg.vocab_size), jnp.float32),
                                   key, **static)
    compile_s = time.perf_counter() - start

    # the host's arrays moved with device_put: jnp.asarray stages each new shape through a small program that
    # compiles on first use (jax 0.10: `lax.stage`), which would land in the timed prefill and decode
    inputs = jax.block_until_ready(jax.device_put((tokens_BxP, positions_BxP, lengths_B - 1)))
    start = time.perf_counter()
    logits_BxV, cache = prefill(variables, *inputs[:2], cache, inputs[2])
    logits_BxV.block_until_ready()
    prefill_s = time.perf_counter() - start

    start = time.perf_counter()
    out = [[] for _ in range(B)]
    done = np.zeros(B, bool)
    stopped = False
    for i in range(max_new_tokens):
        if should_stop is not None and should_stop():
            stopped = True
            break
        next_B, key = next_token(logits_BxV, key)
        next_B = np.asarray(next_B)
        for b in range(B):
            if not done[b]:
                out[b].append(int(next_B[b]))
                done[b] = eos_id is not None and int(next_B[b]) == eos_id
        if done.all() or i + 1 == max_new_tokens:
            break
        logits_BxV, cache = step(variables, *jax.device_put((next_B[:, None], (lengths_B + i)[:, None])), cache)
    decode_s = time.perf_counter() - start
    return {"tokens": out, "prompt_tokens": int(lengths_B.sum()), "new_tokens": sum(len(o) for o in out),
            "compile_s": compile_s, "prefill_s": prefill_s, "decode_s": decode_s, "stopped": stopped}
