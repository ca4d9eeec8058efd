"""The fused head + cross-entropy kernels (`model.fused_ce`) at the model's real shapes: correct against the
float32 reference, and timed beside the chunked XLA loss they replace.

    python scripts/fused_ce_check.py [--config configs/yxanul_197m.yaml] [--check-tokens 8000]
                                     [--time-tokens 16384 65536] [--iters 10] [--json-out F]
                                     [--tiles default fwd=256x64 dx=64x128w4,dw=128x64 ...]

The vocabulary (padded rows included), the head width K and the loss chunk come from the config. On a
GPU the kernels compile through Triton; on a CPU they run in Pallas interpret mode (use small sizes).

Check (a small ragged case, then rows whose sums shifted by their target's logit overflow, so the training forward
walks their block again with the online max (`fused_ce.overflow_inputs`), then `--check-tokens` at the config's
shape; fresh random inputs, a ragged last block, 20 % of tokens masked, z-loss 1e-4):
lse and target logit, the loss, and both gradients against `fused_ce.reference` in float32, as
|a - b| / |b| over the whole array (norms). Bounds: lse/target/loss 1e-5 (float32 accumulation of BF16
products, the same products in another order), gradients 2e-2 (the kernels round the softmax (input gradient)
or dlogits (table gradient) to BF16 before the GEMM that uses it). A NaN fails.

Timing (`--time-tokens`, each a separate shape): the median of `--iters` calls after 2 warm-ups of the
forward alone, of the training forward alone (`train-fwd`, fused only: the custom gradient's forward, its
residuals returned), and of forward + backward (value and both gradients), fused and chunked (the train step's
`train.loss_kernel=chunked`: scan over `train.loss_chunk`-token chunks, float32 logits, remat). TFLOP/s
counts 2 T K V per GEMM (`flop_multiple`): 1 forward, 2 the training forward (logits and softmax @ w), 4 forward +
backward (then dw's recomputed logits and gradient GEMM; the chunked loss recomputes its logits under remat: 4 as
well), so `fwd+bwd` less `train-fwd` is the table gradient's time. `efficiency` is fused forward + backward TFLOP/s
over the device's dense BF16 peak (analysis/gpus.py): `analysis.perf.FUSED_CE_MEASURED` holds each kernel's share
of the peak from such a file (2026-11-28: the training pair's, before `train-fwd` split it).

Tiles (`--tiles`): each argument is one set of the kernels' tiles, `default` or comma-separated
`KERNEL=BTxBV[wWARPS][sSTAGES][:mosaic|:mosaic-rs|:auto]` changes to the default (`core.tiles.KernelTiles.replace`);
each set is checked on the small ragged case (at K 64 for a set with a mosaic kernel, `model.fused_ce_ws`, with the
overflow rows too) and timed (fused rows carry its name, in `runs` every kernel it asks for: the default's training
kernels are the mosaic ones on a Hopper GPU at K 64 and 128, `core.tiles.Tiles.runs_mosaic`; and in `compiled` the
kernels the compiled, timed function holds, read from its HLO: `compiled_kernels`). On a CPU every set runs the
Triton kernels in interpret mode: only a Hopper GPU checks the mosaic ones. A set that fails to compile
(too much shared memory, say), or whose check fails, is recorded as such, never timed and never chosen; the sweep
goes on, and the JSON is rewritten after each set. Then each kernel's fastest tiles among the sets that change only
it are put together (`combined_spec`), checked and timed too, and the fastest set is named last.

Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yxanul_jax.core.tiles import training_form  # noqa: E402  (below the model: no JAX)

VALUE_RTOL = 1e-5
GRAD_RTOL = 2e-2


def flop_multiple(mode: str) -> int:
    """Multiples of 2 T K V a mode runs (`fused_ce.KERNELS`): the forward alone, training's forward alone
    (`train-fwd`: the primal and residuals of the custom gradient), or training's forward and dw."""
    from yxanul_jax.model.fused_ce import KERNELS

    return {"fwd": KERNELS["fused_ce_fwd"], "train-fwd": KERNELS["fused_ce_fwd_dx"]}.get(
        mode, KERNELS["fused_ce_fwd_dx"] + KERNELS["fused_ce_dw"])


def _inputs(key, T: int, V: int, K: int, v_real: int):
    import jax
    import jax.numpy as jnp

    k = jax.random.split(key, 4)
    x = jax.random.normal(k[0], (T, K), jnp.float32).astype(jnp.bfloat16)
    w = (0.3 * jax.random.normal(k[1], (V, K), jnp.float32)).astype(jnp.bfloat16)
    mask = (jax.random.uniform(k[3], (T,)) > 0.2).astype(jnp.float32)
    targets = jnp.where(mask > 0, jax.random.randint(k[2], (T,), 0, v_real), -1)
    return x, w, targets, mask


def rel_err(a, b) -> float:
    """|a - b| / |b| over the whole array (norms), in float64; NaN when a has a non-finite value."""
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("nan")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def tiles_of(spec: str):
    from yxanul_jax.core.tiles import parse_tiles

    return parse_tiles(spec)


TRITON = training_form("triton")  # the training kernels in Triton at the default's blocks


def runs(spec: str, k: int) -> str:
    """The kernels a set of tiles runs at head width k on this machine, every kernel in full
    (`KernelTiles.resolved`; the mosaic ones on a Hopper GPU, `fused_ce.hopper`): recorded beside `tiles`, so that a
    row's `default` names what ran then, whatever the default is later."""
    from yxanul_jax.model.fused_ce import gpu_capability, hopper

    return tiles_of(spec).resolved(k, gpu=hopper(gpu_capability())).spec(full=True)


def compiled_kernels(hlo_text: str) -> dict[str, str]:
    """The fused kernels a compiled function runs, read from its optimized HLO (`analysis.perf.fused_ce_calls`):
    name -> custom call target; empty on a CPU (interpret mode). Read against `runs` (what the tiles ask for), so that
    a Mosaic kernel this JAX could not build (`auto` falls back to Triton, and logs it) is recorded as the kernel that
    ran (`read_ran`), not timed under its name."""
    from yxanul_jax.analysis.perf import fused_ce_calls

    return dict(sorted(fused_ce_calls(hlo_text).items()))


def _failure(e: BaseException) -> str:
    """A set's compile, launch or HLO-reading failure as a row records it: its type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _training_kernels(mode: str) -> list[tuple[str, str, str]]:
    """(tiles field, Triton kernel name, mosaic kernel name) of the training kernels a timing mode runs."""
    from yxanul_jax.model.fused_ce_ws import FORWARD, TABLE_GRAD

    dx, dw = ("dx", "fused_ce_fwd_dx", FORWARD), ("dw", "fused_ce_dw", TABLE_GRAD)
    return {"fwd": [], "train-fwd": [dx], "fwd+bwd": [dx, dw]}[mode]


def unlike(row: dict) -> list[str]:
    """Where a timed row's compiled kernels are not the ones its `runs` asks for (a GPU only: a CPU compiles none as
    custom calls): the training kernels of a Mosaic GPU form that did not build, say. `runs` is resolved (no `auto`
    left: `KernelTiles.resolved`), so each kernel is Triton or a mosaic form."""
    if not row.get("compiled"):
        return []
    asked = tiles_of(row["runs"])
    out = []
    for kernel, triton, mosaic in _training_kernels(row["mode"]):
        want = mosaic if getattr(asked, kernel).kernel.startswith("mosaic") else triton
        if want not in row["compiled"]:
            out.append(f"{kernel} asked for {want}, compiled {sorted(row['compiled'])}")
    return out


def read_ran(row: dict, kernels: dict[str, str]) -> None:
    """Record in a fused row the kernels its compiled function holds (`compiled_kernels`), and where they are not the
    asked ones (`unlike`), keep the ask in `asked` and make `runs` what ran: the training kernel Triton's at the same
    blocks where its mosaic form did not build, so every reader of `runs` pairs the time with the kernels that made
    it."""
    import dataclasses

    row["compiled"] = kernels
    if not (differs := unlike(row)):
        return
    row["unlike"] = differs
    ran = tiles_of(row["runs"])
    for kernel, triton, mosaic in _training_kernels(row["mode"]):
        if triton not in row["compiled"] and mosaic not in row["compiled"]:
            continue  # neither form: leave the ask (the note says what was compiled)
        form = "mosaic" if mosaic in row["compiled"] else "triton"
        t = getattr(ran, kernel)
        if t.kernel.startswith("mosaic") != (form != "triton"):
            ran = dataclasses.replace(ran, **{kernel: dataclasses.replace(t, kernel=form)})
    row["asked"], row["runs"] = row["runs"], ran.spec(full=True)


def runs_mosaic(spec: str) -> bool:
    """Whether a set runs a mosaic training kernel somewhere (asked for, or `auto`): checked at K 64 and on the
    overflow rows too."""
    t = tiles_of(spec)
    return t.dx.kernel != "triton" or t.dw.kernel != "triton"


def combined_spec(rows: list[dict], specs: list[str], T: int) -> str | None:
    """Each kernel's fastest tiles at T tokens among the sets that change only that kernel (the forward by its
    forward time, dx and dw by forward + backward), as one set; None where that set was timed already."""
    import dataclasses

    from yxanul_jax.core.tiles import DEFAULT_TILES, KERNELS

    ms = {(r["tiles"], r["mode"]): r["ms"] for r in rows if r["kernel"] == "fused" and r["tokens"] == T and "ms" in r}
    best = {}
    for kernel in KERNELS:
        mode = "fwd" if kernel == "fwd" else "fwd+bwd"
        alone = [s for s in specs if (s, mode) in ms
                 and all(getattr(tiles_of(s), k) == getattr(DEFAULT_TILES, k) for k in KERNELS if k != kernel)]
        if alone:
            best[kernel] = getattr(tiles_of(min(alone, key=lambda s: ms[(s, mode)])), kernel)
    combined = dataclasses.replace(DEFAULT_TILES, **best)
    return None if any(tiles_of(s) == combined for s in specs) else combined.spec()


def check(T: int, V: int, K: int, v_real: int, seed: int, z_weight: float = 1e-4, tiles: str = "default",
          overflow: bool = False) -> dict:
    """Relative errors of the fused kernels against the float32 reference, and whether each is in bounds.
    `overflow`: `fused_ce.overflow_inputs` (rows whose anchored sums overflow, so the training forward walks their
    block again with the online max), every token unmasked."""
    import jax
    import jax.numpy as jnp

    from yxanul_jax.model import fused_ce
    from yxanul_jax.model.loss import masked_sums

    if overflow:
        x, w, targets = fused_ce.overflow_inputs(T, V, K, seed)
        mask = jnp.ones((T,), jnp.float32)
    else:
        x, w, targets, mask = _inputs(jax.random.key(seed), T, V, K, v_real)

    def loss(fn, x, w):
        lse, tl = fn(x, w, targets)
        nll, z = masked_sums(lse, tl, mask)
        return nll + z_weight * z

    kernel_tiles = tiles_of(tiles)
    fused = lambda x, w, t: fused_ce.linear_cross_entropy(x, w, t, v_real, tiles=kernel_tiles)  # noqa: E731
    ref = lambda x, w, t: fused_ce.reference(x.astype(jnp.float32), w.astype(jnp.float32), t, v_real)  # noqa: E731
    lse, tl = jax.jit(fused)(x, w, targets)
    (v, (gx, gw)) = jax.jit(jax.value_and_grad(lambda x, w: loss(fused, x, w), argnums=(0, 1)))(x, w)
    with jax.default_matmul_precision("highest"):  # a GPU would take float32 GEMMs at TF32 otherwise
        lse_r, tl_r = jax.jit(ref)(x, w, targets)
        (v_r, (gx_r, gw_r)) = jax.jit(jax.value_and_grad(lambda x, w: loss(ref, x, w), argnums=(0, 1)))(x, w)
    errs = {"lse": rel_err(lse, lse_r), "target": rel_err(tl, tl_r), "loss": rel_err(v, v_r), "grad_x": rel_err(gx, gx_r),
            "grad_w": rel_err(gw, gw_r)}
    bounds = {n: GRAD_RTOL if n.startswith("grad") else VALUE_RTOL for n in errs}
    padded_rows_zero = bool(not jnp.any(gw[v_real:]))
    ok = all(e <= bounds[n] for n, e in errs.items()) and padded_rows_zero  # NaN compares False
    return {"tokens": T, "vocab_rows": V, "v_real": v_real, "k": K, "seed": seed, "tiles": tiles,
            "runs": runs(tiles, K), "inputs": "overflow" if overflow else "random", "rel_err": errs, "bounds": bounds,
            "padded_rows_zero_grad": padded_rows_zero, "ok": ok}


def guarded_check(*args, tiles: str, **kw) -> dict:
    """`check` of a set of tiles; a set the device cannot compile or run is a failed check with its error."""
    try:
        return check(*args, tiles=tiles, **kw)
    except Exception as e:  # a Triton compile or launch error (shared memory): recorded, the sweep goes on
        return {"tiles": tiles, "ok": False, "error": _failure(e)}


def print_check(c: dict) -> None:
    if "error" in c:
        print(f"check of tiles {c['tiles']}: FAILED, {c['error']}", flush=True)
        return
    errs = ", ".join(f"{n} {e:.2e} (<= {c['bounds'][n]:.0e})" for n, e in c["rel_err"].items())
    print(f"check at {c['tokens']} tokens x {c['vocab_rows']} rows ({c['v_real']} real, K {c['k']}, tiles "
          f"{c['tiles']}, {c.get('inputs', 'random')} inputs): " + errs
          + f"; padded rows' gradient zero: {c['padded_rows_zero_grad']} -> {'ok' if c['ok'] else 'FAILED'}", flush=True)


def median_s(fn, args, iters: int) -> float:
    """Median seconds of `iters` calls of `fn(*args)` after 2 warm-ups, each waited for."""
    import jax

    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timing(T: int, V: int, K: int, v_real: int, chunk: int, iters: int, peak: float | None,
           tiles: tuple[str, ...] = ("default",), chunked: bool = True) -> list[dict]:
    """Fused (each set of `tiles`) and chunked, forward and forward + backward, at T tokens: median seconds and
    TFLOP/s; a set that fails gets a row with its error."""
    import jax
    import jax.numpy as jnp

    from yxanul_jax.model import fused_ce
    from yxanul_jax.model.loss import chunked_cross_entropy, masked_sums

    x, w, targets, mask = _inputs(jax.random.key(T), T, V, K, v_real)
    cols_real = jnp.arange(V) < v_real

    def fused_loss(kernel_tiles):
        def f(x, w):
            lse, tl = fused_ce.linear_cross_entropy(x, w, targets, v_real, tiles=kernel_tiles)
            return masked_sums(lse, tl, mask)[0]
        return f

    def chunked_loss(x, w):
        def logits(h, _):
            s = jax.lax.dot_general(h, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            return jnp.where(cols_real, s, -jnp.inf)
        return chunked_cross_entropy(logits, x, jnp.maximum(targets, 0), mask, chunk)[0]

    cells = [("fused", spec, fused_loss(tiles_of(spec))) for spec in tiles]
    rows = []
    for name, spec, f in cells + ([("chunked", "", chunked_loss)] if chunked else []):
        modes = [("fwd", jax.jit(f)), ("fwd+bwd", jax.jit(jax.value_and_grad(f, argnums=(0, 1))))]
        if name == "fused":  # the training forward alone (its residuals returned, so nothing is cut): dw is the rest
            modes.insert(1, ("train-fwd", jax.jit(lambda x, w, f=f: jax.vjp(f, x, w))))
        for mode, fn in modes:
            row = {"kernel": name, "tiles": spec, "mode": mode, "tokens": T}
            if name == "fused":
                row["runs"] = runs(spec, K)
            try:
                compiled = fn.lower(x, w).compile()  # timed as compiled, and read: the kernels that ran
                if name == "fused":
                    try:
                        kernels = compiled_kernels(compiled.as_text())
                    except Exception as e:  # the HLO reader failed, not the GPU: the row keeps its time
                        row["compiled_error"] = _failure(e)
                    else:
                        read_ran(row, kernels)
                s = median_s(compiled, (x, w), iters)
            except Exception as e:  # a set of tiles the GPU cannot run (shared memory): recorded, the sweep goes on
                rows.append({**row, "error": _failure(e)})
                continue
            tflops = flop_multiple(mode) * 2 * T * K * V / s / 1e12
            of_peak = None if peak is None else tflops * 1e12 / peak
            rows.append({**row, "ms": 1e3 * s, "tflops": tflops, "of_peak": of_peak})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/yxanul_197m.yaml")
    p.add_argument("--check-tokens", type=int, default=8000, help="tokens of the correctness check (0: none)")
    p.add_argument("--time-tokens", type=int, nargs="*", default=[16384, 65536], help="token counts timed")
    p.add_argument("--vocab", type=int, default=None, help="override the config's vocabulary (small CPU runs)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    p.add_argument("--tiles", nargs="+", default=["default"], metavar="SET",
                   help="sets of kernel tiles to check and time: default, or e.g. fwd=256x64,dx=64x128w4")
    args = p.parse_args(argv)
    from yxanul_jax.core.tiles import MOSAIC_WIDTHS, bad_tiles

    if bad := bad_tiles(args.tiles):
        print(f"error: {bad}", file=sys.stderr)
        return 2
    import jax

    from yxanul_jax.analysis import gpus
    from yxanul_jax.core.config import load_config
    from yxanul_jax.core.rundir import atomic_write

    overrides = [f"model.vocab_size={args.vocab}"] if args.vocab else []
    cfg = load_config(args.config, overrides)
    V, K, v_real, chunk = cfg.model.padded_vocab, cfg.model.head_width, cfg.model.vocab_size, cfg.train.loss_chunk
    device = jax.devices()[0]
    gpu = gpus.of_device_kind(device.device_kind) if device.platform == "gpu" else None
    peak = None if gpu is None else gpu.peak_bf16
    record = {"date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "device": device.device_kind,
              "platform": device.platform, "jax": jax.__version__, "config": cfg.model.name,
              "vocab_rows": V, "v_real": v_real, "k": K, "loss_chunk": chunk, "peak_bf16_tflops":
              None if peak is None else peak / 1e12}
    # A small ragged case (a partial last block of tokens and of vocabulary rows) at K 32 (the Triton training
    # kernels) and 64 (the default's mosaic ones on a Hopper GPU), rows whose anchored sums overflow with the default
    # tiles (the mosaic forward's online max there) and with the Triton kernels (their fallback walk, which the
    # default runs at other widths and GPUs), then the config's shape.
    record["checks"] = [check(200, 300, 32, 290, args.seed), check(200, 300, MOSAIC_WIDTHS[0], 290, args.seed),
                        check(256, 640, 128, 600, args.seed, overflow=True),
                        check(256, 640, 128, 600, args.seed, overflow=True, tiles=TRITON)]
    if args.check_tokens:
        record["checks"].append(check(args.check_tokens, V, K, v_real, args.seed))
    for c in record["checks"]:
        print_check(c)
    rows = record["timing"] = []

    def save():  # after every set: a sweep cut short by its time limit keeps what it measured
        if args.json_out:
            os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
            atomic_write(args.json_out, json.dumps({**record, "ok": all(c["ok"] for c in record["checks"])}) + "\n")

    def checked(spec: str) -> bool:  # a set of tiles is timed only once it matches float32
        # the small ragged case at the narrowest head the set's kernels take (the mosaic ones: 64), and for a mosaic
        # set the overflow rows too (its forward keeps an online max where the Triton one falls back)
        mosaic = runs_mosaic(spec)
        t = tiles_of(spec)
        ring = max(t.dx.stages, t.dw.stages)
        n = 128 * ring + 72 if mosaic and ring > 2 else 200  # enough blocks of 128 that a larger ring wraps in both
        cases = [((n, n + 100, MOSAIC_WIDTHS[0] if mosaic else 32, n + 90), {})]
        if mosaic:
            cases.append(((256, 640, 128, 600), {"overflow": True}))
        ok = True
        for shape, kw in cases:
            c = guarded_check(*shape, args.seed, tiles=spec, **kw)
            record["checks"].append(c)
            print_check(c)
            ok = ok and c["ok"]
        return ok

    good = [spec for spec in args.tiles if spec == "default" or checked(spec)]
    for T in args.time_tokens:
        for i, spec in enumerate(good):
            rows += timing(T, V, K, v_real, chunk, args.iters, peak, (spec,), chunked=i == len(good) - 1)
            save()
        spec = combined_spec(rows, good, T) if len(good) > 1 else None
        if spec and checked(spec):  # each kernel's best, together
            good.append(spec)
            rows += [{**r, "combined": True} for r in timing(T, V, K, v_real, chunk, args.iters, peak, (spec,), False)]
    ok = all(c["ok"] for c in record["checks"])
    timed = [r for r in rows if "ms" in r]
    by = {(r["kernel"], r["mode"], r["tokens"]): r for r in timed}
    fused_fb = [r for r in timed if r["kernel"] == "fused" and r["mode"] == "fwd+bwd"]
    if fused_fb and peak:
        record["efficiency"] = max(r["of_peak"] for r in fused_fb)
    print(f"{'kernel':<9}{'tiles':<24}{'mode':<9}{'tokens':>8}{'ms':>10}{'TFLOP/s':>10}{'of peak':>9}"
          f"{'fused speedup':>15}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<9}{r['tiles']:<24}{r['mode']:<9}{r['tokens']:>8}  failed: {r['error'][:80]}")
            continue
        other = by.get(("chunked", r["mode"], r["tokens"]))
        speed = f"{other['ms'] / r['ms']:.2f}x" if r["kernel"] == "fused" and other else ""
        share = "-" if r["of_peak"] is None else f"{100 * r['of_peak']:.1f}%"
        print(f"{r['kernel']:<9}{r['tiles']:<24}{r['mode']:<9}{r['tokens']:>8}{r['ms']:>10.2f}{r['tflops']:>10.1f}"
              f"{share:>9}{speed:>15}")
        for line in r.get("unlike", []):  # the row timed other kernels than its tiles ask: `runs` says which
            print(f"  note: not the kernels asked for: {line}; timed as {r['runs']}")
    if len(args.tiles) > 1 and fused_fb:
        for T in args.time_tokens:
            best = min((r for r in fused_fb if r["tokens"] == T), key=lambda r: r["ms"], default=None)
            if best:
                record.setdefault("fastest_tiles", {})[str(T)] = best["tiles"]
                print(f"fastest tiles at {T} tokens (forward + backward): {best['tiles']} ({best['ms']:.2f} ms)")
    record["ok"] = ok
    save()
    print(json.dumps(record))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
