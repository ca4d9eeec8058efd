"""Read optimized HLO text: its computations, and every matrix multiply with its precision, engine and role.

`parse_hlo` turns HLO text (`compiled.as_text()`) into computations of instructions; `gemms` lists
every GEMM (a `dot`, or a cuBLAS GEMM custom call) with

  * precision: `fp8` when an operand is, or traces back to, an 8-bit float value (through converts,
    scale multiplies, broadcasts, bitcasts, copies, reshapes, transposes, slices and fusion
    boundaries), else the operands' element type (bf16, f32, ...);
  * engine: `cublaslt` / `cublas` (GEMM custom calls), `te` (Transformer Engine's GEMM custom
    call, whose precision is read from its operand types), `triton` (a dot inside a Triton GEMM
    fusion), `cudnn` (inside a cuDNN fusion), `xla` (any other dot: CPU, or a loop fusion);
  * runs: how many times it executes per call, from the known trip counts of enclosing loops;
  * target: the model projection it belongs to (q, k, v, o, gate, up, down, head), read from
    the op_name metadata jax attaches, and phase: `backward` when that op_name is a transpose (VJP).

`count_dots` sums them by precision, as `python -m yxanul_jax.analyze` reports.
"""
from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

FP8_TYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3", "f8e4m3b11fnuz", "f8e3m4", "f8e8m0fnu")
# Ops a dequantized FP8 operand passes through on its way into a dot.
PASS_THROUGH = {"convert", "multiply", "divide", "broadcast", "bitcast", "bitcast-convert", "copy", "reshape",
                "transpose", "slice", "dynamic-slice", "get-tuple-element", "parameter", "fusion", "clamp",
                "copy-start", "copy-done", "optimization-barrier", "all-gather", "collective-permute",
                "fusion-start", "fusion-done"}  # an asynchronous fusion (XLA since jax 0.11): its start, then its value
DOT_OPS = {"dot", "convolution"}
CUBLAS_GEMMS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
TE_GEMMS = ("te_gemm_v2_ffi", "te_gemm_ffi")  # Transformer Engine's GEMM (operands: lhs, lhs scale, rhs, ...)
GEMM_TARGETS = CUBLAS_GEMMS + TE_GEMMS
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
    shape: str = ""  # the result's type text: `bf16[64,2048,768]{2,1,0}`, or `(f32[], s32[4])` for tuples


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
            dtype, type_str, rest = "tuple", rest[:end], rest[end:].lstrip()
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
        comps[current][name] = Instr(name, dtype, op, operands, args, rest[close:], current, is_root, type_str)
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


TARGET_RE = re.compile(r"/(q|k|v|o|gate|up|down)/gemm/|/attn/(qkv)/|/mlp/(gate_up)/|/(mlp)/fused/|/(head)_gemm/|Yxanul\.logits/(head)_gemm")
FUSION_KIND_RE = re.compile(r'"fusion_backend_config":\{"kind":"([^"]+)"')


@dataclasses.dataclass
class Gemm:
    """One matrix multiply of an HLO module."""

    name: str
    precision: str  # fp8, bf16, f32, ...
    engine: str  # cublaslt, cublas, te, triton, cudnn, xla
    runs: int  # executions per call of the module (loop trip counts)
    target: str  # q, k, v, o, gate, up, down, head, or "" (not a model projection)
    phase: str  # forward or backward
    op_name: str


_BRANCH_KEYS = ("branch_computations", "true_computation", "false_computation")


class HloGraph:
    """Parsed HLO with who-calls-whom, loop trip counts and FP8 provenance of values."""

    def __init__(self, hlo_text: str):
        self.comps = parse_hlo(hlo_text)
        self.entry = self.comps.get("__entry__")
        self.names = [c for c in self.comps if c != "__entry__"]
        self.callers: dict[str, list[tuple[str, Instr]]] = defaultdict(list)  # computation -> (kind, caller)
        for cname in self.names:
            for ins in self.comps[cname].values():
                for key in ("calls", "to_apply", "body", "condition", *_BRANCH_KEYS):
                    for callee in dict.fromkeys(_called(ins.attrs, key)):  # a branch listed twice runs once
                        self.callers[callee].append((key, ins))
        self._runs: dict[str, int] = {}

    def runs(self, cname: str, seen: tuple[str, ...] = ()) -> int:
        """How many times computation `cname` runs per call (known loop trip counts; 1 if unknown)."""
        if cname in self._runs:
            return self._runs[cname]
        if self.comps.get(cname) is self.entry or cname in seen:
            return 1
        total = 0
        for key, ins in self.callers.get(cname, []):
            if key in _BRANCH_KEYS and not self._may_take(ins, key, cname):
                continue
            n = self.runs(ins.computation, seen + (cname,))
            total += n * (_trip_count(ins.attrs) if key == "body" else 1)
        # 0 only under a branch that never runs (a loop or call inside one included)
        self._runs[cname] = total if self.callers.get(cname) else 1
        return self._runs[cname]

    def _may_take(self, cond: Instr, key: str, branch: str) -> bool:
        """Whether conditional `cond` may run `branch`: False only when its index (or predicate) is a
        constant naming another branch (XLA's rule: an index out of range runs the last branch). Only
        the taken branch of such a conditional runs; charging the others would predict kernels that
        never launch. An index known only at run time may take any branch: each is charged."""
        index = self.comps.get(cond.computation, {}).get(cond.operands[0]) if cond.operands else None
        if index is None or index.op != "constant":
            return True
        value = index.args.strip().lower()
        if key == "branch_computations":
            branches = _called(cond.attrs, key)
            if not value.lstrip("-").isdigit():
                return True
            taken = int(value) if 0 <= int(value) < len(branches) else len(branches) - 1
            return branches[taken] == branch
        return (value == "true") == (key == "true_computation")

    def _root(self, cname: str) -> Instr | None:
        return next((i for i in self.comps.get(cname, {}).values() if i.is_root), None)

    def reaches_fp8(self, cname: str, name: str) -> bool:
        """Whether value `name` of `cname` is, or is derived through pass-through ops from, an FP8 value."""
        stack, seen = [(cname, name, 0)], set()
        while stack:
            c, n, hops = stack.pop()
            if (c, n) in seen or hops > MAX_HOPS:
                continue
            seen.add((c, n))
            ins = self.comps.get(c, {}).get(n)
            if ins is None:
                continue
            if ins.dtype in FP8_TYPES:
                return True
            if ins.op not in PASS_THROUGH:
                continue
            if ins.op == "parameter":  # out of a fused computation: the fusion's operand
                idx = int(ins.args) if ins.args.strip().isdigit() else -1
                for key, call in self.callers.get(c, []):
                    if key == "calls" and 0 <= idx < len(call.operands):
                        stack.append((call.computation, call.operands[idx], hops + 1))
                continue
            if ins.op in ("fusion", "fusion-start"):  # into a fusion: its root (`fusion-done` reaches its start)
                for callee in _called(ins.attrs, "calls"):
                    root = self._root(callee)
                    if root is not None:
                        stack.append((callee, root.name, hops + 1))
                continue
            for o in ins.operands:
                stack.append((c, o, hops + 1))
        return False

    def _engine_of_computation(self, cname: str) -> str:
        """`triton` / `cudnn` when `cname` is (nested in) a Triton or cuDNN GEMM fusion, else `xla`."""
        todo, seen = [cname], set()
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            for key, ins in self.callers.get(c, []):
                m = FUSION_KIND_RE.search(ins.attrs) if key == "calls" else None
                if m and "triton" in m.group(1):
                    return "triton"
                if m and "cudnn" in m.group(1):
                    return "cudnn"
                if key == "calls":
                    todo.append(ins.computation)
        return "xla"

    def gemms(self) -> list[Gemm]:
        out = []
        for cname in self.names:
            for ins in self.comps[cname].values():
                target = _gemm_target(ins.attrs) if ins.op == "custom-call" else None
                if ins.op not in DOT_OPS and target is None:
                    continue
                operands = ins.operands[:2]
                if target in TE_GEMMS:  # operand types are in its layout constraints: lhs [0], rhs [2]
                    types = re.findall(r"([a-z][a-z0-9]*)\[", ins.attrs.split("operand_layout_constraints={", 1)[-1])
                    precision = "fp8" if any(t in FP8_TYPES for t in types[:3:2]) else (types[0] if types else ins.dtype)
                elif target == "__cublas$lt$matmul$f8" or any(self.reaches_fp8(cname, o) for o in operands):
                    precision = "fp8"
                else:
                    types = [self.comps[cname][o].dtype for o in operands if o in self.comps[cname]]
                    precision = types[0] if types else ins.dtype
                if target in TE_GEMMS:
                    engine = "te"
                elif target is not None:
                    engine = "cublaslt" if "$lt$" in target else "cublas"
                else:
                    engine = self._engine_of_computation(cname)
                m = re.search(r'op_name="([^"]*)"', ins.attrs)
                op_name = m.group(1) if m else ""
                t = TARGET_RE.search(op_name)
                out.append(Gemm(ins.name, precision, engine, self.runs(cname),
                                next((g for g in t.groups() if g), "") if t else "",
                                "backward" if "transpose(" in op_name else "forward", op_name))
        return out


def gemms(hlo_text: str) -> list[Gemm]:
    """Every GEMM of an HLO module (see the module docstring)."""
    return HloGraph(hlo_text).gemms()


def count_dots(hlo: "str | list[Gemm]") -> dict:
    """Matrix multiplies of an HLO module (its text, or its `gemms` already read) by precision.

    Returns {"fp8": n, "bf16": n, "f32": n, ... (other element types), "total": n,
    "fp8_custom_calls": n (cuBLASLt or TE FP8 GEMMs, included in "fp8"), "executed": {same keys, weighted
    by loop trip counts}}.
    """
    counts: dict[str, int] = defaultdict(int)
    executed: dict[str, int] = defaultdict(int)
    fp8_calls = 0
    for g in (gemms(hlo) if isinstance(hlo, str) else hlo):
        counts[g.precision] += 1
        executed[g.precision] += g.runs
        fp8_calls += g.engine in ("cublaslt", "te") and g.precision == "fp8"
    out = {"fp8": counts.pop("fp8", 0), **dict(sorted(counts.items()))}
    out["total"] = sum(v for k, v in out.items())
    out["fp8_custom_calls"] = fp8_calls
    ex = {"fp8": executed.pop("fp8", 0), **dict(sorted(executed.items()))}
    ex["total"] = sum(ex.values())
    out["executed"] = ex
    return out


def gemm_kinds(items: list[Gemm]) -> dict[str, dict[str, int]]:
    """{"precision engine": {"in_hlo": n, "executed": n}} over a list of GEMMs, e.g. "fp8 cublaslt"."""
    out: dict[str, dict[str, int]] = {}
    for g in items:
        row = out.setdefault(f"{g.precision} {g.engine}", {"in_hlo": 0, "executed": 0})
        row["in_hlo"] += 1
        row["executed"] += g.runs
    return dict(sorted(out.items(), key=lambda kv: (not kv[0].startswith("fp8"), kv[0])))


def custom_calls(hlo_text: str) -> dict[str, int]:
    """custom_call_target -> number of calls in the HLO text."""
    counts: dict[str, int] = defaultdict(int)
    for t in re.findall(r'custom_call_target="([^"]+)"', hlo_text):
        counts[t] += 1
    return dict(sorted(counts.items()))


def has_fp8_values(hlo_text: str) -> bool:
    """Whether any 8-bit float value is left in the module."""
    return re.search(r"\bf8e\w+\[", hlo_text) is not None
