"""Run monitoring: the metrics writer (metrics.jsonl, TensorBoard, optionally W&B), the run-log header (versions,
devices, git commit, config), the live progress line, and MFU. The run directory's layout is
`yxanul_jax.core.rundir`'s."""
from __future__ import annotations

import collections
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from typing import Any, Callable, TextIO

from yxanul_jax.core import console
from yxanul_jax.core.coerce import to_dict, to_yaml
from yxanul_jax.core.config import Config
from yxanul_jax.core.errors import UserError, one_line, writing
from yxanul_jax.core.rundir import METRICS_FILE, PROFILE_DIR, RUN_DIR_RULE, TB_DIR, WANDB_ID_FILE, atomic_write

# --------------------------------------------------------------------------------------------
# Metrics


def _scalar(value: Any) -> Any:
    """Unwrap a 0-d numpy/jax value into the Python scalar it holds."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value


def _json_value(value: Any) -> Any:
    """A JSON-safe value for a metrics field: NaN/inf become null; only scalars and strings pass."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"metrics value {value!r} ({type(value).__name__}) is not a scalar")


def _row_step(line: str) -> int | None:
    """The step of a metrics.jsonl line; None for a blank or torn line (a crash mid-write)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def validation_logged(run_dir: str, step: int) -> bool:
    """Whether `run_dir`'s metrics.jsonl holds a validation row (a `val/` key) of `step`: the record a finished run
    validated after its last checkpoint leaves (that checkpoint, saved before, carries no perplexity)."""
    try:  # an unreadable file is no record (never an error: every process waits for this answer)
        with open(os.path.join(run_dir, METRICS_FILE), encoding="utf-8", errors="replace") as fh:
            return any(_row_step(line) == step and any(k.startswith("val/") for k in json.loads(line)) for line in fh)
    except OSError:
        return False


class MetricsWriter:
    """Append rows to `run_dir/metrics.jsonl` (flushed per row) and the same numbers to TensorBoard.

    Every row needs an integer "step"; every other numeric field becomes a TensorBoard scalar
    under its own key (e.g. "loss", "val/web/ppl") at that step. NaN/inf are written to the
    JSON file as null (and to TensorBoard as they are).

    `resume_step`: when a run resumes from checkpoint step N, rows after N (written by the lost
    part of the interrupted run) are dropped from metrics.jsonl, and TensorBoard is told to purge
    its events after N (`purge_step`), so no step appears twice.

    `cfg` with `monitor.wandb`: the same scalars also go to a Weights & Biases run (`open_wandb`), the same
    one again when the run resumes from a checkpoint (`resume_step` > 0).
    """

    def __init__(self, run_dir: str, *, resume_step: int | None = None, cfg: Config | None = None):
        from tensorboardX import SummaryWriter  # deferred: only writers need TensorBoard

        self.path = os.path.join(run_dir, METRICS_FILE)
        if resume_step is not None and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as fh:
                kept = [line for line in fh if _row_step(line) is not None and _row_step(line) <= resume_step]
            atomic_write(self.path, "".join(kept))
        with writing(self.path):  # a full or read-only disk: one line naming the file
            self._file = open(self.path, "a", encoding="utf-8")
        self._tb = SummaryWriter(logdir=os.path.join(run_dir, TB_DIR), flush_secs=30,
                                 purge_step=None if resume_step is None else resume_step + 1)
        self._wandb = open_wandb(cfg, run_dir, resume_step) if cfg is not None and cfg.monitor.wandb else None
        self._wandb_unused = self._wandb is not None and not resume_step  # a new W&B run, no step logged to it yet
        self._run_dir = run_dir

    def write(self, row: dict) -> None:
        """Append one row (a dict with "step"; values are scalars or strings)."""
        if "step" not in row:
            raise ValueError(f"metrics row without 'step': {sorted(row)}")
        values = {k: _scalar(v) for k, v in row.items()}
        step = int(values["step"])
        with writing(self.path):
            self._file.write(json.dumps({k: _json_value(v) for k, v in values.items()}, allow_nan=False) + "\n")
            self._file.flush()
        scalars = {key: float(value) for key, value in values.items()
                   if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}
        for key, value in scalars.items():
            self._tb.add_scalar(key, value, global_step=step)
        if self._wandb is not None and step >= self._wandb.step:  # W&B keeps a resumed run's logged steps
            self._wandb.log(scalars, step=step)
            self._wandb_unused = False

    def flush(self) -> None:
        """Push TensorBoard's buffered events to disk (called at every checkpoint save)."""
        self._tb.flush()

    def close(self) -> None:
        self._file.close()
        self._tb.close()
        if self._wandb is not None:
            if self._wandb_unused:  # refused or stopped before its first row: the next fresh start takes this run
                atomic_write(os.path.join(self._run_dir, WANDB_ID_FILE), f"{self._wandb.id}\n{WANDB_UNUSED}\n")
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


WANDB_EXTRA = 'pip install -e ".[wandb]"'
WANDB_UNUSED = "no steps logged"  # the second line of WANDB_ID_FILE for a new W&B run closed before its first row


def check_wandb(cfg: Config) -> None:
    """UserError, before anything is written, when `monitor.wandb` is on and wandb is not installed."""
    import importlib.util

    if cfg.monitor.wandb and importlib.util.find_spec("wandb") is None:
        raise UserError(f"monitor.wandb=true needs the wandb package, which is not installed; {WANDB_EXTRA} "
                        "(or pip install wandb), or set monitor.wandb=false")


def open_wandb(cfg: Config, run_dir: str, resume_step: int | None):
    """The W&B run of `run_dir` (files in `<run_dir>/wandb/`, the resolved config as its config): a new one
    for a run that starts at step 0, whose id is kept in `WANDB_ID_FILE`; that same run again (`resume="allow"`)
    when the run resumes from a checkpoint. W&B cannot forget the steps a killed run logged after its last
    checkpoint (TensorBoard purges them), so until the resumed run passes them only the first values stay. A new
    run closed before it logged a step (a start refused or stopped before its first step) is marked so in the id
    file, and the next start at step 0 takes it on, leaving no empty run in the project."""
    check_wandb(cfg)
    import wandb  # deferred: an optional extra, imported only when monitor.wandb is on
    from wandb.sdk.lib.runid import generate_id

    m, id_path = cfg.monitor, os.path.join(run_dir, WANDB_ID_FILE)
    lines = []
    if os.path.isfile(id_path):
        with open(id_path, encoding="utf-8") as fh:
            lines = [line.strip() for line in fh.read().splitlines()]
    known = lines[0] if lines and lines[0] else None
    if known and resume_step:  # the run's own W&B run, continued
        ids = [known]
    elif known and lines[1:2] == [WANDB_UNUSED]:  # a start at step 0 after one that logged nothing: that run, or
        ids = [known, generate_id()]  # a new one where W&B refuses its id (deleted in its UI, say)
    else:
        ids = [generate_id()]
    for i, run_id in enumerate(ids):
        if lines != [run_id]:  # a new id, or the unused mark dropped: rows logged from here on are this run's
            atomic_write(id_path, run_id + "\n")
        try:
            return wandb.init(project=m.wandb_project, entity=m.wandb_entity or None, id=run_id, resume="allow",
                              name=m.wandb_name or os.path.basename(os.path.abspath(run_dir)), dir=run_dir,
                              mode=None if m.wandb_mode == "auto" else m.wandb_mode, config=to_dict(cfg),
                              settings=wandb.Settings(console="off"))  # our console stays ours (progress line)
        except wandb.errors.Error as e:
            if i + 1 < len(ids):
                continue
            anew = f", or, if W&B refuses this run's id, remove {id_path} to go on in a new W&B run" \
                if known and resume_step else ""
            raise UserError(f"Weights & Biases did not start ({type(e).__name__}: {one_line(e, 200)}); run "
                            "'wandb login', or set monitor.wandb_mode=offline (upload later with wandb sync) or "
                            f"monitor.wandb=false{anew}") from None


# --------------------------------------------------------------------------------------------
# Run-log header


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    """Commit of the yxanul_jax source tree (`<sha>` or `<sha>+dirty`), or 'unknown' (no git,
    or the package is not inside its own checkout, e.g. installed from a wheel)."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # yxanul_jax/, above training/

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", package_dir, *args], capture_output=True, text=True, timeout=10)
        if out.returncode:
            raise OSError(out.stderr.strip())
        return out.stdout.strip()

    try:
        top = git("rev-parse", "--show-toplevel")
        if not os.path.samefile(os.path.join(top, "yxanul_jax"), package_dir):
            return "unknown"  # some other repository that happens to contain site-packages
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def gpu_driver_info() -> str | None:
    """`name, driver, memory` per GPU from nvidia-smi, or None where there is no nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return "; ".join(rows) if out.returncode == 0 and rows else None


def profile_viewers(trace_dir: str) -> list[str]:
    """How to open a `jax.profiler` trace written under `trace_dir` (its `plugins/profile/<time>/*.xplane.pb`):
    one command for XProf and one for TensorBoard's profile plugin, each with its install and its address."""
    quoted = shlex.quote(trace_dir)
    return [f"xprof --logdir {quoted} --port 8791  (pip install xprof; then open http://localhost:8791)",
            f"tensorboard --logdir {quoted}  (pip install tensorboard tensorboard-plugin-profile; then open "
            "http://localhost:6006/#profile)"]


def profile_note(cfg: Config, run_dir: str | None = None) -> str | None:
    """The header's lines on `profile.*`: which steps are traced, where to, and how to open the trace; None
    without a trace."""
    if cfg.profile.start_step < 0:
        return None
    where = os.path.join(run_dir, PROFILE_DIR) if run_dir else os.path.join("<run dir>", PROFILE_DIR)
    return "\n".join([f"profile: the {cfg.profile.num_steps} steps after step {cfg.profile.start_step} traced into "
                      f"{where}; open it with",
                      *(f"  {line}" for line in profile_viewers(where))])


def run_header(cfg: Config, with_config: bool = True, run_dir: str | None = None) -> str:
    """The text every run log starts with: versions, Python, devices (and GPU driver), git commit,
    the train step's XLA options, the run directory and its naming rule (`run_dir`), how to open the
    profile when `profile.*` traces one (under `run_dir`),
    then (`with_config`) the resolved config YAML, which the train command leaves to the run directory's
    config.yaml."""
    import jax  # deferred: initializing the backend is the caller's choice of moment

    from yxanul_jax.training.steps import fp8_summary, step_xla_options

    dists = ("yxanul-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain")
    devices = jax.devices()
    kinds = collections.Counter(d.device_kind for d in devices)
    lines = [
        "versions: " + ", ".join(f"{d} {_version(d)}" for d in dists),
        f"python: {platform.python_version()} ({sys.platform})",
        "devices: " + ", ".join(f"{n} x {kind}" for kind, n in kinds.items())
        + f" ({devices[0].platform}); {jax.local_device_count()} local, "
        f"process {jax.process_index()} of {jax.process_count()}",
        *([f"nvidia-smi: {gpus}"] if (gpus := gpu_driver_info()) else []),
        f"git commit: {git_commit()}",
        f"xla options of the train step: {step_xla_options(cfg) or 'XLA defaults'}"
        + (f"; FP8 GEMM form {f['gemm_form']}, weight gradients {f['wgrad']}" if (f := fp8_summary(cfg)) else ""),
        *([f"run dir: {run_dir} (named {RUN_DIR_RULE})"] if run_dir else []),
        *([note] if (note := profile_note(cfg, run_dir)) else []),
    ]
    if with_config:
        lines += ["config:", to_yaml(cfg).rstrip()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Progress line


def _human(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
    """A live progress line on stderr: one line rewritten at every step on a terminal; otherwise (a log
    file, a pipe) one plain line every `every` steps (the train loop passes `train.log_every`) and at the
    last step.

    The ETA divides the remaining steps by the step rate over the last `window` updates, so the
    first step's compilation drops out after a few updates.
    """

    def __init__(self, total_steps: int, *, every: int = 1, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, window: int = 20):
        if every < 1:
            raise ValueError(f"Progress every={every}: must be >= 1")
        self.total_steps = total_steps
        self.every = every
        self._stream = stream
        self._clock = clock
        self._history: collections.deque[tuple[float, int]] = collections.deque(maxlen=window)
        self._width = 0

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def eta_seconds(self) -> float | None:
        """Seconds to `total_steps` at the recent step rate, or None before two updates."""
        if len(self._history) < 2:
            return None
        (t0, s0), (t1, s1) = self._history[0], self._history[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return max(self.total_steps - s1, 0) * (t1 - t0) / (s1 - s0)

    def update(self, step: int, stage: int, seq_len: int, loss: float, tokens_per_sec: float,
               mfu: float | None) -> str:
        """Record `step` and print the line (off a terminal only every `every` steps and the last); returns
        the line (without control characters)."""
        now = self._clock()
        if self._history and step < self._history[-1][1]:
            self._history.clear()  # restarted from a checkpoint
        self._history.append((now, step))
        eta = self.eta_seconds()
        line = (f"step {step}/{self.total_steps} | stage {stage} seq {seq_len} | loss {loss:.4f} | "
                f"{_human(tokens_per_sec)} tok/s | MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} | "
                f"ETA {'--' if eta is None else _duration(eta)}")
        stream = self.stream
        if stream.isatty():
            stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
            console.set_live(self)  # the next message ends this line first
        elif step % self.every == 0 or step >= self.total_steps:
            stream.write(line + "\n")
        else:
            return line
        stream.flush()
        return line

    def close(self) -> None:
        """End the rewritten line on a terminal so later output starts on a fresh line."""
        if self._width and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0


# --------------------------------------------------------------------------------------------
# FLOPs and MFU


def peak_flops_per_device(device) -> float | None:
    """Dense BF16 peak FLOP/s of one device (a jax Device or its device_kind string; `analysis.gpus`).

    `YXANUL_PEAK_TFLOPS` (e.g. 989) overrides the table; CPUs and unknown devices give None.
    """
    override = os.environ.get("YXANUL_PEAK_TFLOPS", "").strip()
    if override:
        try:
            value = float(override)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise UserError(f"YXANUL_PEAK_TFLOPS must be a positive number of TFLOP/s, got {override!r}")
        return value * 1e12
    from yxanul_jax.analysis.gpus import of_device_kind

    spec = of_device_kind(device if isinstance(device, str) else getattr(device, "device_kind", ""))
    return None if spec is None else spec.peak_bf16


def mfu(tokens_per_sec: float, flops_per_token: float, n_devices: int, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved training FLOP/s over the devices' peak; None if unknown."""
    if peak is None or peak <= 0 or n_devices <= 0:
        return None
    return tokens_per_sec * flops_per_token / (n_devices * peak)
