"""What our Pallas (Triton) kernels compile to for sm_90, instruction by instruction, and the cycles per tile that
follow: the part of the performance model that XLA's HLO cannot show (a custom call is opaque to it).

    ptx = kernel_ptx(jax.jit(f).lower(*args))        # {kernel name: its PTX}, from a deviceless sm_90 compile
    code, regs, spilled = assemble(ptx["fused_ce_dw"])  # its SASS (ptxas + nvdisasm), registers and spills
    loop = inner_loop(code)                            # the kernel's hottest loop: SASS opcodes and their counts
    cycles = tile_cycles(loop, warps=8)                # {"tensor", "issue", "mufu", "total"} clocks
    moved = smem_bytes(loop, warps=8)                  # bytes through shared memory per iteration (not charged)

The SASS comes from CUDA's own tools on the compile machine: `ptxas` (the gpu-check environment has it, with
jax-cuda12-plugin's nvcc) assembles the PTX XLA wrote, and `nvdisasm` (the `nvidia-cuda-nvdisasm` wheel, added
to that environment by scripts/gpu_check_env.sh) prints it. Without nvdisasm only the PTX is at hand.

The cycle model of one loop iteration of one thread block (`tile_cycles`), per SM of an H100/H200 (GH100), walks
the loop's SASS in order:
  * tensor: each wgmma's FLOPs (and mma.sync's) at 4,096 dense BF16 FLOP per clock (4 tensor cores x 512 FMA),
    beside the rest;
  * issue: every SASS instruction of every warp takes one of the 4 schedulers' issue slots for a clock;
  * MUFU: each exp (`MUFU.EX2`) takes the special-function units, 16 lanes per clock, beside the issue;
  * a wgmma wait (`WARPGROUP.DEPBAR`) stops the issue until the GEMMs it names are done, and a wgmma that reads
    a softmax tile (registers traced back to an exp), or the store of that tile to shared memory, starts only
    once the exps before it are done.
So a loop that waits for its GEMM before the softmax that reads it costs tensor + max(issue, MUFU), and one that
issues the next tile's GEMM before this tile's softmax hides the one under the other. `scripts/fused_ce_sass.py`
checks the model against the kernels measured on an H200 (docs/BENCHMARKS.md) and prints it for today's.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

from yxanul_jax.core.environ import environ

TENSOR_FLOP_PER_CLOCK = 4096  # dense BF16 per SM per clock, GH100 (989.4 TFLOP/s = 132 SMs x 4096 x 1.83 GHz)
ISSUE_PER_CLOCK = 4  # warp instructions per SM per clock (4 schedulers)
MUFU_PER_CLOCK = 16  # special-function results per SM per clock (ex2)
SMEM_BYTES_PER_CLOCK = 128  # shared memory per SM per clock, GH100 (32 banks x 4 bytes)
_WGMMA_BYTES = {"HGMMA": 2, "QGMMA": 1, "IGMMA": 1}  # a wgmma's operand element (16-bit; FP8; int8); TF32 takes 4
THREADS_PER_WARP = 32


def kernel_ptx(lowered) -> dict[str, str]:
    """{entry name: PTX} of every kernel the compile of `lowered` (a jax `Lowered` for a deviceless CUDA device,
    `gpu_target.compile_device`) writes, read from XLA's dump (`xla_dump_to`, a temporary folder). Each entry maps
    to its whole PTX module: one kernel for a Triton custom call (`assemble` assumes that)."""
    with tempfile.TemporaryDirectory() as d:
        lowered.compile(compiler_options={"xla_dump_to": d})
        out = {}
        for path in sorted(glob.glob(os.path.join(d, "*.ptx"))):
            text = open(path).read()
            for name in re.findall(r"\.entry\s+([A-Za-z_][\w$]*)", text):
                out[name] = text
        return out


def mosaic_ptx(compile_fn: Callable[[], object]) -> dict[str, str]:
    """{kernel name: PTX} of every Mosaic GPU kernel that `compile_fn()` (a deviceless compile) builds. The CUDA
    plugin compiles those itself, not XLA's dump, and writes their PTX where MOSAIC_GPU_DUMP_TO names (read at each
    compile); the name is the kernel's body function (`model.fused_ce_ws`). The plugin writes the PTX version of
    the first ptxas on PATH (without one, a newer version than jaxlib's CUDA 12 ptxas reads), so `tool("ptxas")`
    goes first on PATH meanwhile. In this mode the plugin also prints "nvdisasm invocation failed" (here even with
    nvdisasm on PATH): harmless, `assemble` makes the SASS from the PTX."""
    with tempfile.TemporaryDirectory() as d:
        ptxas = tool("ptxas")
        path = {"PATH": os.path.dirname(ptxas) + os.pathsep + os.environ.get("PATH", "")} if ptxas else {}
        with environ(MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=d, **path):
            compile_fn()
        return {os.path.basename(p).rsplit("_", 1)[0]: open(p).read()
                for p in sorted(glob.glob(os.path.join(d, "*.ptx")))}


def tool(name: str) -> str | None:
    """A CUDA tool (`ptxas`, `nvdisasm`): from an NVIDIA wheel of this Python's environment (nvidia/*/bin: the
    ptxas of jaxlib's CUDA), else on PATH, else None."""
    for base in sys.path:
        for path in sorted(glob.glob(os.path.join(base, "nvidia", "*", "bin", name))):
            if os.access(path, os.X_OK):
                return path
    return shutil.which(name)


def assemble(ptx: str, arch: str = "sm_90a") -> tuple[str, int, int] | None:
    """(SASS, registers per thread, bytes spilled) of a PTX module: one `ptxas -v -arch` run writes the cubin and
    reports its registers, `nvdisasm -c` prints it. None where either tool is missing."""
    ptxas, nvdisasm = tool("ptxas"), tool("nvdisasm")
    if not ptxas or not nvdisasm:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([ptxas, f"-arch={arch}", "-v", src, "-o", cubin], check=True, capture_output=True,
                             text=True).stderr
        code = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return code, int(regs.group(1)) if regs else 0, sum(int(n) for n in spills)


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of a kernel's SASS: its instructions in order (`body`), and its opcodes (without modifiers, e.g.
    FFMA, MUFU, HGMMA) with their counts per iteration, per thread (a warp issues each once)."""

    body: tuple[str, ...]

    @property
    def ops(self) -> dict:
        return dict(collections.Counter(_opcode(t) for t in self.body))

    @property
    def instructions(self) -> int:
        return len(self.body)

    def count(self, *opcodes: str) -> int:
        ops = self.ops
        return sum(ops.get(o, 0) for o in opcodes)


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")


def loops(sass_text: str) -> list[Loop]:
    """Every loop of the SASS (a branch back to an earlier label), innermost first by size."""
    instrs, label_at, pending = [], {}, []
    for line in sass_text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                label_at[name] = addr
            pending = []
            instrs.append((addr, m.group(2)))
    out = []
    for addr, text in instrs:
        m = re.search(r"\bBRA\b.*?\.?(L_x_\d+)", text)
        if m and label_at.get(m.group(1), addr + 1) < addr:
            lo = label_at[m.group(1)]
            out.append(Loop(tuple(t for a, t in instrs if lo <= a <= addr)))
    return sorted(out, key=lambda lp: lp.instructions)


def _strip(text: str) -> str:
    """An instruction without its predicate: `@!P0 FFMA.FTZ R1, ...` -> `FFMA.FTZ R1, ...`."""
    return re.sub(r"^@!?U?P\w+\s+", "", text)


def _opcode(text: str) -> str:
    """`@!P0 FFMA.FTZ R1, ...` -> FFMA."""
    return _strip(text).split()[0].split(".")[0]


def inner_loop(sass_text: str) -> Loop:
    """The loop that holds the kernel's GEMMs (wgmma, or mma.sync where Triton falls back to it) and exps (MUFU):
    the one the tiles iterate. Where there are several, the smallest: a kernel's rarely taken fallback (the training
    forward's online-max walk, `model.fused_ce._dx_kernel`) is a larger loop than its fast path."""
    hot = [lp for lp in loops(sass_text) if lp.count("HGMMA", "HMMA") and lp.count("MUFU")]
    if not hot:
        raise ValueError("no loop with both HGMMA and MUFU instructions in this SASS")
    return hot[0]


def tile_cycles(loop: Loop, warps: int, iterations: int = 4) -> dict[str, float]:
    """Clocks per iteration of one thread block on one SM, by walking the loop's instructions in order
    (`iterations` times, the steady state's average):
      * each instruction takes warps / 4 clocks of issue;
      * an exp (MUFU) also takes warps x 32 / 16 clocks of the special-function units, beside the issue;
      * a wgmma (HGMMA, m x n x k per warpgroup) queues its 2 m n k (warps / 4) FLOPs on the tensor cores, beside
        both;
      * a wgmma, or a store to shared memory for one (`STSM`), that reads a register holding an exp or a value
        computed from one in this iteration (a softmax tile) waits for the exps issued before it, as does the end
        of an iteration;
      * a `WARPGROUP.DEPBAR.LE gsb0, N` waits until at most N of the committed wgmma groups are still running.
    Register dependencies are not tracked otherwise: between those points the exps and the other instructions
    overlap. Work issued between a group's wgmma and its wait runs beside it: a loop that issues one GEMM before
    the exps of another tile overlaps them, one that waits for each GEMM before the softmax that reads it adds
    them up. Returns the tensor, issue and MUFU clocks per iteration, the walked `total`, and where the tensor
    cores stand idle in the last iteration (`idle_before` its first GEMM starts: operands being stored for it;
    `idle_between` GEMMs; `idle_after` the last one ends: the iteration's tail): what a faster loop must remove."""
    per_issue = warps / ISSUE_PER_CLOCK
    per_mufu = warps * THREADS_PER_WARP / MUFU_PER_CLOCK
    now = tensor_free = mufu_free = 0.0
    done: list[float] = []  # completion clock of each committed wgmma group
    marks = []
    tensor = 0.0
    busy: list[tuple[float, float]] = []  # the tensor cores' work: (start, end) clocks of each wgmma
    for _ in range(iterations):
        marks.append(now)
        from_exp: set[str] = set()  # registers holding an exp or a value computed from one, this iteration
        for text in loop.body:
            op = _opcode(text)
            dest, reads = _registers(text)
            if reads & from_exp:
                if op in ("HGMMA", "STSM"):
                    # values made from exps become a wgmma operand (in registers, or through shared memory)
                    now = max(now, mufu_free)
                elif dest:
                    from_exp.add(dest)
            elif dest:
                from_exp.discard(dest)
            if op in ("HGMMA", "HMMA"):
                # a wgmma (m x n x k per warpgroup), or an mma.sync (HMMA.MNK, per warp: Triton's fallback where a
                # GEMM has fewer than 64 rows a warpgroup), counted at the wgmma rate: optimistic for the latter
                m = re.search(r"HGMMA\.(\d+)x(\d+)x(\d+)", text)
                dims = m.groups() if m else re.search(r"HMMA\.(16)(8)(\d+)", text).groups()  # 16816, 1688
                per = warps / 4 if m else warps
                clocks = 2 * int(dims[0]) * int(dims[1]) * int(dims[2]) * per / TENSOR_FLOP_PER_CLOCK
                start = max(tensor_free, now)
                tensor_free = start + clocks
                tensor += clocks
                busy.append((start, tensor_free))
                if "gsb0" in text or not m:  # a committed wgmma group; an mma.sync is waited for at its use
                    done.append(tensor_free)
            elif op == "WARPGROUP" and "DEPBAR" in text:
                n = re.search(r"0x([0-9a-f]+)\s*$", text)
                allowed = int(n.group(1), 16) if n else 0
                running = [t for t in done if t > now]
                if len(running) > allowed:
                    now = max(now, sorted(running)[len(running) - allowed - 1])
            elif op == "MUFU":
                mufu_free = max(mufu_free, now) + per_mufu
                from_exp.add(dest)
            now += per_issue
        now = max(now, mufu_free)
    marks.append(now)
    half = iterations // 2
    per_iter = (marks[-1] - marks[half]) / (iterations - half)
    first, last = marks[-2], marks[-1]
    busy = [(max(a, first), min(b, last)) for a, b in busy if b > first and a < last]  # the last iteration's
    gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(busy, busy[1:]))
    return {"tensor": tensor / iterations, "issue": per_issue * loop.instructions,
            "mufu": per_mufu * loop.count("MUFU"), "total": per_iter,
            "idle_before": max(0.0, busy[0][0] - first) if busy else last - first,
            "idle_between": gaps, "idle_after": max(0.0, last - busy[-1][1]) if busy else 0.0}


def pingpong_cycles(loop: Loop, consumers: int, warps: int = 4) -> dict[str, float]:
    """Clocks per iteration of all `consumers` warpgroups of a warp-specialized kernel (`model.fused_ce_ws`), each
    running `loop` (`warps` warps) and taking turns at the tensor cores: one's GEMMs run while the others form
    their exps. One consumer's walk alone (`tile_cycles`) splits its iteration into its GEMMs, the clocks before
    and after them (`idle_before`, `idle_after`: while its turn holds the tensor cores, nothing else feeds them)
    and between them (its exps). The iteration then takes the longest of:
      * every consumer's turn in a row: consumers x (tensor + idle_before + idle_after);
      * one consumer's own walk (its exps cannot run under its own turn);
      * every consumer's issue slots, or exps, in a row (both shared by the SM).
    The producer's few instructions per block (a wait and a TMA copy) are not counted. Returns `tile_cycles`' keys
    for the whole iteration, the idle clocks being the tensor cores' per iteration."""
    one = tile_cycles(loop, warps)
    turn = one["tensor"] + one["idle_before"] + one["idle_after"]
    total = max(consumers * turn, one["total"], consumers * one["issue"], consumers * one["mufu"])
    tensor = consumers * one["tensor"]
    return {"tensor": tensor, "issue": consumers * one["issue"], "mufu": consumers * one["mufu"], "total": total,
            "idle_before": consumers * one["idle_before"], "idle_between": total - tensor - consumers * (
                one["idle_before"] + one["idle_after"]), "idle_after": consumers * one["idle_after"]}


def _registers(text: str) -> tuple[str | None, set[str]]:
    """(the register an instruction writes, or None; the registers it reads). A wgmma's register A operand and a
    matrix store (`STSM ... .4`) name the first of 4 consecutive registers."""
    body = _strip(text)
    op, _, rest = body.partition(" ")
    operands = [o.strip() for o in rest.split(",")]
    regs = [re.findall(r"\bR(\d+)\b", o) for o in operands]
    name = op.split(".")[0]
    if name in ("STSM", "STS", "ST", "STG", "HGMMA"):  # no register written (HGMMA's accumulator aside)
        dest, sources = None, regs if name != "HGMMA" else regs[1:2]
    else:
        dest = f"R{regs[0][0]}" if regs and regs[0] and operands[0].startswith("R") else None
        sources = regs[1:]
    reads = set()
    for k, group in enumerate(sources):
        # the data of a 4-wide store (not its address, operand 0) and a wgmma's A operand span 4 registers
        wide = (name == "HGMMA") or (name == "STSM" and op.endswith(".4") and k > 0)
        reads |= {f"R{int(r) + i}" for r in group for i in range(4 if wide else 1)}
    return dest, reads


def smem_bytes(loop: Loop, warps: int, copied: int = 0) -> dict[str, int]:
    """Bytes one iteration of one thread block moves through the SM's shared memory, by what moves them: `wgmma` (its
    B operand always, its A operand where it is a descriptor, not registers: the SS form), `stores` and `loads`
    (STS, LDS by each thread; STSM, LDSM 128 bytes per 8 x 8 matrix and warp; sizes from the opcode, 4 bytes without
    one), `copies` (LDGSTS, cp.async; and `copied`, the caller's count of TMA bytes, which SASS does not show), and
    `total`. A diagnostic beside `tile_cycles`, which does not charge shared memory: at SMEM_BYTES_PER_CLOCK a loop
    whose total / 128 approaches its tensor clocks asks the shared memory as much as the tensor cores. Bytes, not
    bank wavefronts, so neither bound: a load that lanes share (a broadcast: a row's value to the lanes holding its
    columns) takes fewer clocks than its bytes, a sub-word or bank-conflicting access more. Each wgmma is taken to read
    its shared-memory operands once per warpgroup."""
    out = {"wgmma": 0, "stores": 0, "loads": 0, "copies": copied}
    for text in loop.body:
        body = _strip(text)
        op, _, rest = body.partition(" ")
        name = op.split(".")[0]
        if name in _WGMMA_BYTES:  # HGMMA.64x128x16.F32.BF16, QGMMA.64x128x32.F32.E4M3.E4M3, HGMMA.64x8x16.F16
            m = re.match(r"\w+\.(\d+)x(\d+)x(\d+)", op)
            if not m:
                continue
            rows, cols, depth = (int(v) for v in m.groups())
            size = 4 if ".TF32" in op else _WGMMA_BYTES[name]
            a_in_smem = rest.split(",")[1].strip().startswith("gdesc")
            out["wgmma"] += (depth * cols + (rows * depth if a_in_smem else 0)) * size * warps // 4
        elif name in ("STS", "LDS", "LDGSTS"):
            bits = re.search(r"\.[US]?(8|16|32|64|128)(?=\.|$)", op)  # STS.128, LDS.U.64, STS.U8, LDGSTS.E.BYPASS.128
            key = {"STS": "stores", "LDS": "loads", "LDGSTS": "copies"}[name]
            out[key] += (int(bits.group(1)) if bits else 32) // 8 * THREADS_PER_WARP * warps
        elif name in ("STSM", "LDSM"):
            matrices = re.search(r"\.MT?88\.(\d)", op)  # STSM.16.M88.4, LDSM.16.MT88.2 (transposed)
            out["stores" if name == "STSM" else "loads"] += 128 * int(matrices.group(1) if matrices else 1) * warps
    out["total"] = sum(out.values())
    return out


def load_bytes(loop: Loop, warps: int) -> int:
    """Bytes one iteration of one thread block copies from L2/HBM into shared memory (`LDGSTS`, cp.async: 4, 8 or 16
    bytes a thread). Not charged by `tile_cycles`: the fused loss kernels load 11-14 bytes per clock per SM, about
    half of what the L2 gives an SM (5.5-7 TB/s over 132 SMs, published microbenchmarks); a kernel that loads each
    block twice (the next tile's GEMM issued before this tile's softmax, in Pallas) would not be."""
    per_thread = 0
    for text in loop.body:
        op = _strip(text).split()[0]
        if op.startswith("LDGSTS"):
            size = re.search(r"\.(\d+)(?:\.|$)", op)  # LDGSTS.E.BYPASS.128; no size: 32 bits (LDGSTS.E)
            per_thread += (int(size.group(1)) if size else 32) // 8
    return per_thread * warps * THREADS_PER_WARP
