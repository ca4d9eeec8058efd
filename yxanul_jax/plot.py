"""`python -m yxanul_jax.plot RUN_DIR [RUN_DIR ...]`: training and validation loss, tokens/s and lr
against tokens, from each run's `metrics.jsonl`, in one PNG for comparing runs at a glance; a run trained on a loss
of its own (`fit(loss=...)`) gets a panel per term (`loss/<name>`).

Needs matplotlib (`pip install 'yxanul-jax[plot]'`); everything else reads plain JSON lines.
"""
from __future__ import annotations

import json
import os
import sys

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, cli_entry, user_path
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.rundir import METRICS_FILE, TERM_PREFIX, atomic_write_bytes, check_output_file

PANELS = (("loss", "training loss"), ("val/mean/loss", "validation loss"), ("tokens_per_sec", "tokens/s"),
          ("lr", "learning rate"))


def panels_of(runs: dict[str, list[dict]]) -> tuple[tuple[str, str], ...]:
    """`PANELS`, then one per loss term of one's own that any run logged (`loss/<name>`, in name order)."""
    terms = sorted({k for rows in runs.values() for r in rows for k in r if k.startswith(TERM_PREFIX)})
    return PANELS + tuple((k, f"{k} (per token)") for k in terms)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(run_dir: str) -> list[dict]:
    """The rows of `run_dir/metrics.jsonl` (torn lines of a crash, and rows without an integer step, skipped);
    UserError if there are none or the file is not text."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise UserError(f"'{run_dir}' has no {METRICS_FILE}; pass a run directory of `python -m yxanul_jax.train`")
    rows = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise UserError(f"'{path}' line {lineno} holds invalid UTF-8 at byte {e.start}, so it is no metrics "
                                "file of `python -m yxanul_jax.train`; restore it or pass another run directory")
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
                rows.append(row)
    if not rows:
        raise UserError(f"'{path}' has no metrics rows (with a step) yet; plot it after the first logged step")
    return rows


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(tokens, values) of every row that has `key` (validation rows of older runs: tokens of their step)."""
    tokens_at = {r["step"]: r["tokens"] for r in rows if _number(r.get("tokens")) and "loss" in r}
    xs, ys = [], []
    for r in rows:
        value, tokens = r.get(key), r.get("tokens", tokens_at.get(r["step"]))
        if _number(value) and _number(tokens):
            xs.append(float(tokens))
            ys.append(float(value))
    return xs, ys


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plotting needs matplotlib; pip install 'yxanul-jax[plot]' (or matplotlib)")
    return plt


def plot_runs(runs: dict[str, list[dict]], output: str, panels=PANELS, colors: dict[str, str] | None = None,
              title: str = "") -> str:
    """Draw `panels` (metric key, label) for every labelled run's rows into `output` (PNG, written
    atomically). Runs sharing a color (e.g. seeds of one arm) are drawn alike."""
    if not any(series(rows, key)[0] for rows in runs.values() for key, _ in panels):
        raise UserError(f"no row of {', '.join(runs)} holds {', '.join(key for key, _ in panels)} with its tokens; "
                        "plot a run of `python -m yxanul_jax.train` after its first logged step")
    plt = _pyplot()
    import io

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        for name, rows in runs.items():
            xs, ys = series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.2,
                        label=name, color=(colors or {}).get(name))
        ax.set_xlabel("tokens")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    seen = {}
    for ax in axes[0]:  # every run once, from whichever panel drew it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(len(seen), 6), fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(output, buf.getvalue())
    return output


@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m yxanul_jax.plot", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", type=user_path, metavar="RUN_DIR",
                   help="run directories with a metrics.jsonl")
    p.add_argument("--output", default="runs.png", type=user_path, help="PNG to write (default: runs.png)")
    args = p.parse_args(argv)
    check_output_file(args.output)
    if not args.output.endswith(".png"):
        raise UserError(f"--output '{args.output}' must end in .png")
    runs = {}
    for d in args.run_dirs:
        name = os.path.basename(os.path.normpath(d)) or d
        runs[name if name not in runs else d] = read_metrics(d)
    _pyplot()  # before any work: a missing matplotlib is one line
    plot_runs(runs, args.output, panels_of(runs))
    console.info(f"wrote {args.output} ({len(runs)} run{'s' * (len(runs) > 1)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
