"""`python -m yxanul_jax.inspect`: FLOPs, bytes, memory and FP8-vs-BF16 dots of one compiled stage.

    python -m yxanul_jax.inspect --config configs/tiny.yaml [--stage N] [key=value ...] [--json]
                                 [--hlo-out FILE]

The stage's train step is compiled ahead of time exactly as training compiles it
(`stages.compile_stage`: abstract shapes, donated state, nothing allocated), then reported:
XLA's cost analysis (FLOPs, bytes accessed), its memory analysis (arguments, outputs, aliased,
temporaries, and the peak they add up to) next to the planner's estimate, and the matrix
multiplies of the optimized HLO sorted by precision.

Which dots run in FP8 is read from the HLO text (`count_dots`): on GPU, XLA's GEMM rewriter turns
an FP8 dot into a cuBLASLt custom call `__cublas$lt$matmul$f8`; on CPU (and anywhere the rewrite
does not fire) the FP8 recipe stays dequantize -> dot, so a dot counts as FP8 when one of its
operands traces back, through converts, scale multiplies, broadcasts, bitcasts, copies,
reshapes, transposes, slices and fusion boundaries, to a value of an 8-bit float type. Every other
dot or GEMM custom call is counted under its operands' element type (bf16, f32, ...). Counts are
instructions in the HLO; `executed` also multiplies by the known trip counts of enclosing loops
(a scanned layer's dots run once per layer).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections import defaultdict

from yxanul_jax.config import Config, add_config_args, config_from_args
from yxanul_jax.errors import UserError, cli_entry

FP8_TYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e4m3b11fnuz", "f8e3m4", "f8e8m0fnu")
# Ops a dequantized FP8 operand passes through on its way into a dot.
PASS_THROUGH = {"convert", "multiply", "divide", "broadcast", "bitcast", "bitcast-convert", "copy", "reshape",
                "transpose", "slice", "dynamic-slice", "get-tuple-element", "parameter", "fusion", "clamp",
                "copy-start", "copy-done", "optimization-barrier", "all-gather", "collective-permute"}
DOT_OPS = {"dot", "convolution"}
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
MAX_HOPS = 24  # dequantize chains are a handful of ops; a cap keeps unrelated graphs out


@dataclasses.dataclass
class Instr:
    name: str
    dtype: str  # element type of the result ('tuple' for tuples)
    op: str
    operands: list[str]
    args: str  # the raw text inside the op's parentheses (a parameter's index)
    attrs: str
    computation: str
    is_root: bool


_COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$|^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _balanced(s: str, start: int) -> int:
    """Index just past the bracket group opening at s[start]."""
    depth = 0
    for i in range(start, len(s)):
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(s)


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if cur:
        out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def parse_hlo(text: str) -> dict[str, dict[str, Instr]]:
    """HLO text (optimized `compiled.as_text()` or `lowered.as_text(dialect="hlo")`) ->
    {computation name: {instruction name: Instr}}; the entry computation is also under '__entry__'."""
    comps: dict[str, dict[str, Instr]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _COMP.match(line)
            if m and not line.lstrip().startswith("HloModule"):
                name = m.group(2) or m.group(5)
                current = name
                comps[name] = {}
                if m.group(1) or m.group(4):
                    comps.setdefault("__entry__", comps[name])
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(re.sub(r"/\*.*?\*/", "", line))  # drop /*index=5*/ comments in long lists
        if not m:
            continue
        is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
        if rest.startswith("("):  # tuple-shaped result
            end = _balanced(rest, 0)
            dtype, rest = "tuple", rest[end:].lstrip()
        else:
            type_str, _, rest = rest.partition(" ")
            dtype = re.match(r"[a-z0-9]+", type_str).group(0) if re.match(r"[a-z0-9]+", type_str) else type_str
        op_m = re.match(r"([\w\-$]+)\(", rest)
        if not op_m:
            continue
        op = op_m.group(1)
        close = _balanced(rest, op_m.end() - 1)
        operands, args = [], rest[op_m.end():close - 1]
        for tok in _split_top(args):
            last = tok.split()[-1].lstrip("%") if tok.split() else ""
            if re.fullmatch(r"[\w.\-]+", last) and not re.fullmatch(r"-?[\d.]+(e-?\d+)?", last):
                operands.append(last)
        comps[current][name] = Instr(name, dtype, op, operands, args, rest[close:], current, is_root)
    return comps


def _called(attrs: str, key: str) -> list[str]:
    """Computations named by attribute `key` (`calls=%c`, `branch_computations={%a, %b}`)."""
    m = re.search(r"\b" + key + r"=(\{[^}]*\}|%?[\w.\-]+)", attrs)
    if not m:
        return []
    return [c.strip().lstrip("%") for c in m.group(1).strip("{}").split(",") if c.strip()]


def _trip_count(attrs: str) -> int:
    m = re.search(r'known_trip_count"?\s*:\s*\{\s*"?n"?\s*:\s*"?(\d+)', attrs)
    return int(m.group(1)) if m else 1


def _gemm_target(attrs: str) -> str | None:
    m = re.search(r'custom_call_target="([^"]+)"', attrs)
    return m.group(1) if m and m.group(1) in GEMM_TARGETS else None


def count_dots(hlo_text: str) -> dict:
    """Matrix multiplies of an HLO module by precision.

    Returns {"fp8": n, "bf16": n, "f32": n, ... (other element types), "total": n,
    "fp8_custom_calls": n (cuBLASLt FP8 GEMMs, included in "fp8"), "executed": {same keys, weighted
    by loop trip counts}}. A dot counts as FP8 if an operand reaches an 8-bit float value through
    `PASS_THROUGH` ops (into fusions through their root, out of fused computations through the
    fusion's operands).
    """
    comps = parse_hlo(hlo_text)
    entry = comps.get("__entry__")
    names = [c for c in comps if c != "__entry__"]
    callers: dict[str, list[tuple[str, Instr]]] = defaultdict(list)  # computation -> (kind, calling instr)
    for cname in names:
        for ins in comps[cname].values():
            for key in ("calls", "to_apply", "body", "condition", "branch_computations",
                        "true_computation", "false_computation"):
                for callee in _called(ins.attrs, key):
                    callers[callee].append((key, ins))

    # How many times each computation runs per step (known loop trip counts; 1 if unknown).
    runs: dict[str, int] = {}

    def run_count(cname: str, seen=()) -> int:
        if cname in runs:
            return runs[cname]
        if comps.get(cname) is entry or cname in seen:
            return 1
        total = 0
        for key, ins in callers.get(cname, []):
            n = run_count(ins.computation, seen + (cname,))
            total += n * (_trip_count(ins.attrs) if key == "body" else 1)
        runs[cname] = max(total, 1) if callers.get(cname) else 1
        return runs[cname]

    def root_of(cname: str) -> Instr | None:
        return next((i for i in comps.get(cname, {}).values() if i.is_root), None)

    def reaches_fp8(cname: str, name: str) -> bool:
        stack, seen = [(cname, name, 0)], set()
        while stack:
            c, n, hops = stack.pop()
            if (c, n) in seen or hops > MAX_HOPS:
                continue
            seen.add((c, n))
            ins = comps.get(c, {}).get(n)
            if ins is None:
                continue
            if ins.dtype in FP8_TYPES:
                return True
            if ins.op not in PASS_THROUGH:
                continue
            if ins.op == "parameter":  # out of a fused computation: the fusion's operand
                idx = int(ins.args) if ins.args.strip().isdigit() else -1
                for key, call in callers.get(c, []):
                    if key == "calls" and 0 <= idx < len(call.operands):
                        stack.append((call.computation, call.operands[idx], hops + 1))
                continue
            if ins.op == "fusion":  # into a fusion: its root
                for callee in _called(ins.attrs, "calls"):
                    root = root_of(callee)
                    if root is not None:
                        stack.append((callee, root.name, hops + 1))
                continue
            for o in ins.operands:
                stack.append((c, o, hops + 1))
        return False

    counts: dict[str, int] = defaultdict(int)
    executed: dict[str, int] = defaultdict(int)
    fp8_calls = 0
    for cname in names:
        for ins in comps[cname].values():
            target = _gemm_target(ins.attrs) if ins.op == "custom-call" else None
            if ins.op not in DOT_OPS and target is None:
                continue
            operands = ins.operands[:2]
            if target == "__cublas$lt$matmul$f8":
                kind = "fp8"
                fp8_calls += 1
            elif any(reaches_fp8(cname, o) for o in operands):
                kind = "fp8"
            else:
                types = [comps[cname][o].dtype for o in operands if o in comps[cname]]
                kind = types[0] if types else ins.dtype
            counts[kind] += 1
            executed[kind] += run_count(cname)
    out = {"fp8": counts.pop("fp8", 0), **dict(sorted(counts.items()))}
    out["total"] = sum(v for k, v in out.items())
    out["fp8_custom_calls"] = fp8_calls
    ex = {"fp8": executed.pop("fp8", 0), **dict(sorted(executed.items()))}
    ex["total"] = sum(ex.values())
    out["executed"] = ex
    return out


# --------------------------------------------------------------------------------------------
# The command


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per device program
        cost = cost[0] if cost else {}
    cost = cost or {}
    return {"flops": float(cost.get("flops", 0.0)), "transcendentals": float(cost.get("transcendentals", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def inspect_stage(cfg: Config, stage_index: int, hlo_out: str | None = None) -> dict:
    """Compile stage `stage_index` of `cfg` (AOT, abstract shapes) and report cost, memory and dots."""
    import jax

    from yxanul_jax.memory import estimate_stage
    from yxanul_jax.stages import compile_stage

    n = len(cfg.curriculum)
    if not -n <= stage_index < n:
        raise UserError(f"--stage {stage_index} is out of range: the config has {n} stage(s) (0..{n - 1})")
    stage_index %= n
    stage = cfg.curriculum[stage_index]
    platform = jax.devices()[0].platform
    if cfg.model.attention == "cudnn" and platform != "gpu":
        raise UserError(f"model.attention=cudnn needs an NVIDIA GPU with cuDNN (this machine runs {platform}); "
                        "inspect with model.attention=auto or xla here")
    if hlo_out:  # fail before a compile that may take minutes
        folder = os.path.dirname(os.path.abspath(hlo_out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(hlo_out):
            raise UserError(f"--hlo-out '{hlo_out}' cannot be written (no such writable folder, or it is a "
                            "folder); pass a file path in an existing folder")
    compiled = compile_stage(cfg, stage)
    text = compiled.as_text()
    if hlo_out:
        with open(hlo_out, "w", encoding="utf-8") as fh:
            fh.write(text)
    mem = compiled.memory_analysis()
    memory = {"argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": int(mem.output_size_in_bytes),
              "alias_bytes": int(mem.alias_size_in_bytes), "temp_bytes": int(mem.temp_size_in_bytes)}
    memory["peak_bytes"] = (memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"]
                            + memory["temp_bytes"])
    estimate = estimate_stage(cfg, stage, platform="cpu" if platform == "cpu" else "gpu")
    tokens = stage.grad_accum_steps * stage.batch_size * stage.seq_len
    cost = _cost(compiled)
    return {"model": cfg.model.name, "stage": stage_index, "seq_len": stage.seq_len, "batch_size": stage.batch_size,
            "grad_accum_steps": stage.grad_accum_steps, "tokens_per_step": tokens, "platform": platform,
            "fp8": {"enabled": cfg.fp8.active, "backend": cfg.fp8.backend, "targets": list(cfg.fp8.targets)},
            "cost": {**cost, "flops_per_token": cost["flops"] / tokens},
            "memory": memory, "planner_bytes": estimate["bytes_total"],
            "dots": count_dots(text), "hlo_out": hlo_out}


def format_report(r: dict) -> str:
    GB = 1e9
    c, m, d = r["cost"], r["memory"], r["dots"]
    lines = [f"model {r['model']} stage {r['stage']}: seq_len {r['seq_len']} x batch {r['batch_size']} x accum "
             f"{r['grad_accum_steps']} = {r['tokens_per_step']:,} tokens/step, compiled for {r['platform']}",
             f"FP8: {'on' if r['fp8']['enabled'] else 'off'} (backend {r['fp8']['backend']}, "
             f"targets {','.join(r['fp8']['targets'])})", "",
             f"{'cost analysis':<34}{'value':>16}",
             f"{'FLOPs per step':<34}{c['flops']:>16.4g}",
             f"{'FLOPs per token':<34}{c['flops_per_token']:>16.4g}",
             f"{'bytes accessed per step':<34}{c['bytes_accessed']:>16.4g}",
             f"{'transcendentals per step':<34}{c['transcendentals']:>16.4g}", "",
             f"{'memory analysis':<34}{'GB':>16}"]
    for key, label in [("argument_bytes", "arguments (state + batch)"), ("output_bytes", "outputs"),
                       ("alias_bytes", "aliased (donated state)"), ("temp_bytes", "temporaries"),
                       ("peak_bytes", "peak = args + out - alias + temp")]:
        lines.append(f"{label:<34}{m[key] / GB:>16.3f}")
    err = (r["planner_bytes"] - m["peak_bytes"]) / max(m["peak_bytes"], 1)
    lines.append(f"{'planner estimate (yxanul_jax.plan)':<34}{r['planner_bytes'] / GB:>16.3f}  ({100 * err:+.1f} %)")
    lines += ["", f"{'dots by precision':<20}{'in HLO':>10}{'executed':>10}"]
    for key in [k for k in d if k not in ("executed", "fp8_custom_calls", "total")] + ["total"]:
        lines.append(f"{key:<20}{d[key]:>10}{d['executed'].get(key, 0):>10}")
    if d["fp8_custom_calls"]:
        lines.append(f"(of the FP8 dots, {d['fp8_custom_calls']} are cuBLASLt FP8 GEMM custom calls)")
    if r["hlo_out"]:
        lines.append(f"optimized HLO written to {r['hlo_out']}")
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yxanul_jax.inspect", description=__doc__.splitlines()[0])
    add_config_args(parser)
    parser.add_argument("--stage", type=int, default=0, help="curriculum stage to compile (default 0)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding the whole report")
    parser.add_argument("--hlo-out", default=None, metavar="FILE", help="write the optimized HLO text here")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    report = inspect_stage(cfg, args.stage, args.hlo_out)
    print(format_report(report))
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
