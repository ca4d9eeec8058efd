"""The Hugging Face Llama layout of a Yxanul model: parameters and config, both directions.

Our model is a Llama in all but the factorized embedding, which maps exactly: the input table is
E·P (vocab x d_model, the product of the vocab x r table and the r x d projection), and with
`head: tied` the logits h·Pᵀ·Eᵀ = h·(E·P)ᵀ make that same table the tied output head. A `factorized`
head exports its own lm_head = E·head_projᵀ, an `untied` head its kernel. Padded vocabulary rows
(`model.vocab_pad_to`) are dropped. RoPE pairs channels (i, i + K/2) as Llama's `rotate_half` does,
RMSNorm computes in float32 as Llama's does, and no projection has a bias.

`to_hf(model_cfg, params)` -> (tie_word_embeddings, {Llama name: float32 array}), with `hf_config(model_cfg,
tied, eos_id, dtype)` its config.json (`inference.hf_export` writes both); `from_hf(model_cfg, tensors, like)`
-> our parameter tree shaped like `like`, for `init.from_hf` (full embedding, `model.embed_rank: 0`;
`read_hf(folder)` reads a folder's config and tensors).
"""
from __future__ import annotations

import numpy as np

from yxanul_jax.core.config import ModelConfig
from yxanul_jax.core.errors import UserError
from yxanul_jax.model.transformer import STACKED

# our (module, projection) -> Llama's names inside model.layers.{i}
PROJECTIONS = {("attn", "q"): "self_attn.q_proj", ("attn", "k"): "self_attn.k_proj", ("attn", "v"): "self_attn.v_proj",
               ("attn", "o"): "self_attn.o_proj", ("mlp", "gate"): "mlp.gate_proj", ("mlp", "up"): "mlp.up_proj",
               ("mlp", "down"): "mlp.down_proj"}
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def hf_config(m: ModelConfig, tied: bool, eos_id: int | None, dtype: str) -> dict:
    """config.json of the equivalent LlamaForCausalLM."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.ffn_dim,
        "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads, "num_key_value_heads": m.n_kv_heads,
        "head_dim": m.resolved_head_dim, "hidden_act": "silu", "max_position_embeddings": m.max_position,
        "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "rope_parameters": {"rope_theta": m.rope_theta, "rope_type": "default"},  # transformers >= 5 reads this
        "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "initializer_range": m.init_std, "tie_word_embeddings": tied, "torch_dtype": dtype, "dtype": dtype,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "use_cache": True,
    }


def _layer(params: dict, m: ModelConfig, i: int) -> dict:
    if m.scan_layers:
        return {k: _index(v, i) for k, v in params[STACKED].items()}
    return params[f"layer_{i}"]


def _index(tree, i):
    if isinstance(tree, dict):
        return {k: _index(v, i) for k, v in tree.items()}
    return tree[i]


def to_hf(m: ModelConfig, params: dict) -> tuple[bool, dict[str, np.ndarray]]:
    """(tie_word_embeddings, {Llama tensor name: float32 array}) of our parameters."""
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    V = m.vocab_size
    table_VxR = f32(params["embedding"])[:V]
    embed_VxD = table_VxR @ f32(params["embed_proj"]) if m.embed_rank else table_VxR
    out = {"model.embed_tokens.weight": embed_VxD, "model.norm.weight": f32(params["final_norm"]["scale"])}
    for i in range(m.n_layers):
        layer = _layer(params, m, i)
        for (block, proj), name in PROJECTIONS.items():
            out[f"model.layers.{i}.{name}.weight"] = f32(layer[block][proj]["kernel"]).T  # [in, out] -> [out, in]
        for ours, theirs in NORMS.items():
            out[f"model.layers.{i}.{theirs}.weight"] = f32(layer[ours]["scale"])
    tied = m.head == "tied"
    if m.head == "factorized":
        out["lm_head.weight"] = table_VxR @ f32(params["head_proj"]).T  # logits = h·head_proj·Eᵀ
    elif m.head == "untied":
        out["lm_head.weight"] = f32(params["head_kernel"])[:, :V].T
    return tied, {k: np.ascontiguousarray(v) for k, v in out.items()}


def read_hf(folder: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, {tensor name: float32 array}) of a Hugging Face folder (one or several
    .safetensors files)."""
    import glob
    import os

    from safetensors.flax import load_file

    config = read_hf_config(folder)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise UserError(f"init.from_hf: '{folder}' has no .safetensors weights (PyTorch .bin files are not read); "
                        "save the model with safe_serialization=True")
    tensors = {}
    for path in files:
        try:
            tensors.update({k: np.asarray(v, np.float32) for k, v in load_file(path).items()})
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file
            raise UserError(f"init.from_hf: '{path}' is not a readable safetensors file ({type(e).__name__})")
    return config, tensors


def resolve_init(cfg):
    """`cfg` with the model sizes of `init.from_hf`'s config.json (unchanged when it is empty). One note names every
    model field this changes, from the value the config gave it (a YAML file's, an override's or the default) to
    the checkpoint's, so a size asked for on the command line is never dropped silently."""
    import dataclasses

    from yxanul_jax.core import console
    from yxanul_jax.core.config import validate

    if not cfg.init.from_hf:
        return cfg
    config = read_hf_config(cfg.init.from_hf)
    model = model_config_from_hf(config, cfg.model)
    replaced = [f"model.{f.name} {getattr(cfg.model, f.name)!r} -> {getattr(model, f.name)!r}"
                for f in dataclasses.fields(model) if getattr(cfg.model, f.name) != getattr(model, f.name)]
    if replaced:
        console.note(f"init.from_hf: the model's sizes are those of '{cfg.init.from_hf}': {', '.join(replaced)}")
    return validate(dataclasses.replace(cfg, model=model))


def read_hf_config(folder: str) -> dict:
    """The config.json of a Hugging Face model folder (UserError when missing or not JSON)."""
    import json
    import os

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise UserError(f"init.from_hf: '{folder}' has no config.json; pass a Hugging Face model folder")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise UserError(f"init.from_hf: '{path}' is not readable JSON ({type(e).__name__})")


def model_config_from_hf(config: dict, base: ModelConfig) -> ModelConfig:
    """`base` with the sizes of a Llama config.json (full embedding, head tied or untied as saved).
    UserError when the checkpoint is not Llama-compatible."""
    import dataclasses

    arch = config.get("architectures") or []
    if config.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
        raise UserError(f"init.from_hf: the checkpoint is {config.get('model_type') or arch or 'unknown'}, not a Llama "
                        "(LlamaForCausalLM); only Llama-architecture checkpoints can start a run")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if config.get(key, want) != want:
            raise UserError(f"init.from_hf: config.json has {key}={config.get(key)!r}; yxanul models need {want!r}")
    scaling = config.get("rope_scaling")
    rope = config.get("rope_parameters") or {}
    if scaling or rope.get("rope_type", "default") != "default":
        raise UserError("init.from_hf: the checkpoint uses scaled RoPE (rope_scaling / rope_type); yxanul models "
                        "use plain RoPE")
    try:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        return dataclasses.replace(
            base, vocab_size=int(config["vocab_size"]), d_model=int(config["hidden_size"]),
            n_layers=int(config["num_hidden_layers"]), n_heads=heads,
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=0 if head_dim == int(config["hidden_size"]) // heads else head_dim,  # 0: d_model // n_heads
            ffn_dim=int(config["intermediate_size"]), embed_rank=0,
            head="tied" if config.get("tie_word_embeddings", False) else "untied",
            norm_eps=float(config.get("rms_norm_eps", base.norm_eps)),
            rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or base.rope_theta),
            max_position=int(config.get("max_position_embeddings", base.max_position)))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"init.from_hf: config.json lacks or garbles {e}; pass a Llama checkpoint folder")


def from_hf(m: ModelConfig, tensors: dict[str, np.ndarray], like: dict) -> dict:
    """Our parameter tree (shaped like `like`, padded rows zero) from Llama tensors."""
    import jax

    def need(name):
        if name not in tensors:
            raise UserError(f"init.from_hf: model.safetensors has no '{name}'; pass a LlamaForCausalLM checkpoint")
        return np.asarray(tensors[name], np.float32)

    V, Vp = m.vocab_size, m.padded_vocab
    pad = lambda a: np.concatenate([a, np.zeros((Vp - V, *a.shape[1:]), a.dtype)]) if Vp > V else a  # noqa: E731
    params = jax.tree_util.tree_map(lambda a: np.zeros(a.shape, np.float32), like)
    params["embedding"] = pad(need("model.embed_tokens.weight"))
    params["final_norm"]["scale"] = need("model.norm.weight")
    if m.head == "untied":
        params["head_kernel"] = pad(need("lm_head.weight")).T
    for i in range(m.n_layers):
        for (block, proj), name in PROJECTIONS.items():
            _set_layer(params, m, i, (block, proj, "kernel"), need(f"model.layers.{i}.{name}.weight").T)
        for ours, theirs in NORMS.items():
            _set_layer(params, m, i, (ours, "scale"), need(f"model.layers.{i}.{theirs}.weight"))
    for path, leaf in jax.tree_util.tree_leaves_with_path(like):
        got = _get(params, [getattr(k, "key", k) for k in path])
        if got.shape != tuple(leaf.shape):
            raise UserError(f"init.from_hf: '{jax.tree_util.keystr(path)}' is {list(got.shape)} from the checkpoint "
                            f"but the model needs {list(leaf.shape)}")
    return params


def _get(tree, keys):
    for k in keys:
        tree = tree[k]
    return tree


def _set_layer(params: dict, m: ModelConfig, i: int, keys: tuple, value: np.ndarray) -> None:
    node = params[STACKED] if m.scan_layers else params[f"layer_{i}"]
    for k in keys[:-1]:
        node = node[k]
    if m.scan_layers:
        node[keys[-1]][i] = value
    else:
        node[keys[-1]] = value
