"""The fused head + loss kernels as an H100/H200 runs them, without one: each kernel's inner loop in SASS and the
cycles per tile that follow (`analysis.kernel_census`), scaled to a step's tokens and vocabulary.

    .venv-gpu-check/bin/python scripts/fused_ce_sass.py [--tiles default fwd=128x128 ...] [--tokens 131072]
        [--measured docs/bench/.../fused_ce_tiles.json] [--clock-ghz 1.98] [--json-out FILE]

For each set of tiles (`core.tiles`, the form of `train.fused_ce_tiles`) it compiles the kernels for sm_90 on this
machine (the forward for evaluation, then the training forward and the table gradient: jax.grad), assembles
each one's PTX with ptxas and disassembles it with nvdisasm (both in the gpu-check environment), and prints per
kernel: registers, spills, SASS instructions, exps (MUFU) and wgmma (HGMMA) per iteration, the clocks of the
tensor, issue and MUFU parts of an iteration and of the whole walked iteration, the clocks the tensor cores stand
idle before the iteration's first GEMM, between its GEMMs and after the last (`idle b/m/a`: what a faster loop must
remove), the tensor cores' share of the iteration (what `model.fused_ce.TENSOR_SHARE` records for the performance
model), the bytes it loads per clock, the KiB an iteration moves through shared memory (`smem KiB`:
`kernel_census.smem_bytes`, the wgmma operands read there, the stores, loads and copies) and their clocks at 128
bytes a clock over the iteration's (`smem`: above 1, the loop asks the shared memory for longer than the census
gives it; the census does not charge it), and the kernel's milliseconds by this cycle model alone at `--tokens` x the
vocabulary (`--vocab-rows`, `--v-real`, `--k`: yxanul-197m's by default). `--measured` reads a `scripts/fused_ce_check.py --json-out` file (a GPU's tile
sweep of the same kernel code) and sets each measured row beside its prediction, with the ratio. A table, then
one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# grid over tokens, each walking the vocabulary
ROW_KERNELS = ("fused_ce_fwd", "fused_ce_fwd_dx", "fused_ce_dx", "fused_ce_fwd_dx_ws")
TILES_OF = {"fused_ce_fwd": "fwd", "fused_ce_fwd_dx": "dx", "fused_ce_dx": "dx", "fused_ce_dw": "dw",
            "fused_ce_fwd_dx_ws": "dx", "fused_ce_dw_ws": "dw"}
MOSAIC_KERNELS = ("fused_ce_fwd_dx_ws", "fused_ce_dw_ws")  # `model.fused_ce_ws`'s FORWARD and TABLE_GRAD


def compile_kernels(spec: str, device, k: int) -> dict[str, str]:
    """{kernel: PTX} of the evaluation forward and the training kernels for one set of tiles, at small shapes
    (the loop bodies do not depend on the trip counts): tokens 4 and vocabulary rows 8 of the largest blocks,
    59 of them padded, as yxanul-197m's are."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from yxanul_jax.analysis.kernel_census import kernel_ptx, mosaic_ptx
    from yxanul_jax.core.tiles import parse_tiles
    from yxanul_jax.model import fused_ce

    tiles = parse_tiles(spec)
    T, V = 4 * tiles.t_multiple, 8 * tiles.v_multiple
    where = SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct((T, k), jnp.bfloat16, sharding=where),
            jax.ShapeDtypeStruct((V, k), jnp.bfloat16, sharding=where),
            jax.ShapeDtypeStruct((T,), jnp.int32, sharding=where)]

    def lse(x, w, t):
        return fused_ce.linear_cross_entropy(x, w, t, V - 59, tiles=tiles)[0]

    def grads(x, w, t):
        return jax.grad(lambda x, w: jnp.sum(lse(x, w, t)), argnums=(0, 1))(x, w)

    out = kernel_ptx(jax.jit(lse).lower(*args))
    # mosaic training kernels (`model.fused_ce_ws`) are compiled by the CUDA plugin, which writes their own PTX
    out.update(mosaic_ptx(lambda: out.update(kernel_ptx(jax.jit(grads).lower(*args)))))
    return {name: ptx for name, ptx in out.items() if name.startswith("fused_ce_")}


def predict(name: str, ptx: str, spec: str, tokens: int, v_real: int, k: int, sms: int, clock_hz: float) -> dict:
    """One kernel's census and its predicted time at `tokens` x `v_real` (module docstring)."""
    from yxanul_jax.analysis.kernel_census import (SMEM_BYTES_PER_CLOCK, assemble, inner_loop, load_bytes,
                                                   pingpong_cycles, smem_bytes, tile_cycles)
    from yxanul_jax.core.tiles import parse_tiles
    from yxanul_jax.model.fused_ce_ws import CONSUMERS

    t = getattr(parse_tiles(spec), TILES_OF[name])
    code, regs, spilled = assemble(ptx)
    loop = inner_loop(code)
    mosaic = name in MOSAIC_KERNELS  # what compiled, whatever the spec asked (`auto` picks by head width)
    if mosaic:  # consumer warpgroups of 4 warps taking turns at the tensor cores
        t = dataclasses.replace(t, warps=4 * CONSUMERS)
        cyc = pingpong_cycles(loop, CONSUMERS)
    else:
        cyc = tile_cycles(loop, t.warps)
    t_blocks, v_blocks = math.ceil(tokens / t.bt), math.ceil(v_real / t.bv)
    programs, iters = (t_blocks, v_blocks) if name in ROW_KERNELS else (v_blocks, t_blocks)
    waves = math.ceil(programs / sms)
    loaded = mosaic_bytes(name, t, k) if mosaic else load_bytes(loop, t.warps)
    smem = smem_bytes(loop, t.warps, loaded if mosaic else 0)  # LDGSTS are in the SASS; TMA copies are not
    return {"tiles": spec, "kernel": name, "bt": t.bt, "bv": t.bv, "warps": t.warps, "stages": t.stages,
            "registers": regs, "spill_bytes": spilled, "instructions": loop.instructions,
            "mufu": loop.count("MUFU"), "hgmma": loop.count("HGMMA"),
            "fp32_alu": loop.count("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL"),
            "cycles": {key: round(v, 1) for key, v in cyc.items()}, "share": round(cyc["tensor"] / cyc["total"], 4),
            "load_bytes": loaded, "load_bytes_per_clock": round(loaded / cyc["total"], 1),
            "smem_bytes": smem, "smem_share": round(smem["total"] / SMEM_BYTES_PER_CLOCK / cyc["total"], 3),
            "ms": waves * iters * cyc["total"] / clock_hz * 1e3}


def mosaic_bytes(name: str, t, k: int) -> int:
    """Bytes a mosaic kernel's producer copies per iteration with TMA (no LDGSTS to count): one walked block of w
    (the forward) or of x with its tokens' four float32 values (dw)."""
    return t.bv * k * 2 if name in ROW_KERNELS else t.bt * (k * 2 + 4 * 4)


def measured_ms(path: str, tokens: int) -> dict[tuple[str, str], float]:
    """{(the kernels that ran, mode): ms} of a `fused_ce_check.py --json-out` file's fused rows at `tokens`, the
    kernels as the spec `ran` writes: the row's `runs`, or in a file from before the default training kernels became
    `auto` (2026-11-28) its `tiles` with every kernel Triton that gave no `:mosaic`."""
    rows = json.load(open(path)).get("timing", [])
    return {(r.get("runs") or ran(r["tiles"], 0), r["mode"]): r["ms"] for r in rows
            if r.get("kernel") == "fused" and r.get("tokens") == tokens and "ms" in r}


def ran(spec: str, k: int) -> str:
    """The kernels a set of tiles runs on a Hopper GPU at head width k, every kernel in full, as
    `fused_ce_check.runs` records them (`KernelTiles.resolved`: the default's training kernels are mosaic at K 64 and
    128); at k 0, Triton wherever no `:mosaic` asks otherwise."""
    from yxanul_jax.core.tiles import parse_tiles

    return parse_tiles(spec).resolved(k).spec(full=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiles", nargs="+", default=["default"], metavar="SET")
    p.add_argument("--tokens", type=int, default=131072)
    p.add_argument("--vocab-rows", type=int, default=200064)
    p.add_argument("--v-real", type=int, default=200005)
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--gpu", default="h100", choices=["h100", "h100-pcie", "h200"], help="the target (SM count)")
    p.add_argument("--clock-ghz", type=float, default=1.98, help="the SM clock under load (boost: 1.98)")
    p.add_argument("--measured", help="a GPU's scripts/fused_ce_check.py --json-out file to set beside")
    p.add_argument("--json-out")
    args = p.parse_args()
    import jax

    jax.config.update("jax_platforms", "cpu")
    from yxanul_jax.analysis.gpu_target import compile_device
    from yxanul_jax.analysis.gpus import lookup
    from yxanul_jax.analysis.kernel_census import tool
    from yxanul_jax.core.tiles import bad_tiles

    missing = [t for t in ("ptxas", "nvdisasm") if tool(t) is None]
    if missing:
        print(f"error: {' and '.join(missing)} not found: run this with the gpu-check environment's Python "
              "(bash scripts/gpu_check_env.sh installs both)", file=sys.stderr)
        return 2

    if bad := bad_tiles(args.tiles):
        print(f"error: {bad}", file=sys.stderr)
        return 2
    gpu = lookup(args.gpu)
    device = compile_device(args.gpu)
    clock = args.clock_ghz * 1e9
    rows = []
    failed = {}
    for spec in args.tiles:
        try:
            kernels = compile_kernels(spec, device, args.k)
        except Exception as e:  # a set the compiler refuses (shared memory): recorded, the others go on
            failed[spec] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(f"tiles {spec}: compile failed, {failed[spec]}", file=sys.stderr)
            continue
        for name, ptx in sorted(kernels.items()):
            rows.append(predict(name, ptx, spec, args.tokens, args.v_real, args.k, gpu.sms, clock))
    measured = measured_ms(args.measured, args.tokens) if args.measured else {}
    tw = max([22] + [len(spec) + 2 for spec in args.tiles])  # the tiles column
    print(f"{'tiles':<{tw}}{'kernel':<19}{'regs':>5}{'spill':>6}{'instr':>6}{'mufu':>5}{'hgmma':>6}{'tensor':>8}"
          f"{'issue':>7}{'mufu':>6}{'clk/it':>7}{'idle b/m/a':>13}{'share':>7}{'B/clk':>6}{'smem KiB':>9}{'smem':>6}"
          f"{'ms':>8}")
    for r in rows:
        c = r["cycles"]
        idle = f"{c['idle_before']:.0f}/{c['idle_between']:.0f}/{c['idle_after']:.0f}"
        print(f"{r['tiles']:<{tw}}{r['kernel']:<19}{r['registers']:>5}{r['spill_bytes']:>6}{r['instructions']:>6}"
              f"{r['mufu']:>5}{r['hgmma']:>6}{c['tensor']:>8.0f}{c['issue']:>7.0f}{c['mufu']:>6.0f}{c['total']:>7.0f}"
              f"{idle:>13}{r['share']:>7.3f}{r['load_bytes_per_clock']:>6.1f}{r['smem_bytes']['total'] / 1024:>9.0f}"
              f"{r['smem_share']:>6.2f}{r['ms']:>8.2f}")
    sets = []
    for spec in (s for s in args.tiles if s not in failed):
        mine = [r for r in rows if r["tiles"] == spec]
        fwd = sum(r["ms"] for r in mine if r["kernel"] == "fused_ce_fwd")
        train = sum(r["ms"] for r in mine if r["kernel"] != "fused_ce_fwd")
        if not {"fused_ce_fwd_dx", "fused_ce_fwd_dx_ws"} & {r["kernel"] for r in mine}:  # the old design: lse, dx, dw
            train += fwd
        row = {"tiles": spec, "fwd_ms": round(fwd, 2), "fwd+bwd_ms": round(train, 2)}
        for mode in ("fwd", "fwd+bwd"):
            if (key := (ran(spec, args.k), mode)) in measured:
                row[f"measured_{mode}_ms"] = round(measured[key], 2)
                row[f"ratio_{mode}"] = round(measured[key] / row[f"{mode}_ms"], 3)
        sets.append(row)
    print(f"\n{'tiles':<{tw}}{'fwd ms':>9}{'measured':>10}{'ratio':>7}{'fwd+bwd ms':>12}{'measured':>10}{'ratio':>7}")
    for s in sets:
        print(f"{s['tiles']:<{tw}}{s['fwd_ms']:>9.2f}{s.get('measured_fwd_ms', float('nan')):>10.2f}"
              f"{s.get('ratio_fwd', float('nan')):>7.3f}{s['fwd+bwd_ms']:>12.2f}"
              f"{s.get('measured_fwd+bwd_ms', float('nan')):>10.2f}{s.get('ratio_fwd+bwd', float('nan')):>7.3f}")
    result = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "target": args.gpu,
              "jax": jax.__version__, "tokens": args.tokens, "vocab_rows": args.vocab_rows, "v_real": args.v_real,
              "k": args.k, "clock_ghz": args.clock_ghz, "kernels": rows, "sets": sets, "failed": failed}
    if args.json_out:
        tmp = args.json_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json_out)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
