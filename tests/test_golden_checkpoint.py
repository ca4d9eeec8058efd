"""The checkpoint format, pinned: tests/golden/checkpoint-v1 (written by scripts/make_golden_checkpoint.py) restores
with today's code, checksums intact, and one more step gives the numbers saved beside it; a checkpoint of a newer
format is refused in one line and left where it is; one without a format version reads as version 1.

A failure of the first test after an upgrade (Orbax, JAX, flax, optax) or a change here means checkpoints
written before it may no longer resume as they trained: find out which, never regenerate the folder to make the
test pass (the script's docstring says when a new golden folder is due).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, load_script
from data_fixtures import run_cli

from yxanul_jax.training.integrity import FORMAT, FORMAT_VERSION, META_CHECKSUMS, format_refusal, meta_checksums

# The restore is bit-exact, so the restored arrays' checksums and the data cursor must be equal. One step
# after it is float32 on XLA:CPU at the suite's -O0 (the script imports tests/conftest.py as the suite does):
# the same program, so only rounding can move the numbers; 1e-5 is the bound tests/test_golden.py measured for
# another summation order (single-threaded Eigen: <= 5e-7) with room, and far below what a real change moves
# (optim.lr x 1.01 moves step-1 weights by >= 5e-4). The FP8 state's sums hold amax values that a one-ulp
# difference upstream can change by one E4M3 step, so they get 1e-3.
RTOL, RTOL_FP8 = 1e-5, 1e-3

make = load_script("make_golden_checkpoint")
GOLDEN = make.GOLDEN


def expected() -> dict:
    return json.loads((GOLDEN / "expected.json").read_text())


def test_the_golden_checkpoint_is_committed_small_and_of_this_format():
    assert GOLDEN == REPO / "tests" / "golden" / f"checkpoint-v{FORMAT_VERSION}"
    files = [p for p in GOLDEN.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 700_000
    record = expected()
    assert record["format_version"] == FORMAT_VERSION and record["saved_step"] == make.SAVED_STEP
    assert (GOLDEN / "checkpoints" / str(make.SAVED_STEP)).is_dir()


def test_golden_checkpoint_restores_verified_and_trains_one_step_to_the_pinned_numbers(tmp_path):
    before = {str(p): p.read_bytes() for p in GOLDEN.rglob("*") if p.is_file()}
    got, want = make.resume_one_step(GOLDEN, tmp_path), expected()
    assert got["restored"] == want["restored"]  # step, every array's checksum, the data cursor: exact
    for key, value in want["step"].items():
        assert got["step"][key] == pytest.approx(value, rel=RTOL), key
    assert sorted(got["state"]) == sorted(want["state"])
    for path, value in want["state"].items():
        rel = RTOL_FP8 if path.startswith("fp8.") else RTOL
        assert got["state"][path] == pytest.approx(value, rel=rel, abs=1e-12), path
    assert {str(p): p.read_bytes() for p in GOLDEN.rglob("*") if p.is_file()} == before  # read, never written


def _copy_with_meta(tmp_path, edit) -> Path:
    """A run directory holding the golden checkpoint with its JSON meta edited by `edit` and re-signed (its
    metadata checksums recomputed: an intact checkpoint, not a damaged one)."""
    run = tmp_path / "run"
    shutil.copytree(GOLDEN / "checkpoints", run / "checkpoints")
    step_dir = run / "checkpoints" / str(make.SAVED_STEP)
    meta_file = step_dir / "meta" / "metadata"  # Orbax's JsonSave: the meta as plain JSON
    meta = json.loads(meta_file.read_text())
    edit(meta)
    meta.pop(META_CHECKSUMS)
    meta[META_CHECKSUMS] = meta_checksums(meta, make.SAVED_STEP)
    meta_file.write_text(json.dumps(meta))
    return run


def _train(run, steps: int) -> tuple[int, str, str]:
    from yxanul_jax.cli import main

    return run_cli(main, ["train", "--run-dir", run, *make.OVERRIDES, f"data.train={GOLDEN / 'data'}",
                          f"train.steps={steps}"])


def test_a_newer_format_is_refused_in_one_line_and_left_in_place(tmp_path):
    run = _copy_with_meta(tmp_path, lambda meta: meta.update({FORMAT: FORMAT_VERSION + 1}))
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    rc, _, err = _train(run, make.SAVED_STEP + 1)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and lines[-1].startswith("error: checkpoint step 2 in "), err[-2000:]
    assert (f"checkpoint format version {FORMAT_VERSION + 1}, newer than the {FORMAT_VERSION} this yxanul-jax reads; "
            "upgrade yxanul-jax") in lines[-1]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before  # nothing written, nothing moved aside


def test_a_checkpoint_without_a_format_version_reads_as_version_1(tmp_path):
    assert format_refusal({}) is None and format_refusal({FORMAT: FORMAT_VERSION}) is None
    assert "no yxanul-jax writes" in format_refusal({FORMAT: "2"})
    run = _copy_with_meta(tmp_path, lambda meta: meta.pop(FORMAT))
    rc, out, err = _train(run, make.SAVED_STEP)  # finished: restored, validated, nothing trained
    assert rc == 0 and f"resumed from step {make.SAVED_STEP}" in out, err[-2000:]
