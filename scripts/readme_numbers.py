"""The README's measured numbers (the demo's loss and time, the test suite's size and time), measured again.

    python scripts/readme_numbers.py [--demo] [--suite] [--quick] [--machine LABEL] [--write-readme]

Each part runs what the README tells a user to run, as a user would, in a subprocess:
  * demo:  `python -m yxanul_jax.train` in an empty folder with an empty cache (the tokenizer, the corpus and
           every compile included), its final validation loss, and the unigram / bigram bars of the same
           validation tokens (`scripts/reference_losses.py --max-targets 40960`);
  * suite: `python -m pytest -q` (the README's test command, installs aside);
  * quick: `python -m pytest -q -m "not slow"`.
Each is recorded with its machine and date in docs/bench/readme_numbers.json (a part not run keeps its last
measurement). The README's sentences between `<!-- numbers:PART -->` and `<!-- /numbers -->` are rendered from
that file by `render`; tests/test_docs.py fails when the README and the file disagree, and `--write-readme`
rewrites them (after each part, so a suite measured next sees the numbers before it). Prints a table, then
one JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "bench" / "readme_numbers.json"
README = ROOT / "README.md"
PARTS = ("demo", "suite", "quick")
MARK = re.compile(r"<!-- numbers:(\w+) -->(.*?)<!-- /numbers -->", re.S)
DEMO_VAL_TARGETS = 40960  # the demo's validation: eval.max_batches 20 x eval.batch_size 16 x seq_len 128


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def render(part: str, rec: dict) -> str:
    """The README's words for one measured part (the only place these sentences are written)."""
    where = f"{rec['machine']}, {rec['date']}"
    if part == "demo":
        return (f"It ends with a validation loss of {rec['val_loss']:.2f} (ppl {math.exp(rec['val_loss']):.0f}), "
                f"below the count bigram of the same validation tokens ({rec['bigram']:.2f}; `python "
                f"scripts/reference_losses.py --max-targets {DEMO_VAL_TARGETS}`) and far below the unigram "
                f"({rec['unigram']:.2f}). The whole command took {_minutes(rec['seconds'])} on a fresh cache "
                f"({where}: tokenizer, corpus, compiles and {rec['steps']:,} steps).")
    if part in ("suite", "quick"):
        skipped = f", {rec['skipped']} skipped" if rec.get("skipped") else ""
        return f"{rec['passed']} tests passed{skipped} in {_minutes(rec['seconds'])} ({where})"
    raise ValueError(f"unknown part {part!r}; parts: {', '.join(PARTS)}")


MEASURING = "YXANUL_README_MEASURING"
"""Set by this script, for the suite it runs, to the parts this run measures: a suite cannot check the numbers
of its own measurement, so `readme_mismatches` leaves those parts out there."""


def readme_mismatches(readme: str, record: dict) -> list[str]:
    """Where the README's marked sentences differ from what `render` makes of the record (empty: they agree)."""
    measuring = set(filter(None, os.environ.get(MEASURING, "").split(",")))
    found = {name: text for name, text in MARK.findall(readme) if name not in measuring}
    record = {k: v for k, v in record.items() if k not in measuring}
    problems = [f"README marks numbers:{name} but {RECORD.name} has no '{name}' measurement"
                for name in found if name not in record]
    problems += [f"README has no <!-- numbers:{name} --> block for the measured '{name}'"
                 for name in record if name in PARTS and name not in found]
    problems += [f"numbers:{name}: README says {found[name]!r}, the measurement renders {render(name, record[name])!r}"
                 for name in found if name in record and found[name] != render(name, record[name])]
    return problems


def write_readme(readme: str, record: dict) -> str:
    return MARK.sub(lambda m: f"<!-- numbers:{m[1]} -->{render(m[1], record[m[1]])}<!-- /numbers -->"
                    if m[1] in record else m[0], readme)


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"error: `{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc, seconds


def measure_demo(env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="readme-demo-") as tmp:
        work = Path(tmp)
        env = {**env, "YXANUL_CACHE": str(work / "cache")}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        _, seconds = _run([sys.executable, "-m", "yxanul_jax.train"], work, env)
        metrics = sorted(work.glob("runs/*/metrics.jsonl"))
        if len(metrics) != 1:
            sys.exit(f"error: expected one run under {work / 'runs'}, found {metrics}")
        rows = [json.loads(line) for line in metrics[0].read_text().splitlines() if line.strip()]
        val = [r for r in rows if "val/mean/loss" in r][-1]
        ref, _ = _run([sys.executable, str(ROOT / "scripts" / "reference_losses.py"),
                       "--max-targets", str(DEMO_VAL_TARGETS)], work, env)
        bars = json.loads(ref.stdout.strip().splitlines()[-1])
    return {"val_loss": round(val["val/mean/loss"], 4), "steps": int(val["step"]), "seconds": round(seconds, 1),
            "unigram": round(bars["unigram"], 4), "bigram": round(bars["bigram"], 4)}


def measure_suite(env: dict, quick: bool) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", *(["-m", "not slow"] if quick else [])]
    proc, seconds = _run(cmd, ROOT, env)
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed|errors?)", summary)}
    return {"passed": counts.get("passed", 0), "skipped": counts.get("skipped", 0), "seconds": round(seconds, 1),
            "summary": summary.strip("= ")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="time the default demo and read its validation loss")
    parser.add_argument("--suite", action="store_true", help="time `python -m pytest -q`")
    parser.add_argument("--quick", action="store_true", help="time `python -m pytest -q -m 'not slow'`")
    parser.add_argument("--machine", default=f"{os.cpu_count()}-core CPU box",
                        help="how the README names this machine (default: '<cores>-core CPU box')")
    parser.add_argument("--write-readme", action="store_true", help="rewrite the README's marked numbers")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    from yxanul_jax.core.rundir import atomic_write

    wanted = [part for part in PARTS if getattr(args, part)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")}
    stamp = {"machine": args.machine, "date": time.strftime("%Y-%m-%d"), "platform": platform.platform(),
             "python": platform.python_version(), "cpus": os.cpu_count()}
    for i, part in enumerate(wanted):  # each part saved (and copied into the README) as soon as it is measured
        env[MEASURING] = ",".join(wanted[i:])  # what this invocation has not measured yet
        result = measure_demo(env) if part == "demo" else measure_suite(env, quick=part == "quick")
        record[part] = {**result, **stamp}
        atomic_write(str(RECORD), json.dumps(record, indent=2) + "\n")
        if args.write_readme:
            atomic_write(str(README), write_readme(README.read_text(), record))
    if args.write_readme and not wanted:
        atomic_write(str(README), write_readme(README.read_text(), record))
    print(f"{'part':<7}{'seconds':>9}  {'machine, date':<32} result")
    for part in PARTS:
        if part in record:
            r = record[part]
            what = f"val loss {r['val_loss']:.4f}" if part == "demo" else f"{r['passed']} passed"
            print(f"{part:<7}{r['seconds']:>9.1f}  {r['machine'] + ', ' + r['date']:<32} {what}")
    problems = readme_mismatches(README.read_text(), record)
    for p in problems:
        print(f"README: {p}")
    print(json.dumps({**record, "readme_agrees": not problems}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
