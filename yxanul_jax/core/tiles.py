"""The fused head + loss kernels' tiles (`model.fused_ce`): their blocks, warps and stages per kernel, and the
form a config gives them in (`train.fused_ce_tiles`, `scripts/fused_ce_check.py --tiles`). Here, below the
model, so that the config checks a spec before anything runs."""
from __future__ import annotations

import dataclasses
import re


KERNELS = ("fwd", "dx", "dw")  # forward, training forward (lse and the input gradient), table gradient
MOSAIC_WALKS = {"dx": "bv", "dw": "bt"}  # the kernels with a mosaic form (`model.fused_ce_ws`), the blocks each walks
MOSAIC_HELD = 128  # rows of its own operand a mosaic program holds: 2 consumer warpgroups x 64 (one wgmma's M)
MOSAIC_WALKED = (64, 128)  # the blocks it walks, through its ring
MOSAIC_MIN_STAGES = 2  # slots of that ring: with one the consumers' turns deadlock (`model.fused_ce_ws._ring`)
MAX_BLOCK = 256  # the largest block of tokens or vocabulary rows: a kernel's float32 logits tile lives in registers
MAX_STAGES = 8  # software-pipeline stages: each holds a block of both operands in shared memory (227 KB)
MOSAIC_WIDTHS = (64, 128)
"""Head input widths the warp-specialized kernels take (`model.fused_ce_ws`): whole 128-byte swizzled rows of BF16,
and a consumer's 64 x K float32 accumulator in its registers."""
MOSAIC_FORMS = ("mosaic", "mosaic-rs")  # `model.fused_ce_ws`'s two forms: its softmax via shared memory, or not
KERNEL_FORMS = ("triton", *MOSAIC_FORMS, "auto")  # `Tiles.kernel`


@dataclasses.dataclass(frozen=True)
class Tiles:
    """One kernel's launch: its blocks of tokens (bt) and of vocabulary rows (bv), powers of 2 from 16 to MAX_BLOCK
    (Triton's dot), and Triton's warps and software-pipeline stages. `kernel`: `triton` (Pallas's Triton lowering),
    or for the training kernels `mosaic`, the warp-specialized Mosaic GPU kernels (`model.fused_ce_ws`: two consumer
    warpgroups of 64 rows and a loading one, `check_mosaic`; `warps` unused), `mosaic-rs` (the same with the
    softmax or dlogits kept in registers for the accumulating GEMM, FlashAttention-3's RS form, so with room for one
    more ring slot: `mosaic_max_stages`; its own block held in registers too; not yet timed on a GPU), or `auto`
    (the default training kernels only): mosaic where it can run, Triton with the same blocks elsewhere
    (`runs_mosaic`)."""

    bt: int = 128
    bv: int = 128
    warps: int = 8
    stages: int = 3
    kernel: str = "triton"

    def __post_init__(self):
        for name in ("bt", "bv"):
            n = getattr(self, name)
            if n < 16 or n > MAX_BLOCK or n & (n - 1):
                raise ValueError(f"fused cross-entropy tile {name}={n}: a power of 2 from 16 to {MAX_BLOCK}, e.g. 128")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"fused cross-entropy tiles: warps {self.warps} must be 1, 2, 4, 8 or 16, e.g. w8")
        if not 1 <= self.stages <= MAX_STAGES:
            raise ValueError(f"fused cross-entropy tiles: stages {self.stages} must be 1 to {MAX_STAGES}, e.g. s2")
        if self.kernel not in KERNEL_FORMS:
            raise ValueError(f"fused cross-entropy kernel {self.kernel!r}: one of {', '.join(KERNEL_FORMS)}")

    def runs_mosaic(self, k: int) -> bool:
        """Whether, on a Hopper GPU, this kernel is a mosaic one for a head input k wide: asked for (`mosaic`,
        `mosaic-rs`), or `auto` and k a width the mosaic kernels take (`MOSAIC_WIDTHS`). From `auto`, `model.fused_ce`
        also runs Triton on any other GPU and where this JAX cannot build the mosaic kernel."""
        return self.kernel in MOSAIC_FORMS or (self.kernel == "auto" and k in MOSAIC_WIDTHS)

    def check_mosaic(self, walked: str) -> None:
        """ValueError unless these tiles fit a mosaic kernel that walks blocks of `walked` (bt or bv): 128 of the
        other (2 consumers x 64 rows), 64 or 128 walked, and at least 2 walked blocks in flight (one would deadlock
        the consumers' turns: `fused_ce_ws._ring`), at most `mosaic_max_stages` in sm_90's 227 KiB of shared memory
        beside the held rows, the exps and the float32 output."""
        held = "bv" if walked == "bt" else "bt"
        n = getattr(self, walked)
        most = mosaic_max_stages(n, self.kernel == "mosaic-rs")
        fits = MOSAIC_MIN_STAGES <= self.stages <= most
        if getattr(self, held) != MOSAIC_HELD or n not in MOSAIC_WALKED or not fits:
            big, small = MOSAIC_WALKED[-1], MOSAIC_WALKED[0]
            raise ValueError(
                f"a mosaic kernel takes {held} {MOSAIC_HELD} and {walked} {big} with {mosaic_max_stages(big, False)} "
                f"stages ({mosaic_max_stages(big, True)} in the RS form) or {walked} {small} with "
                f"{MOSAIC_MIN_STAGES}-{mosaic_max_stages(small, False)} ({MOSAIC_MIN_STAGES}-"
                f"{mosaic_max_stages(small, True)}), got {self.bt}x{self.bv}s{self.stages}: e.g. dx=128x128s2:mosaic, "
                "dw=128x128s3:mosaic-rs")


def mosaic_max_stages(walked: int, registers: bool) -> int:
    """The ring slots of `walked`-row blocks a mosaic kernel fits at head width 128 (`fused_ce_ws`, per program: 96 KiB
    of held rows and float32 output, 32 KiB of softmax (dlogits) in the SMEM form, 32 KiB a slot of 128 rows, dw 34
    with its tokens' values, and Pallas's 2 KiB of reduction scratch and the barriers): 64 KiB of ring in the SMEM
    form, 96 KiB in the RS form, whose softmax stays in registers. sm_90 gives a block 227 KiB (232,448 bytes); by
    the sm_90 lowering (2026-11-28), 3 slots of 128 need 232,520 bytes (dx) and 235,616 (dw) in the SMEM form, and
    fit in the RS form, where 4 need 232,536 and 237,688. Of 64 rows (half the bytes a slot) more would fit than this
    allows; at K 64 everything here fits."""
    return (384 if registers else 256) // walked


@dataclasses.dataclass(frozen=True)
class KernelTiles:
    """The tiles of the three kernels (`model.fused_ce`): the forward (evaluation), the training forward that also
    forms the input gradient (`dx`), the table gradient."""

    # The forward in 64-row vocabulary blocks: 21.30 against 23.44 ms at 131,072 tokens (K 128), the fastest of
    # 19 sets, each checked against float32 (scripts/fused_ce_check.py --tiles; H200, jax 0.11.2, 2026-11-26,
    # docs/bench/h200_2026-11-26_night/tiles). The training kernels are software-pipelined (model.fused_ce): each
    # carries its next tile's operands in registers to shared memory, and at 3 stages ptxas spills 8 bytes of
    # each; at 2 neither spills, and the sm_90 census gives 2,400 and 2,424 clocks per tile against 2,448 and
    # 2,430 at 3 (scripts/fused_ce_sass.py, 2026-11-27). No GPU has swept these kernels' tiles yet.
    # The training kernels are `auto`: on a Hopper GPU, at head widths 64 and 128, their warp-specialized Mosaic GPU
    # forms at the same blocks (`model.fused_ce_ws`), which took the training kernels from 70.44 to 50.07 ms at
    # 131,072 tokens (K 128) and passed every float32 check (H200, jax 0.11.2, 2026-11-28,
    # docs/bench/h200_2026-11-28_fourteenth).
    fwd: Tiles = Tiles(bv=64)
    dx: Tiles = Tiles(stages=2, kernel="auto")
    dw: Tiles = Tiles(stages=2, kernel="auto")

    def __post_init__(self):
        if self.fwd.kernel != "triton":
            raise ValueError(f"fused cross-entropy tiles: the forward's kernel is Triton's, got {self.fwd.kernel!r}")
        for name, walked in MOSAIC_WALKS.items():
            if (t := getattr(self, name)).kernel != "triton":
                t.check_mosaic(walked)  # `auto` too: its blocks are the mosaic kernel's where it runs

    @property
    def mosaic(self) -> bool:
        """Whether a training kernel asks for a mosaic form outright (`:mosaic`, `:mosaic-rs`: refused where it cannot
        run; the default `auto` falls back instead, `Tiles.runs_mosaic`)."""
        return any(getattr(self, k).kernel in MOSAIC_FORMS for k in MOSAIC_WALKS)

    def resolved(self, k: int, gpu: bool = True) -> "KernelTiles":
        """These tiles with each training kernel made the one that runs for a head input k wide, on a Hopper GPU
        (`gpu`: `Tiles.runs_mosaic`) or not (Triton's; in interpret mode on a CPU): what a measurement records beside
        the spec it was asked, so that its `default` stays readable after the default changes."""
        def one(t: Tiles) -> Tiles:
            if not (gpu and t.runs_mosaic(k)):
                return dataclasses.replace(t, kernel="triton")
            return t if t.kernel in MOSAIC_FORMS else dataclasses.replace(t, kernel="mosaic")
        return dataclasses.replace(self, **{name: one(getattr(self, name)) for name in KERNELS})

    @property
    def t_multiple(self) -> int:
        """Tokens are padded to a multiple of every kernel's bt (powers of 2: the largest)."""
        return max(getattr(self, k).bt for k in KERNELS)

    @property
    def v_multiple(self) -> int:
        """Vocabulary rows likewise, of every bv."""
        return max(getattr(self, k).bv for k in KERNELS)

    def replace(self, spec: str) -> "KernelTiles":
        """These tiles with one kernel's changed by a spec `KERNEL=BTxBV[wWARPS][sSTAGES][:mosaic|:mosaic-rs|:auto]`
        (`dx=64x256w4s3`; warps and stages default to that kernel's; `:mosaic`, `:mosaic-rs` or `:auto` for dx and dw,
        `Tiles.kernel`; without an ending the kernel is the Triton one, whatever the default's); ValueError naming the
        form otherwise."""
        m = re.fullmatch(rf"({'|'.join(KERNELS)})=(\d+)x(\d+)(?:w(\d+))?(?:s(\d+))?(?::(mosaic-rs|mosaic|auto))?",
                         spec.strip())
        if not m:
            raise ValueError(f"fused cross-entropy tiles {spec!r}: write "
                             "KERNEL=BTxBV[wWARPS][sSTAGES][:mosaic|:mosaic-rs|:auto] with KERNEL fwd, dx or dw, e.g. "
                             "dx=64x256w4s3 or dw=128x128s2:mosaic")
        name, bt, bv, warps, stages, kernel = m.groups()
        if kernel and name not in MOSAIC_WALKS:
            raise ValueError(f"fused cross-entropy tiles {spec!r}: only the training kernels (dx, dw) have mosaic ones")
        old = getattr(self, name)
        new = Tiles(int(bt), int(bv), int(warps) if warps else old.warps, int(stages) if stages else old.stages,
                    kernel or "triton")
        return dataclasses.replace(self, **{name: new})  # `__post_init__` checks a mosaic kernel's blocks

    def spec(self, full: bool = False) -> str:
        """The spec `parse_tiles` reads back as these tiles: each kernel that differs from the default (`full`:
        every kernel), in full."""
        parts = []
        for k in KERNELS:
            t = getattr(self, k)
            if full or t != getattr(DEFAULT_TILES, k):
                ending = "" if t.kernel == "triton" else f":{t.kernel}"
                parts.append(f"{k}={t.bt}x{t.bv}w{t.warps}s{t.stages}{ending}")
        return ",".join(parts) or "default"


DEFAULT_TILES = KernelTiles()


def training_form(kernel: str, stages: int | None = None) -> str:
    """The spec of the default tiles' two training kernels (dx, dw) in one form (`KERNEL_FORMS`: `triton`, `mosaic`,
    `mosaic-rs`, `auto`), at the default's blocks and `stages` (the default's when None): the sets the GPU scripts
    compare (scripts/gpu_lease.sh, scripts/fused_ce_check.py), named here once."""
    if kernel not in KERNEL_FORMS:
        raise ValueError(f"training_form: a kernel form is one of {KERNEL_FORMS}, got {kernel!r}")
    parts = []
    for name in MOSAIC_WALKS:
        t = getattr(DEFAULT_TILES, name)
        ending = "" if kernel == "triton" else f":{kernel}"
        parts.append(f"{name}={t.bt}x{t.bv}s{t.stages if stages is None else stages}{ending}")
    return ",".join(parts)


def parse_tiles(spec: str) -> KernelTiles:
    """`default`, or comma-separated `KERNEL=BTxBV[wWARPS][sSTAGES][:mosaic|:mosaic-rs|:auto]` changes to the default
    tiles (`KernelTiles.replace`): the form of `train.fused_ce_tiles` and `scripts/fused_ce_check.py --tiles`."""
    tiles, seen = DEFAULT_TILES, set()
    for part in ([] if spec.strip() == "default" else [p.strip() for p in spec.split(",")]):
        if not part:
            raise ValueError(f"fused cross-entropy tiles {spec!r}: an empty part (a comma too many); write 'default' "
                             "alone or KERNEL=BTxBV changes joined by commas, e.g. fwd=128x64,dx=128x128s2")
        if part == "default":
            raise ValueError(f"fused cross-entropy tiles {spec!r}: 'default' stands alone; the changes start from it")
        kernel = part.partition("=")[0]
        if kernel in seen:
            raise ValueError(f"fused cross-entropy tiles {spec!r}: {kernel} given twice; give each kernel once")
        seen.add(kernel)
        tiles = tiles.replace(part)
    return tiles


def bad_tiles(specs) -> str | None:
    """The one-line error for the first of `specs` that `parse_tiles` refuses (`--tiles SPEC: why`), or None: the
    check both tile scripts (scripts/fused_ce_check.py, scripts/fused_ce_sass.py) run before compiling anything."""
    for spec in specs:
        try:
            parse_tiles(spec)
        except ValueError as e:
            return f"--tiles {spec}: {e}"
    return None
