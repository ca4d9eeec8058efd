"""Muon's BF16 Newton-Schulz iterations at a config's real kernel shapes, in both forms of their GEMMs' products
(`training/muon.py`, `products_dtype`): float32 products rounded after (under FSDP, and on a CPU) and products the
GEMM writes in BF16 itself (a GPU without FSDP: cuBLASLt rounds in its epilogue). On a GPU this checks the claim
that the two round alike (an autotuned split-K algorithm could sum partials in BF16) and times each form's update.

    python scripts/muon_rounding_check.py [--config configs/yxanul_197m.yaml] [--layers N] [--iters 10]
                                          [--json-out F]

Inputs: a random momentum (normal, fixed seed) of every kernel Muon orthogonalizes in the config (its stacks of
layers; `--layers` cuts them for a quick run), through `muon.orthogonalize_by_shape` with `optim.muon_ns_dtype`
bfloat16 (and, timed only, float32). Compared: each element's BF16 result, as the distance in BF16 units in the last
place (`ulps`: 0 where the forms agree), the share of elements that differ and the relative Frobenius difference;
timed: the median of `--iters` jitted calls after two warm-ups. On a CPU both forms run, and differ: XLA's CPU BF16
dot is not the float32 product rounded (about one element in 8,000 an ulp apart per GEMM), and five iterations
spread such an ulp to most elements, by about BF16's own rounding (3.5 % relative, tiny.yaml, 2026-11-29). Only a
GPU's numbers say anything about the GPU.

Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def kernels(config: str, layers: int | None) -> dict:
    """{path: float32 normal array} for every kernel Muon orthogonalizes in `config`, stacks cut to `layers`."""
    from yxanul_jax.core.config import load_config
    from yxanul_jax.model.transformer import init_variables
    from yxanul_jax.training import optim

    cfg = load_config(config, [f"model.n_layers={layers}"] if layers else [])
    params = jax.eval_shape(lambda k: init_variables(cfg.model, cfg.fp8, k)["params"], jax.random.key(0))
    labels = jax.tree_util.tree_leaves(optim.muon_labels(params))
    leaves = [(jax.tree_util.keystr(p), x) for (p, x), lab in zip(jax.tree_util.tree_leaves_with_path(params), labels)
              if lab == "muon"]
    return {name: jax.random.normal(jax.random.fold_in(jax.random.key(1), i), x.shape, jnp.float32)
            for i, (name, x) in enumerate(leaves)}


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance between two BF16 arrays in units in the last place (the sign-magnitude bits as ordered integers)."""
    def ordered(x):
        bits = np.asarray(x, dtype=jnp.bfloat16).view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)
    return np.abs(ordered(a) - ordered(b))


def main(argv: list[str] | None = None) -> int:
    from yxanul_jax.training import muon

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/yxanul_197m.yaml")
    p.add_argument("--layers", type=int, default=None, help="cut the config to N layers (default: its own)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)

    tree = kernels(args.config, args.layers)
    coeffs = muon.scale_by_muon(0.95).init(tree).ns_coeffs  # the quintic's, as the optimizer's state holds them
    forms = {"float32 iterations": ("float32", jnp.float32), "float32 products": ("bfloat16", jnp.float32),
             "bf16 products": ("bfloat16", None)}
    out, times = {}, {}
    for name, (dtype, products) in forms.items():
        fn = jax.jit(lambda t, dtype=dtype, products=products: muon.orthogonalize_by_shape(t, coeffs, dtype=dtype,
                                                                                          products=products))
        for _ in range(2):
            jax.block_until_ready(fn(tree))
        runs = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(tree))
            runs.append(time.perf_counter() - t0)
        out[name], times[name] = jax.device_get(fn(tree)), 1e3 * statistics.median(runs)

    ref, got = out["float32 products"], out["bf16 products"]
    distance = np.concatenate([ulps(got[k], ref[k]).ravel() for k in tree])
    frob = float(np.sqrt(sum(np.sum((np.asarray(got[k], np.float64) - ref[k]) ** 2) for k in tree))
                 / np.sqrt(sum(np.sum(np.asarray(ref[k], np.float64) ** 2) for k in tree)))
    device = jax.devices()[0]
    row = {"config": args.config, "layers": args.layers, "kernels": len(tree),
           "elements": int(distance.size), "device": device.device_kind, "platform": device.platform,
           "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
           "ms": {k: round(v, 3) for k, v in times.items()},
           "differ_share": float(np.mean(distance > 0)), "max_ulps": int(distance.max()),
           "relative_frobenius": frob}
    print(f"{'form':<18} {'ms per update':>14}")
    for name, ms in times.items():
        print(f"{name:<18} {ms:>14.3f}")
    print(f"{row['elements']:,} elements of {row['kernels']} kernels on {row['device']}: "
          f"{100 * row['differ_share']:.4f} % differ, at most {row['max_ulps']} BF16 ulps; "
          f"relative Frobenius {frob:.2e}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(row, fh, indent=1)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
