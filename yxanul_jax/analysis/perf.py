"""Predict a compiled step's time on a GPU from its optimized HLO: every kernel, its FLOPs, bytes and roofline.

`kernels(hlo_text)` lists every kernel one call of the module launches: each instruction of a control
computation (the entry, while bodies and conditions, conditional branches, called computations) that
is not bookkeeping (parameter, tuple, get-tuple-element, bitcast, constant, the loops themselves), with

  * runs: executions per step, from the loops' known trip counts (nested loops multiply; `hlo.HloGraph`);
  * flops: the dots inside a fusion (also nested Triton GEMM fusions), a cuBLAS GEMM custom call
    (2 x output elements x contracted size; also inside XLA's dynamic-slice fusion, which runs and is
    traced as its GEMM), cuDNN flash attention (`attention_flops`); an asynchronous fusion
    (`fusion-start` ... `fusion-done`, jax 0.11) is one kernel, charged at its start;
  * bytes: every distinct operand read once and the result written once, except that an operand a
    fusion only slices (`slice`, `dynamic-slice`, `gather`) is charged the slices, a buffer updated in
    place (`dynamic-update-slice`, a loop-carried stack of layer activations) is charged the update,
    and a GEMM's workspace is not charged;
  * precision (fp8, bf16, tf32, f32) of a GEMM's operands (`hlo.HloGraph.gemms`: FP8 traced through
    dequantizing converts), and category (`CATEGORIES`) from its kind and `core.scopes` in its op_name.

`predict(kernels, gpu)` charges each kernel

    time = max(flops / (peak[precision] x efficiency), bytes / (HBM bandwidth x HBM_EFFICIENCY)) + LAUNCH_S

and sums them: XLA runs a step's kernels one after another on one stream (no overlap is assumed).
Efficiencies are assumptions, one place each, to be corrected by a measured run
(`scripts/gpu_bench.py` writes the measured / predicted ratio per category):

  * GEMM_EFFICIENCY: the share of the dense peak a large, well-shaped GEMM reaches (cuBLAS BF16 on
    an H100 SXM: ~750-800 of 989 TFLOP/s); times the wave efficiency of its 128 x 128 output tiles
    over the SMs (a GEMM of 6 tiles on 132 SMs runs at 6/132 of the rate, unless its contracted
    dimension is long enough for split-K, at most one split per 1,024 of it);
  * ATTENTION_EFFICIENCY: cuDNN / FlashAttention-class kernels at head_dim 64 reach about half the
    BF16 peak forward and 40 % backward (FlashAttention-2/3 papers); their work is counted in 64 x 64
    tiles, so a causal 2,048 sequence does about half the square and a sequence of 8 pays a whole tile;
  * ATTENTION_ITEM_US: and no cuDNN call is faster than its work items (one per batch row, head and
    64-row query tile) passing through the SMs at a fixed cost each, measured on an H200 (below): at a
    sequence of 8 that floor is 5x the tile FLOPs' time, and it is what makes XLA's attention win there;
  * FUSED_CE_MEASURED: our fused cross-entropy kernels (`model.fused_ce`, Pallas custom calls whose FLOPs XLA
    cannot see: counted from their operand shapes, `fused_ce.KERNELS`) at the share of the BF16 peak an H200 ran
    them at (scripts/fused_ce_check.py, 131,072 tokens x 200,064 rows, K 128, jax 0.11.2, 2026-11-28): the
    evaluation forward alone, and each pair of training kernels (the training forward and dw, Triton or Mosaic
    GPU) as a pair, since only their sum was timed (with the few XLA ops around them: the gathered target logits,
    the anchors, dx's sum). Their sm_90 SASS census (`analysis.kernel_census`, `fused_ce.TENSOR_SHARE`) predicts
    the forward within 4-6 % but the training pairs 1.9x (Mosaic) and 2.3x (Triton) faster than measured
    (scripts/fused_ce_sass.py --measured), so the census is a diagnostic of a loop, not the rate; a kernel no GPU
    has timed is charged FUSED_CE_EFFICIENCY (the 2026-11-26 kernels' 40 %) x its census share /
    FUSED_CE_MEASURED_SHARE (theirs, 49.2 %), as all were before, and a measurement of it belongs in the table.
    The Mosaic kernels' RS form (`:mosaic-rs`, not yet timed) keeps their names, so it is charged at the timed
    form's rate: its census clocks are within 1 % of that form's. A calibration multiplies a timed kernel by a
    ratio of its own (FUSED_CE_TIMED), not by its category's, which measured the error of the older guess;
  * HBM_EFFICIENCY: the share of the spec bandwidth a streaming kernel reaches (~90 %);
  * LAUNCH_S: the fixed cost of one kernel (launch and ramp, with XLA's CUDA graphs).

What is not modeled: L2 reuse between kernels (bytes are charged as HBM traffic: an upper bound for
buffers under the L2's size), concurrency between kernels, autotuning (a deviceless compile keeps
Triton's default tiles; a real GPU autotunes), collectives and host transfers.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

from yxanul_jax.analysis.gpus import GpuSpec
from yxanul_jax.analysis.hlo import FP8_TYPES, HloGraph, Instr, _called
from yxanul_jax.core import scopes

GEMM_EFFICIENCY = 0.80
ATTENTION_EFFICIENCY = {"forward": 0.50, "backward": 0.40}
FUSED_CE_MEASURED = {"fused_ce_fwd": 0.431, "fused_ce_fwd_dx": 0.385, "fused_ce_dw": 0.385,
                     "fused_ce_fwd_dx_ws": 0.542, "fused_ce_dw_ws": 0.542}  # docs/bench/h200_2026-11-28_fourteenth
FUSED_CE_EFFICIENCY = 0.40
FUSED_CE_MEASURED_SHARE = 0.492  # the H200-measured kernels' tensor clocks / all clocks by the census (BENCHMARKS)
HBM_EFFICIENCY = 0.90
LAUNCH_S = 2.5e-6
# Measured / predicted ratios per GPU and category, from profiled runs (`scripts/gpu_bench.py --profile`
# writes them): {"h100": {"ratios": {"attention": 1.1, ...}, "source": "gpu_bench 2026-..., H100 SXM"}}.
CALIBRATION_FILE = __file__.rsplit(".", 1)[0] + "_calibration.json"
GEMM_TILE = 128
ATTENTION_TILE = 64
# The floor of a cuDNN flash-attention call: ceil(items / SMs) waves of work items (batch x heads x query
# tiles), each costing ATTENTION_ITEM_US + ATTENTION_ITEM_US_PER_KEY x min(keys, ATTENTION_TILE) for the
# forward and backward together, the forward taking ATTENTION_FORWARD_SHARE. Measured on an H200 (jax
# 0.11.2, 2026-11-26): the stage-0 profile's cuDNN kernels, 1.78 ms forward and 2.76 ms backward per call
# at seq 8 (6.09 us per wave-item; the share), and the slope from one layer's forward + backward at seq 8,
# 16, 32 and 64 (scripts/attention_check.py: 7.9, 8.7, 11.2 and 15.5 us per wave-item of wall time, which
# also holds the timed function's own casts and sum, so scaled by the profile's 6.09 / 7.9 at seq 8; the
# line is within 2.3 % of the four). Applied to every GPU of the table (same SMs on an H100) and, above 64
# keys, where nothing was measured, as a lower bound: there the tile FLOPs normally dominate.
ATTENTION_ITEM_US = 5.16
ATTENTION_ITEM_US_PER_KEY = 0.107
ATTENTION_FORWARD_SHARE = 0.39

CATEGORIES = ("attention", "GEMM fp8", "GEMM bf16", "GEMM f32", "output head + loss", "norms + elementwise",
              "FP8 scaling", "optimizer", "copies", "collectives")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5, **{t: 1 for t in FP8_TYPES}}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
# Ops of a control computation that launch nothing (or whose work is counted where it starts).
_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
                "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain", "async-start",
                "async-update", "async-done", "copy-done", "all-reduce-done", "all-gather-done",
                "collective-permute-done", "send-done", "recv-done", "send", "recv", "fusion-done"}
# An asynchronous fusion (`fusion-start` ... `fusion-done`, XLA since jax 0.11) is one kernel, charged at its start.
_FUSIONS = ("fusion", "fusion-start")
_VIEWS = {"bitcast", "reshape", "get-tuple-element"}
# element-wise ops of one operand: inside a fusion they run per element a consumer takes, so a buffer converted and
# then gathered from (the loss's target logit out of BF16 logits) is read at the gathered elements only
_PER_ELEMENT = {"convert", "bitcast-convert", "negate"}
_SLICES = {"slice", "dynamic-slice", "gather"}
_MOVES = {"parameter", "constant", "bitcast", "reshape", "copy", "transpose", "slice", "dynamic-slice",
          "dynamic-update-slice", "concatenate", "pad", "broadcast", "tuple", "get-tuple-element", "iota", "reverse"}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_FMHA = "__cudnn$fmha"


def arrays(type_text: str) -> list[tuple[str, list[int]]]:
    """(element type, dims) of every array in an HLO type text (`(bf16[2,3]{1,0}, f32[])` -> two)."""
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _ARRAY.findall(type_text) if t in _BYTES]


def elements(type_text: str) -> int:
    """Elements of every array in a type text."""
    return sum(math.prod(d) for _, d in arrays(type_text))


def type_bytes(type_text: str, skip_workspace: bool = False) -> float:
    """Bytes of every array in a type text; `skip_workspace`: not a GEMM's scratch (a rank-1 u8 or s8 array)."""
    return sum(_BYTES[t] * math.prod(d) for t, d in arrays(type_text)
               if not (skip_workspace and t in ("u8", "s8") and len(d) == 1))


@dataclasses.dataclass
class Kernel:
    """One kernel launch site of a module, and what one launch costs."""

    name: str
    op: str  # fusion, custom-call, copy, ...
    kind: str  # fusion kind (kLoop, __triton_nested_gemm_fusion, ...) or custom-call target
    runs: int  # launches per call of the module
    flops: float  # per launch
    bytes: float  # per launch
    precision: str | None  # operand type of its GEMM (fp8, bf16, tf32, f32), "attention", or None
    category: str
    op_name: str
    tiles: int = 0  # a GEMM's 128 x 128 output tiles (x batch): its wave efficiency; attention: work items
    k: int = 0  # a GEMM's contracted size; attention: the key length
    phase: str = ""  # attention: forward or backward


# --------------------------------------------------------------------------------------------
# Reading kernels out of the HLO


def _op_name(ins: Instr) -> str:
    m = re.search(r'op_name="([^"]*)"', ins.attrs)
    return m.group(1) if m else ""


def _fusion_kind(ins: Instr) -> str:
    m = re.search(r'"fusion_backend_config":\{"kind":"([^"]+)"', ins.attrs)
    if m:
        return m.group(1)
    m = re.search(r"\bkind=(k\w+)", ins.attrs)
    return m.group(1) if m else ""


def _dims(attrs: str, key: str) -> list[int]:
    m = re.search(key + r"=\{([0-9,]*)\}", attrs)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


class _Reader:
    def __init__(self, text: str):
        self.g = HloGraph(text)
        self.comps = self.g.comps
        self.precision = {gm.name: gm.precision for gm in self.g.gemms()}

    def control_computations(self) -> list[str]:
        """The entry and every computation it runs as control flow (loop bodies, branches, calls)."""
        entry = next((c for c in self.g.names if self.comps[c] is self.g.entry), None)
        out, todo = [], [entry] if entry else []
        while todo:
            c = todo.pop()
            if c in out or c not in self.comps:
                continue
            out.append(c)
            for ins in self.comps[c].values():
                keys = {"while": ("body", "condition"), "conditional": ("branch_computations", "true_computation",
                        "false_computation"), "call": ("to_apply", "calls"), "async-start": ("calls",)}.get(ins.op, ())
                for key in keys:
                    todo.extend(_called(ins.attrs, key))
        return out

    def _shape(self, comp: str, name: str) -> str:
        ins = self.comps.get(comp, {}).get(name)
        return ins.shape if ins else ""

    # ---- FLOPs

    def _dot_flops(self, comp: str, ins: Instr) -> tuple[float, int, int]:
        """(FLOPs, output tiles, contracted size) of a dot instruction."""
        out = arrays(ins.shape)
        lhs = arrays(self._shape(comp, ins.operands[0])) if ins.operands else []
        if not out or not lhs:
            return 0.0, 0, 0
        out_dims, lhs_dims = out[0][1], lhs[0][1]
        k = math.prod(lhs_dims[i] for i in _dims(ins.attrs, "lhs_contracting_dims") if i < len(lhs_dims))
        n_batch = len(_dims(ins.attrs, "lhs_batch_dims"))
        batch = math.prod(out_dims[:n_batch])
        mn = out_dims[n_batch:] or [1]
        m_, n_ = (math.prod(mn[:-1]) if len(mn) > 1 else 1), mn[-1]
        tiles = batch * math.ceil(m_ / GEMM_TILE) * math.ceil(n_ / GEMM_TILE)
        return 2.0 * math.prod(out_dims) * k, tiles, k

    def _dots(self, comp: str, seen=None) -> list[tuple[str, Instr]]:
        """Dots of a fused computation and of the fusions nested in it."""
        seen = seen if seen is not None else set()
        if comp in seen:
            return []
        seen.add(comp)
        out = []
        for ins in self.comps.get(comp, {}).values():
            if ins.op in ("dot", "convolution"):
                out.append((comp, ins))
            elif ins.op == "fusion":
                for callee in _called(ins.attrs, "calls"):
                    out.extend(self._dots(callee, seen))
        return out

    def _dot_precision(self, ins: Instr) -> str:
        p = self.precision.get(ins.name, ins.dtype)
        if p == "fp8":
            return "fp8"
        if p in ("bf16", "f16"):
            return "bf16"
        if p == "f32":  # XLA's default precision runs float32 dots on TF32 tensor cores (Ampere and later)
            return "f32" if re.search(r"operand_precision=\{highest|algorithm=dot_f32_f32_f32", ins.attrs) else "tf32"
        return "bf16"

    # ---- bytes

    def _users(self, comp: str) -> dict[str, list[Instr]]:
        users = defaultdict(list)
        for ins in self.comps.get(comp, {}).values():
            for o in ins.operands:
                users[o].append(ins)
        return users

    def _read_bytes(self, comp: str, param: Instr, users: dict) -> float:
        """Bytes a fusion reads of one parameter: the slices when every use slices it (through views and per-element
        conversions), 0 for a buffer only updated in place, else all of it."""
        total, todo = 0.0, [param]
        per_element = type_bytes(param.shape) / max(1, elements(param.shape))
        while todo:
            v = todo.pop()
            for u in users.get(v.name, []):
                if u.op in _VIEWS or (u.op in _PER_ELEMENT and len(u.operands) == 1):
                    todo.append(u)
                elif u.op in _SLICES and u.operands and u.operands[0] == v.name:
                    # the slice's elements, at the parameter's width (a conversion before it reads no more)
                    total += per_element * elements(u.shape)
                elif u.op == "dynamic-update-slice" and u.operands and u.operands[0] == v.name:
                    continue
                else:
                    return type_bytes(param.shape)
        return total

    def _written_bytes(self, comp: str, root: Instr | None) -> float:
        if root is None:
            return 0.0
        parts = [self.comps[comp].get(o) for o in root.operands] if root.op == "tuple" else [root]
        total = 0.0
        for p in parts:
            if p is None:
                continue
            v = p
            while v.op in ("bitcast", "reshape") and v.operands and v.operands[0] in self.comps[comp]:
                v = self.comps[comp][v.operands[0]]
            if v.op == "dynamic-update-slice" and len(v.operands) > 1:
                total += type_bytes(self._shape(comp, v.operands[1]))
            else:  # a fused GEMM's workspace passes through the root: not written
                total += type_bytes(p.shape, skip_workspace=v.op == "get-tuple-element")
        return total

    def _fusion_bytes(self, ins: Instr) -> float:
        callee = (_called(ins.attrs, "calls") or [None])[0]
        comp = self.comps.get(callee)
        if comp is None:
            return self._plain_bytes(ins)
        params = {}
        for p in comp.values():
            if p.op == "parameter" and p.args.strip().isdigit():
                params[int(p.args)] = p
        users = self._users(callee)
        total, seen = 0.0, set()
        for i, operand in enumerate(ins.operands):
            if operand in seen:
                continue
            seen.add(operand)
            p = params.get(i)
            total += self._read_bytes(callee, p, users) if p else type_bytes(self._shape(ins.computation, operand))
        root = next((x for x in comp.values() if x.is_root), None)
        return total + self._written_bytes(callee, root)

    def _plain_bytes(self, ins: Instr) -> float:
        if ins.op == "dynamic-update-slice" and len(ins.operands) > 1:
            return 2 * type_bytes(self._shape(ins.computation, ins.operands[1]))
        if ins.op in _SLICES:
            return 2 * type_bytes(ins.shape)
        reads = sum(type_bytes(self._shape(ins.computation, o), skip_workspace=True)
                    for o in dict.fromkeys(ins.operands))
        return reads + type_bytes(ins.shape, skip_workspace=ins.op == "custom-call")

    def _is_move(self, callee: str) -> bool:
        return all(x.op in _MOVES for x in self.comps.get(callee, {}).values())

    # ---- kernels

    def kernel(self, comp: str, ins: Instr) -> Kernel | None:
        if ins.op in _NOT_KERNELS:
            return None
        op_name = _op_name(ins)
        runs = self.g.runs(comp)
        if not runs:  # a conditional's branch that a constant index never takes
            return None
        flops, tiles, k, precision, phase, name = 0.0, 0, 0, None, "", ins.name
        if ins.op in _FUSIONS:
            kind = _fusion_kind(ins)
            nbytes = self._fusion_bytes(ins)
            callee = (_called(ins.attrs, "calls") or [""])[0]
            if gemm := self._fused_gemm(ins, callee):
                # XLA's dynamic-slice fusion: a cuBLAS GEMM reading and writing slices of stacked buffers in
                # place. It runs, and is traced, as that GEMM.
                name, kind, op_name = gemm.name, "custom-call", _op_name(gemm)
                flops, tiles, k = self._custom_gemm_flops(gemm)
                precision = self._dot_precision(gemm)
            for c, dot in self._dots(callee):
                f, t, kk = self._dot_flops(c, dot)
                if f > flops:
                    tiles, k, precision = t, kk, self._dot_precision(dot)
                flops += f
        elif ins.op == "custom-call":
            m = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
            kind = m.group(1) if m else ""
            nbytes = self._plain_bytes(ins)
            if kind.startswith(_FMHA):
                phase = "backward" if "Backward" in kind else "forward"
                flops, precision = attention_flops(ins, phase), "attention"
                tiles, k = attention_items(ins)  # work items and keys: the call's floor (attention_floor_s)
            elif pallas := _pallas_kernel(op_name):
                flops, precision = _pallas_flops(ins, pallas, self), "fused_ce"
            elif kind.startswith("__cublas") or kind in ("te_gemm_v2_ffi", "te_gemm_ffi"):
                flops, tiles, k = self._custom_gemm_flops(ins)
                precision = self._dot_precision(ins)
        else:
            kind = ins.op
            nbytes = self._plain_bytes(ins)
            if ins.op in ("dot", "convolution"):
                flops, tiles, k = self._dot_flops(comp, ins)
                precision = self._dot_precision(ins)
        kernel = Kernel(name, ins.op, kind, runs, flops, nbytes, precision, "", op_name, tiles, k, phase)
        kernel.category = self._category(ins, kernel)
        return kernel

    def _fused_gemm(self, ins: Instr, callee: str) -> Instr | None:
        """The cuBLAS GEMM custom call of XLA's dynamic-slice fusion (one per fusion), else None."""
        if '"name":"dynamic_slice_fusion"' not in ins.attrs:
            return None
        gemms = [x for x in self.comps.get(callee, {}).values()
                 if x.op == "custom-call" and re.search(r'custom_call_target="__cublas', x.attrs)]
        return gemms[0] if len(gemms) == 1 else None

    def _result_shape(self, ins: Instr) -> str:
        """What an instruction produces: for a `fusion-start` (typed ((operands), result, context)), its callee's."""
        if ins.op != "fusion-start":
            return ins.shape
        comp = self.comps.get((_called(ins.attrs, "calls") or [""])[0], {})
        return next((x.shape for x in comp.values() if x.is_root), "")

    def _custom_gemm_flops(self, ins: Instr) -> tuple[float, int, int]:
        out = arrays(ins.shape)
        lhs = arrays(self._shape(ins.computation, ins.operands[0])) if ins.operands else []
        m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', ins.attrs)
        b = re.search(r'"lhs_batch_dimensions":\[([^\]]*)\]', ins.attrs)
        if not out or not lhs or not m:
            return 0.0, 0, 0
        contracting = [int(x.strip('" ')) for x in m.group(1).split(",") if x.strip('" ')]
        n_batch = len([x for x in (b.group(1).split(",") if b else []) if x.strip('" ')])
        k = math.prod(lhs[0][1][i] for i in contracting if i < len(lhs[0][1]))
        out_dims = out[0][1]
        mn = out_dims[n_batch:] or [1]
        tiles = math.prod(out_dims[:n_batch]) * math.ceil(math.prod(mn[:-1]) / GEMM_TILE) * math.ceil(mn[-1] / GEMM_TILE)
        return 2.0 * math.prod(out_dims) * k, tiles, k

    def _category(self, ins: Instr, k: Kernel) -> str:
        path = re.split(r"[/()]", k.op_name)
        if scopes.OPTIMIZER in path:
            return "optimizer"
        if k.precision == "attention" or scopes.ATTENTION in path:
            return "attention"
        if scopes.LOSS in path or k.precision == "fused_ce":
            return "output head + loss"
        if k.op.startswith(_COLLECTIVES):
            return "collectives"
        if k.flops > 0 and k.precision:
            return "GEMM " + ("f32" if k.precision in ("tf32", "f32") else k.precision)
        if scopes.FP8_SCALING in path or any(t in FP8_TYPES for t, _ in arrays(self._result_shape(ins))):
            return "FP8 scaling"
        if ins.op in _MOVES or (ins.op in _FUSIONS and self._is_move((_called(ins.attrs, "calls") or [""])[0])):
            return "copies"
        return "norms + elementwise"

    def kernels(self) -> list[Kernel]:
        out = []
        for comp in self.control_computations():
            for ins in self.comps[comp].values():
                k = self.kernel(comp, ins)
                if k is not None:
                    out.append(k)
        return out


def _pallas_kernel(op_name: str) -> str | None:
    """The name of one of our Pallas kernels (`fused_ce.KERNELS`) that an op_name belongs to, or None."""
    from yxanul_jax.model.fused_ce import KERNELS

    return next((k for k in KERNELS if re.search(r"\b" + k + r"\b", op_name)), None)


def fused_ce_calls(hlo_text: str) -> dict[str, str]:
    """Our fused cross-entropy kernels compiled into an optimized HLO as custom calls: kernel name (`fused_ce.KERNELS`)
    -> custom_call_target (`mosaic_gpu_v2`, Triton's `__gpu$xla.gpu.triton`). Empty where they run in interpret mode
    (a CPU): there they are plain HLO ops."""
    return {_pallas_kernel(k.op_name): k.kind for k in kernels(hlo_text) if k.precision == "fused_ce"}


def fused_ce_efficiency(name: str | None) -> float:
    """The share of the BF16 peak a fused cross-entropy kernel runs at: as measured (FUSED_CE_MEASURED), or for a
    kernel no GPU has timed FUSED_CE_EFFICIENCY scaled by its SASS census's tensor share (`fused_ce.TENSOR_SHARE`)
    against the 2026-11-26 kernels' (module docstring)."""
    from yxanul_jax.model.fused_ce import TENSOR_SHARE

    if name in FUSED_CE_MEASURED:
        return FUSED_CE_MEASURED[name]
    return FUSED_CE_EFFICIENCY * TENSOR_SHARE.get(name, FUSED_CE_MEASURED_SHARE) / FUSED_CE_MEASURED_SHARE


def _pallas_flops(ins: Instr, name: str, reader: "_Reader") -> float:
    """FLOPs of a fused cross-entropy kernel: KERNELS[name] x 2 T K V from its operands x [T, K], w [V, K]."""
    from yxanul_jax.model.fused_ce import KERNELS

    shapes = [arrays(reader._shape(ins.computation, o)) for o in ins.operands[:2]]
    if len(shapes) < 2 or not shapes[0] or not shapes[1]:
        return 0.0
    (T, K), V = shapes[0][0][1][:2], shapes[1][0][1][0]
    return KERNELS[name] * 2.0 * T * K * V


def attention_flops(ins: Instr, phase: str) -> float:
    """FLOPs a cuDNN flash-attention call executes, counted in ATTENTION_TILE-square tiles: forward
    2 matmuls (QK^T, PV), backward 5 (QK^T again, dP, dV, dQ, dK), each 2 x tile^2 x head_dim per tile;
    a causal mask skips the tiles above the diagonal (T (T + 1) / 2 of T^2 are computed)."""
    q, kv = _attention_shapes(ins)
    if not q:
        return 0.0
    B, Lq, H, D = q
    Lk = kv[1]
    tq, tk = math.ceil(Lq / ATTENTION_TILE), math.ceil(Lk / ATTENTION_TILE)
    causal = '"mask_type": "CAUSAL"' in ins.attrs or '"mask_type":"CAUSAL"' in ins.attrs
    tiles = tq * (tq + 1) // 2 if causal and tq == tk else tq * tk
    matmuls = 5 if phase == "backward" else 2
    return matmuls * 2.0 * B * H * tiles * ATTENTION_TILE * ATTENTION_TILE * D


def _attention_shapes(ins: Instr) -> tuple[list[int], list[int]]:
    """The query [B, Lq, H, D] and key [B, Lk, G, D] dims of a cuDNN attention call (empty if unreadable)."""
    shapes = arrays(ins.attrs.split("operand_layout_constraints=", 1)[-1])[:2]
    return (shapes[0][1], shapes[1][1]) if len(shapes) == 2 else ([], [])


def attention_items(ins: Instr) -> tuple[int, int]:
    """(work items, keys) of a cuDNN flash-attention call: one item per batch row, head and
    ATTENTION_TILE-row query tile; keys is the key sequence length."""
    q, kv = _attention_shapes(ins)
    if not q:
        return 0, 0
    B, Lq, H, _ = q
    return B * H * math.ceil(Lq / ATTENTION_TILE), kv[1]


def attention_floor_s(k: "Kernel", gpu: GpuSpec) -> float:
    """The fixed-cost floor of a cuDNN attention call (ATTENTION_ITEM_US): its items in waves over the SMs."""
    if k.tiles <= 0:
        return 0.0
    share = ATTENTION_FORWARD_SHARE if (k.phase or "forward") == "forward" else 1 - ATTENTION_FORWARD_SHARE
    item_s = 1e-6 * (ATTENTION_ITEM_US + ATTENTION_ITEM_US_PER_KEY * min(k.k, ATTENTION_TILE)) * share
    return math.ceil(k.tiles / gpu.sms) * item_s


def kernels(hlo_text: str) -> list[Kernel]:
    """Every kernel launch site of an optimized HLO module (see the module docstring)."""
    return _Reader(hlo_text).kernels()


def hlo_flops(items: "list[Kernel] | str") -> float:
    """FLOPs one call of the module executes (GEMMs and attention, loop trip counts applied): what XLA's
    own cost analysis undercounts by counting a loop body once."""
    items = kernels(items) if isinstance(items, str) else items
    return sum(k.flops * k.runs for k in items)


# --------------------------------------------------------------------------------------------
# The roofline


def kernel_time(k: Kernel, gpu: GpuSpec) -> tuple[float, str]:
    """(seconds per launch, what bounds it: compute, memory or launch)."""
    memory_s = k.bytes / (gpu.hbm_bytes_per_s * HBM_EFFICIENCY)
    compute_s = 0.0
    if k.flops and k.precision == "attention":
        compute_s = max(k.flops / (gpu.rate("bf16") * ATTENTION_EFFICIENCY[k.phase or "forward"]),
                        attention_floor_s(k, gpu))
    elif k.flops and k.precision == "fused_ce":
        compute_s = k.flops / (gpu.rate("bf16") * fused_ce_efficiency(_pallas_kernel(k.op_name)))
    elif k.flops and k.precision:
        compute_s = k.flops / (gpu.rate(k.precision) * GEMM_EFFICIENCY * wave_efficiency(k, gpu))
    bound = max((compute_s, "compute"), (memory_s, "memory"), (LAUNCH_S, "launch"))[1]
    return max(compute_s, memory_s) + LAUNCH_S, bound


def wave_efficiency(k: Kernel, gpu: GpuSpec) -> float:
    """Share of the SMs a GEMM's output tiles keep busy over its waves (split-K fills up to one split
    per 1,024 of the contracted size)."""
    if k.tiles <= 0:
        return 1.0
    splits = max(1, min(math.ceil(gpu.sms / k.tiles), k.k // 1024)) if k.tiles < gpu.sms else 1
    work = k.tiles * splits
    return work / (math.ceil(work / gpu.sms) * gpu.sms)


def load_calibration(gpu_key: str, path: str | None = None) -> dict | None:
    """The measured / predicted time ratio per category for `gpu_key`, from CALIBRATION_FILE (written
    from a profiled run by `scripts/gpu_bench.py --profile`), or None when that GPU was never measured."""
    import json
    import os

    path = path or CALIBRATION_FILE
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        entry = json.load(fh).get(gpu_key)
    return entry or None


# Calibrated apart from cuDNN's kernels: attention written as XLA kernels (`short_attention`, XLA's own), its
# GEMMs apart from its other fusions. H200, 2026-11-26: the fusions of XLA's attention ran at 1.5x their roofline
# at a sequence of 32 and `short_attention`'s reductions of broadcast products at 5.7x at 8, where its batched
# GEMMs ran at 1.07x and cuDNN's calls at 1.4x. One ratio for all of them would move each by the others' error.
ATTENTION_XLA = "attention, XLA kernels"
ATTENTION_XLA_GEMM = "attention, XLA GEMMs"
# The fused cross-entropy kernels charged at a rate a GPU timed (FUSED_CE_MEASURED, an H200's) take a ratio of their
# own: their category's ratio was measured against the rate FUSED_CE_EFFICIENCY guessed for older kernels, and on top
# of a timed rate it would count the error of that guess again. A GPU without the key (the H200 that timed them)
# takes 1.0; the H100's is how much longer it took than the H200 over the same cells' head + loss kernels
# (perf_calibration.json). A profile older than the timing (FUSED_CE_MEASURED_DATE) ran other kernels under these
# names: re-read with today's model it gives neither head + loss ratio (scripts/gpu_bench.py `reread_profile`).
FUSED_CE_TIMED = "output head + loss, timed kernels"
FUSED_CE_MEASURED_DATE = "2026-11-28"  # the day an H200 timed the kernels FUSED_CE_MEASURED holds


def calibration_key(k: Kernel) -> str:
    """The calibration ratio a kernel takes: its category's, except attention outside cuDNN: its GEMMs
    (ATTENTION_XLA_GEMM) and its other kernels (ATTENTION_XLA), and a fused cross-entropy kernel charged at a
    GPU-timed rate (FUSED_CE_TIMED)."""
    if k.precision == "fused_ce" and _pallas_kernel(k.op_name) in FUSED_CE_MEASURED:
        return FUSED_CE_TIMED
    if k.category != "attention" or k.precision == "attention":
        return k.category
    return ATTENTION_XLA_GEMM if k.flops > 0 and k.precision else ATTENTION_XLA


def category_ratios(items: list[Kernel], gpu: GpuSpec, measured_ms: dict[str, float]) -> dict[str, dict]:
    """Measured against predicted time per calibration key (`calibration_key`). `measured_ms`: kernel (HLO
    instruction) name -> measured milliseconds per step (a profile's device time, summed over launches).
    `ratio` is measured over the predicted time of the kernels the profile saw (`matched_predicted_ms`): a
    kernel it did not see (counted under `unmatched`) says nothing about the model's error. `predicted_ms`
    is the whole key's. This ratio is what a calibration multiplies a key's kernels by (scripts/gpu_bench.py
    sums these rows over its cells)."""
    out: dict[str, dict] = {}
    for k in items:
        row = out.setdefault(calibration_key(k), {"predicted_ms": 0.0, "matched_predicted_ms": 0.0,
                                                  "measured_ms": 0.0, "unmatched": 0})
        ms = 1e3 * kernel_time(k, gpu)[0] * k.runs
        row["predicted_ms"] += ms
        if k.name in measured_ms:
            row["measured_ms"] += measured_ms[k.name]
            row["matched_predicted_ms"] += ms
        else:
            row["unmatched"] += 1
    for row in out.values():
        ok = row["measured_ms"] > 0 and row["matched_predicted_ms"] > 0
        row["ratio"] = row["measured_ms"] / row["matched_predicted_ms"] if ok else None
    return out


def predict(items: list[Kernel], gpu: GpuSpec, model_flops: float | None = None, tokens: int | None = None,
            top: int = 12, calibration: dict | None = None) -> dict:
    """The step's predicted time on `gpu`, by category and by kernel, as JSON-ready values. `calibration`
    (`load_calibration`): {"ratios": {calibration key: measured / predicted}, "source": "..."} multiplies each
    key's kernels (`calibration_key`); without one the prediction is the spec sheet's roofline alone."""
    ratios = (calibration or {}).get("ratios", {})
    cats = {c: {"kernels": 0, "launches": 0, "flops": 0.0, "bytes": 0.0, "ms": 0.0} for c in CATEGORIES}
    rows = []
    for k in items:
        t, bound = kernel_time(k, gpu)
        t *= ratios.get(calibration_key(k)) or 1.0
        c = cats[k.category]
        c["kernels"] += 1
        c["launches"] += k.runs
        c["flops"] += k.flops * k.runs
        c["bytes"] += k.bytes * k.runs
        c["ms"] += 1e3 * t * k.runs
        rows.append((1e3 * t * k.runs, k, bound))
    step_ms = sum(c["ms"] for c in cats.values())
    for c in cats.values():
        c["share"] = c["ms"] / step_ms if step_ms else 0.0
    rows.sort(key=lambda r: -r[0])
    out = {"gpu": gpu.key, "gpu_label": gpu.label, "predicted_step_ms": step_ms,
           "hlo_flops": hlo_flops(items), "hlo_bytes": sum(k.bytes * k.runs for k in items),
           "kernel_launches": sum(k.runs for k in items), "kernel_sites": len(items),
           "categories": {n: c for n, c in cats.items() if c["kernels"]},
           "top_kernels": [{"name": k.name, "category": k.category, "runs": k.runs, "ms": ms, "bound": bound,
                            "tflops": k.flops * k.runs / 1e12, "gb": k.bytes * k.runs / 1e9,
                            "op_name": k.op_name.removeprefix("jit(train_step)/")} for ms, k, bound in rows[:top]],
           "constants": {"gemm_efficiency": GEMM_EFFICIENCY, "attention_efficiency": ATTENTION_EFFICIENCY,
                         "attention_item_us": [ATTENTION_ITEM_US, ATTENTION_ITEM_US_PER_KEY, ATTENTION_FORWARD_SHARE],
                         "hbm_efficiency": HBM_EFFICIENCY, "launch_s": LAUNCH_S, "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
                         "peak_flops": gpu.rates, "source": gpu.source},
           "calibration": (calibration or {}).get("source", "none: spec-sheet constants, not yet measured")}
    if model_flops is not None and step_ms:
        out["model_flops"] = model_flops
        out["predicted_mfu"] = model_flops / (step_ms / 1e3) / gpu.peak_bf16
    if tokens and step_ms:
        out["predicted_tokens_per_s"] = tokens / (step_ms / 1e3)
    return out


def format_prediction(p: dict, other: dict | None = None, labels: tuple[str, str] = ("", "")) -> str:
    """The prediction as a table (one column, or two side by side with their difference)."""
    lines = []
    if other is None:
        lines.append(f"predicted on {p['gpu_label']} (roofline of the optimized HLO; analysis/perf.py; a prediction, "
                     f"not a measurement; calibration: {p['calibration']})")
        lines.append(f"{'category':<22}{'kernels':>8}{'launches':>10}{'TFLOP':>9}{'GB':>9}{'ms':>9}{'share':>8}")
        for name, c in sorted(p["categories"].items(), key=lambda kv: -kv[1]["ms"]):
            lines.append(f"{name:<22}{c['kernels']:>8}{c['launches']:>10}{c['flops'] / 1e12:>9.1f}"
                         f"{c['bytes'] / 1e9:>9.1f}{c['ms']:>9.1f}{100 * c['share']:>7.1f}%")
        lines.append(f"{'step':<22}{p['kernel_sites']:>8}{p['kernel_launches']:>10}{p['hlo_flops'] / 1e12:>9.1f}"
                     f"{p['hlo_bytes'] / 1e9:>9.1f}{p['predicted_step_ms']:>9.1f}{100.0:>7.1f}%")
        lines += ["", "top kernels", f"{'ms':>8}{'runs':>6}  {'bound':<8}{'category':<22}name (op_name)"]
        for r in p["top_kernels"]:
            lines.append(f"{r['ms']:>8.2f}{r['runs']:>6}  {r['bound']:<8}{r['category']:<22}{r['name']} "
                         f"({r['op_name'][-70:]})")
        lines.append("")
        lines.append(_summary(p))
        return "\n".join(lines)
    a, b = labels
    lines.append(f"predicted on {p['gpu_label']}: A = {a}, B = {b}")
    lines.append(f"{'category':<22}{'A ms':>9}{'B ms':>9}{'B - A':>9}")
    for name in CATEGORIES:
        ca, cb = p["categories"].get(name, {}).get("ms", 0.0), other["categories"].get(name, {}).get("ms", 0.0)
        if ca or cb:
            lines.append(f"{name:<22}{ca:>9.1f}{cb:>9.1f}{cb - ca:>+9.1f}")
    lines.append(f"{'step':<22}{p['predicted_step_ms']:>9.1f}{other['predicted_step_ms']:>9.1f}"
                 f"{other['predicted_step_ms'] - p['predicted_step_ms']:>+9.1f}")
    lines += ["", "A: " + _summary(p), "B: " + _summary(other)]
    return "\n".join(lines)


def _summary(p: dict) -> str:
    parts = [f"predicted {p['predicted_step_ms']:.1f} ms/step"]
    if "predicted_tokens_per_s" in p:
        parts.append(f"{p['predicted_tokens_per_s']:,.0f} tokens/s")
    if "predicted_mfu" in p:
        parts.append(f"MFU {100 * p['predicted_mfu']:.1f} % (model FLOPs {p['model_flops'] / 1e12:.1f} T over the "
                     "dense BF16 peak)")
    parts.append(f"HLO FLOPs {p['hlo_flops'] / 1e12:.1f} T with trip counts")
    return ", ".join(parts)
