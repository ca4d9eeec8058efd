"""scripts/loop_efficiency.py: the real train loop on prepared shards vs the bare compiled step, per stage."""
from __future__ import annotations

import pytest

import json
import math

from conftest import load_script
from data_fixtures import prepared, docs, tiny_tok, run_cli  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow  # runs a script end to end: `pytest -m "not slow"` skips it

SMALL = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.ffn_dim=64",
         "model.embed_rank=0", "curriculum.0.seq_len=16", "curriculum.0.batch_size=4", "curriculum.1.seq_len=32",
         "curriculum.1.batch_size=2", "fp8.enabled=false"]


def test_loop_and_bare_step_per_stage_with_the_stall_at_the_change(prepared, tiny_tok):  # noqa: F811
    script = load_script("loop_efficiency")
    rc, stdout, stderr = run_cli(script.main, ["--steps", "8", "--skip", "2", f"data.train={prepared}",
                                               f"model.vocab_size={tiny_tok.vocab_size}", *SMALL])
    assert rc == 0, stderr
    record = json.loads(stdout.strip().splitlines()[-1])
    first, second = record["stages"]
    assert (first["seq_len"], second["seq_len"]) == (16, 32) and first["tokens_per_step"] == 64
    assert first["loop_steps"] == second["loop_steps"] == 8  # every step of each stage logged by the real loop
    for row in record["stages"]:
        assert row["loop_tokens_per_sec"] > 0 and row["bare_tokens_per_sec"] > 0
        assert row["ratio"] == row["loop_tokens_per_sec"] / row["bare_tokens_per_sec"]
    # the change's compile wait was recorded (a measured wait is > 0; a stage missing from the waits reads 0.0)
    assert "stall_s" not in first and second["stall_s"] >= second["compile_wait_s"] > 0
    # outside the loop's training time: the compile waits, and only the run's final validation and save
    times = record["times"]
    assert set(times) == {"compile_wait", "validation", "checkpoint"}, times  # stage_waits left out
    assert all(isinstance(v, float) and math.isfinite(v) for v in times.values()), times
    # every step's wait adds up: stage 0's first compile as well as the change's wait
    assert times["compile_wait"] > second["compile_wait_s"] and times["validation"] > 0
    assert "ratio" in stdout and "stall s" in stdout


def test_bad_stages_are_one_line_errors():
    script = load_script("loop_efficiency")
    rc, _, stderr = run_cli(script.main, ["--stages", "7", "--steps", "3"])
    assert rc == 2 and stderr.strip().startswith("error:") and len(stderr.strip().splitlines()) == 1
