"""One FP8 projection (forward + both gradients) in each way its product can reach BF16, under XLA compiler
options: which kernels the compiled GEMM becomes, and how long it takes, beside the BF16 projection.

    python scripts/fp8_gemm_probe.py [--tokens 131072] [--shapes 768x2048 2048x768] [--iters 20]
        [--forms f32 direct dequant] [--options default no_triton_gemm no_cublas_fallback] [--json-out F]

Why: the yxanul-197m stage-9 FP8 step on an H200 (JAX 0.11.2, 2026-11-26) spent 53 ms per step in one
standalone convert kernel (140 launches) next to cuBLASLt FP8 GEMMs that wrote float32 (`nvjet_..._qqsss`),
while the CPU's sm_90 compile (JAX 0.10, no autotuning) fused the scale and the cast into Triton GEMMs.

Each cell: x [tokens, I] BF16 and a float32 kernel [I, O] through `model.fp8.fp8_dot` with
`Fp8Spec.gemm_form` = the form (`fp8.GEMM_FORMS`), delayed scaling, consumer `sum(y^2)` (so the backward
has an E5M2 gradient); `bf16` is the plain BF16 projection. Compiled with the option set's XLA options
(`.compile(compiler_options=...)`), then the median of `--iters` calls after 2 warm-ups. Reported per
cell: ms, the kernels of the optimized HLO (`analysis.perf.kernels`: name, kind, result type), how many
are GEMMs and how many are not, and the largest relative difference of y, dx and dw from the `f32` form
under the same options (|a - b| / |b|, norms; the forms round differently: <= 2e-2 expected).
Needs a GPU for meaning; on a CPU it runs (small --tokens) as a test of the script. Prints a table and one
JSON line.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fused_ce_check import median_s, rel_err  # noqa: E402  (one timer, one error measure)

from yxanul_jax.core.config import TRITON_GEMM_OPTION  # noqa: E402

OPTION_SETS = {
    "default": {},
    "no_triton_gemm": {TRITON_GEMM_OPTION: False},
    "no_cublas_fallback": {"xla_gpu_cublas_fallback": False},
}
FORMS_AGREE = 2e-2


def _shape(text: str) -> tuple[int, int]:
    try:
        i, o = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape '{text}' is not IxO (e.g. 768x2048)")
    if i < 1 or o < 1:
        raise argparse.ArgumentTypeError(f"shape '{text}' needs positive sizes")
    return i, o


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return v


def kernel_list(hlo_text: str) -> list[dict]:
    """Every kernel launch site of the optimized HLO: name, op, kind (fusion kind or custom-call target),
    result type, precision of its GEMM (None for other kernels)."""
    from yxanul_jax.analysis import perf

    return [{"name": k.name, "op": k.op, "kind": k.kind, "precision": k.precision, "category": k.category,
             "mbytes": round(k.bytes / 1e6, 2)} for k in perf.kernels(hlo_text)]


def cell(T: int, I: int, O: int, form: str, options: dict, iters: int, seed: int = 0) -> tuple[dict, tuple]:
    """(row, outputs) of one form ("bf16" or an `fp8.GEMM_FORMS` form) under one option set."""
    import jax
    import jax.numpy as jnp

    from yxanul_jax.model import fp8

    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (T, I), jnp.bfloat16)
    w = (jax.random.normal(kw, (I, O), jnp.float32) * I ** -0.5)
    meta = {op: fp8.init_meta(16) for op in fp8.OPERANDS}
    # a delayed scale that fits these tensors (what a trained state holds), so every form quantizes alike
    meta["input"]["scale"] = jnp.float32(4.5 / fp8.fp8_max(fp8.E4M3))
    meta["kernel"]["scale"] = jnp.float32(float(jnp.max(jnp.abs(w))) / fp8.fp8_max(fp8.E4M3))
    meta["grad"]["scale"] = jnp.float32(2.0 * 4.5 * 4.5 / fp8.fp8_max(fp8.E5M2))

    if form == "bf16":
        def loss(x, w, meta):
            y = jnp.dot(x, w.astype(jnp.bfloat16))
            return jnp.sum(jnp.square(y.astype(jnp.float32))), y
    else:
        spec = fp8.Fp8Spec(compute_dtype=jnp.bfloat16, gemm_form=form)

        def loss(x, w, meta):
            y = fp8.fp8_dot(x, w, meta["input"], meta["kernel"], meta["grad"], spec)
            return jnp.sum(jnp.square(y.astype(jnp.float32))), y

    def step(x, w, meta):
        (_, y), (dx, dw, _) = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, w, meta)
        return y, dx, dw

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(x, w, meta).compile(compiler_options=options or None)
    compile_s = time.perf_counter() - t0
    ks = kernel_list(compiled.as_text())
    row = {"form": form, "compile_s": round(compile_s, 2), "ms": 1e3 * median_s(compiled, (x, w, meta), iters),
           "kernels": ks, "gemm_kernels": sum(1 for k in ks if k["precision"]),
           "other_kernels": sum(1 for k in ks if not k["precision"])}
    return row, compiled(x, w, meta)


def _line(r: dict) -> str:
    ms = f"{r['ms']:.3f} ms" if r["ms"] is not None else r.get("error", "failed")
    kernels = f", {r['gemm_kernels']} GEMM + {r['other_kernels']} other kernels" if "gemm_kernels" in r else ""
    return f"{r['in']}x{r['out']} {r['options']} {r['form']}: {ms}{kernels}"


def probe(T: int, shapes, forms, option_names, iters: int, report=None) -> list[dict]:
    """Every (shape, option set, form) cell, BF16 first in each; `report(row)` is called as each one ends (each
    compile autotunes on a GPU: a cut-short run still says what it measured)."""
    rows = []
    for I, O in shapes:
        for opt in option_names:
            ref = None
            for form in ["bf16"] + [f for f in forms if f != "bf16"]:
                base = {"tokens": T, "in": I, "out": O, "options": opt}
                try:
                    row, outs = cell(T, I, O, form, OPTION_SETS[opt], iters)
                except Exception as e:  # an option this XLA does not know, a form it cannot compile: recorded
                    rows.append({**base, "form": form, "ms": None,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
                    if report:
                        report(rows[-1])
                    continue
                if form == "f32":
                    ref = outs
                elif form != "bf16" and ref is not None:
                    row["rel_diff_vs_f32"] = max(rel_err(a, b) for a, b in zip(outs, ref))
                    row["agree"] = row["rel_diff_vs_f32"] <= FORMS_AGREE
                rows.append({**base, **row})
                if report:
                    report(rows[-1])
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| I x O | options | form | ms | vs bf16 | GEMM kernels | other kernels | rel diff vs f32 |",
             "|---|---|---|---|---|---|---|---|"]
    bf16 = {(r["in"], r["out"], r["options"]): r["ms"] for r in rows if r["form"] == "bf16"}
    for r in rows:
        b = bf16.get((r["in"], r["out"], r["options"]))
        ms = f"{r['ms']:.3f}" if r["ms"] is not None else r.get("error", "failed")
        vs = f"{r['ms'] / b:.2f}x" if r["ms"] and b else ""
        diff = f"{r['rel_diff_vs_f32']:.1e}" if "rel_diff_vs_f32" in r else ""
        lines.append(f"| {r['in']}x{r['out']} | {r['options']} | {r['form']} | {ms} | {vs} | "
                     f"{r.get('gemm_kernels', '')} | {r.get('other_kernels', '')} | {diff} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=_positive, default=131072, help="rows of x (stage 9: 64 x 2048)")
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(768, 2048), (2048, 768)], metavar="IxO")
    p.add_argument("--iters", type=_positive, default=20)
    p.add_argument("--forms", nargs="+", default=["f32", "direct", "dequant"], choices=["f32", "direct", "dequant"])
    p.add_argument("--options", nargs="+", default=list(OPTION_SETS), choices=list(OPTION_SETS))
    p.add_argument("--json-out", default=None, help="also write the rows (kernel lists included) here")
    args = p.parse_args(argv)

    import jax

    rows = probe(args.tokens, args.shapes, args.forms, args.options, args.iters,
                 report=lambda r: print(_line(r), flush=True))
    print(table(rows))
    for r in rows:  # the kernels each cell compiled to, for reading beside the profile
        if r.get("kernels"):
            names = ", ".join(f"{k['name']}[{k['kind']}{'/' + k['precision'] if k['precision'] else ''}]"
                              for k in r["kernels"])
            print(f"  {r['in']}x{r['out']} {r['options']} {r['form']}: {names}")
    result = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
              "machine": platform.platform(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k != "rows"}
    summary["cells"] = [{k: r.get(k) for k in ("in", "out", "options", "form", "ms", "gemm_kernels",
                                                 "other_kernels", "rel_diff_vs_f32")} for r in rows]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
