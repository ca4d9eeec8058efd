"""The GPUs we plan and predict for: one table of memory, bandwidth and peak rates, each with its source.

Everything that needs a GPU's numbers reads this table: `plan --gpu` (memory), the performance model
(`analysis.perf`: HBM bandwidth, tensor-core rates by operand type, SM count), the train loop's MFU
(`training.monitor.peak_flops_per_device`, matched by jax's `device_kind`) and `analyze --target`.

Rates are dense (no 2:4 sparsity) tensor-core peaks in FLOP/s at the boost clock, with float32
accumulation (what XLA asks cuBLAS and Triton for); `tf32` is the rate of float32 operands under XLA's
default precision on Ampere and later (TF32 tensor cores), `f32` the CUDA-core rate. A GPU without a
rate (no FP8 tensor cores before Ada/Hopper) runs those GEMMs at the next slower rate it has.
Memory is what `nvidia-smi` reports (MiB): what a "24 GB" card really offers.

Names: `lookup` takes a table key or any alias (`4090`, `rtx-4090`, `h100-sxm`, ...), case-insensitive;
a bare number is not a name (`memory.parse_gpu` needs a unit for sizes, `24GB`).
"""
from __future__ import annotations

import dataclasses
import difflib
import re

MiB = 2 ** 20


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    key: str  # the table's name: h100, rtx4090, ...
    label: str  # how NVIDIA names it
    aliases: tuple[str, ...]
    device_kind: str  # regex matched against jax's device.device_kind
    memory_bytes: int
    hbm_bytes_per_s: float  # memory bandwidth, spec sheet
    sms: int
    l2_bytes: int
    rates: dict  # operand type (fp8, bf16, tf32, f32) -> dense peak FLOP/s
    source: str

    def rate(self, kind: str) -> float:
        """Peak FLOP/s for GEMM operands of `kind` (fp8, bf16, tf32, f32); falls back to slower kinds."""
        order = ("fp8", "bf16", "tf32", "f32")
        for k in order[order.index(kind):]:
            if self.rates.get(k):
                return self.rates[k]
        raise ValueError(f"{self.key} has no rate for {kind}")

    @property
    def peak_bf16(self) -> float:
        """The MFU denominator: dense BF16 peak (as PaLM, nanoGPT and MaxText report MFU), FP8 runs included."""
        return self.rate("bf16")


def _spec(key, label, aliases, kind, mib, tbps, sms, l2_mb, fp8, bf16, tf32, f32, source) -> GpuSpec:
    rates = {k: v * 1e12 for k, v in (("fp8", fp8), ("bf16", bf16), ("tf32", tf32), ("f32", f32)) if v}
    return GpuSpec(key, label, aliases, kind, mib * MiB, tbps * 1e12, sms, int(l2_mb * MiB), rates, source)


# Dense TFLOP/s with FP32 accumulation. Sources: NVIDIA H100 datasheet (SXM5 / PCIe, 2023), H200
# datasheet (2024), A100 datasheet (2021), Ada Lovelace architecture whitepaper v1.1 (RTX 4090, L4:
# the FP32-accumulate figures, half the FP16-accumulate ones), Blackwell GeForce whitepaper (RTX 5090),
# Turing TU117 specs (GTX 1650: no tensor cores for BF16; CUDA cores only).
GPUS: dict[str, GpuSpec] = {s.key: s for s in (
    _spec("h100", "H100 SXM5 80GB", ("h100-sxm", "h100sxm", "h100-80", "h100-sxm5"),
          r"H100(?!.*(PCIe|NVL))|GH200", 81559, 3.35, 132, 50, 1978.9, 989.4, 494.7, 66.9,
          "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    _spec("h100-pcie", "H100 PCIe 80GB", ("h100pcie",), r"H100.*PCIe", 81559, 2.0, 114, 50,
          1513.0, 756.5, 378.0, 51.2, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    _spec("h100-nvl", "H100 NVL 94GB", ("h100nvl",), r"H100.*NVL", 95830, 3.9, 132, 50,
          1670.5, 835.3, 417.6, 60.0, "NVIDIA H100 NVL datasheet (per GPU)"),
    _spec("h200", "H200 SXM 141GB", ("h200-sxm", "gh200-141"), r"H200", 143771, 4.8, 132, 50,
          1978.9, 989.4, 494.7, 66.9, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    _spec("a100-80", "A100 SXM4 80GB", ("a100", "a100-sxm", "a10080", "a100-80gb"), r"A100.*80", 81920, 2.039,
          108, 40, None, 312.0, 156.0, 19.5, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    _spec("a100-40", "A100 SXM4 40GB", ("a10040", "a100-40gb"), r"A100", 40960, 1.555, 108, 40, None, 312.0,
          156.0, 19.5, "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM)"),
    _spec("rtx4090", "GeForce RTX 4090 24GB", ("4090", "rtx-4090", "geforce-rtx-4090"), r"RTX 4090", 24564,
          1.008, 128, 72, 330.3, 165.2, 82.6, 82.6, "NVIDIA Ada Lovelace architecture whitepaper v1.1"),
    _spec("rtx5090", "GeForce RTX 5090 32GB", ("5090", "rtx-5090"), r"RTX 5090", 32607, 1.792, 170, 96,
          419.0, 209.5, 104.8, 104.8, "NVIDIA RTX Blackwell GPU architecture whitepaper"),
    _spec("l4", "L4 24GB", ("nvidia-l4",), r"\bL4\b", 23034, 0.300, 58, 48, 242.5, 121.0, 60.0, 30.3,
          "NVIDIA L4 Tensor Core GPU datasheet"),
    _spec("gtx1650", "GeForce GTX 1650 4GB", ("1650", "gtx-1650"), r"GTX 1650", 4096, 0.128, 14, 1, None,
          None, None, 2.98, "NVIDIA GeForce GTX 1650 specifications (TU117)"),
)}


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower()).removeprefix("nvidia-")


def lookup(name: str) -> GpuSpec | None:
    """The GPU named `name` (a key or an alias, any case; `NVIDIA H100` works), or None."""
    key = _norm(name)
    for spec in GPUS.values():
        if key == spec.key or key in spec.aliases or key.replace("-", "") in (spec.key.replace("-", ""),):
            return spec
    return None


def names() -> list[str]:
    return list(GPUS)


def closest(name: str) -> str | None:
    """A table key close to `name` (for "did you mean"), or None."""
    pool = {a: s.key for s in GPUS.values() for a in (s.key, *s.aliases)}
    close = difflib.get_close_matches(_norm(name), list(pool), n=1)
    return pool[close[0]] if close else None


def of_device_kind(kind: str) -> GpuSpec | None:
    """The table's entry for a jax device_kind ("NVIDIA H100 80GB HBM3"), or None (CPU, unknown GPU)."""
    for spec in GPUS.values():
        if re.search(spec.device_kind, kind or ""):
            return spec
    return None
