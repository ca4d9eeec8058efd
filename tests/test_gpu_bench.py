"""The benchmark kit runs on a CPU too: scripts/gpu_bench.py (tiny config), scripts/profile_summary.py."""
from __future__ import annotations

import pytest

import json

from conftest import REPO, load_script
from data_fixtures import run_cli

pytestmark = pytest.mark.slow  # runs a script end to end: `pytest -m "not slow"` skips it


def test_gpu_bench_measures_each_precision_and_the_pytorch_reference(tmp_path):
    out = tmp_path / "bench"
    rc, stdout, _ = run_cli(load_script("gpu_bench").main,
                            ["--config", REPO / "configs/tiny.yaml", "--stages", "0", "--baseline", "",
                             "--precisions", "bf16", "fp8-xla", "fp8-te", "--steps", "2", "--warmup", "1",
                             "--torch", "--out", out])
    assert rc == 0
    record = json.loads(stdout.strip().splitlines()[-1])
    rows = {r["precision"]: r for r in record["rows"]}
    assert set(rows) == {"bf16", "fp8-xla", "fp8-te"}
    for name in ("bf16", "fp8-xla"):
        r = rows[name]
        assert r["tokens_per_sec"] > 0 and r["compile_s"] > 0 and r["tokens_per_step"] == 64 * 32
        assert r["executed_tflops_per_step"] > 0 and r["planner_bytes"] > 0 and r["xla_peak_bytes"] > 0
    assert "Transformer Engine" in rows["fp8-te"]["skipped"]  # not installed here: recorded, not hidden
    torch_row = rows["bf16"]["torch"]
    assert torch_row["engine"] == "pytorch" and torch_row["tokens_per_sec"] > 0
    assert rows["bf16"]["ratio_vs_torch"] == rows["bf16"]["tokens_per_sec"] / torch_row["tokens_per_sec"]
    assert json.loads((out / "bench.json").read_text())["rows"] == record["rows"]
    assert "| tiny | 0 | 64 x 32 | fp8-xla |" in (out / "bench.md").read_text()


def test_profile_summary_finds_the_ops_of_a_traced_step(tmp_path):
    rc, stdout, _ = run_cli(load_script("profile_summary").main,
                            ["--config", REPO / "configs/tiny.yaml", "--steps", "1", "--out", tmp_path / "p"])
    assert rc == 0, stdout
    record = json.loads(stdout.strip().splitlines()[-1])
    assert record["ops"] > 0 and record["top"] and abs(sum(record["categories"].values()) - 1) < 1e-6
    assert any(r["category"] == "gemm" for r in record["top"])
