"""scripts/fp8_head_error.py: what FP8 operands would do to the output head's logits and loss, on a trained run."""
from __future__ import annotations

import json

import numpy as np

from conftest import load_script
from data_fixtures import run_cli


def test_fp8_head_operands_err_more_than_bf16_on_a_trained_run(trained_run):
    script = load_script("fp8_head_error")
    rc, out, err = run_cli(script.main, ["--run-dir", str(trained_run), "--tokens", "512", "--seq-len", "64"])
    assert rc == 0, out + err
    r = json.loads(out.strip().splitlines()[-1])
    assert r["tokens"] == 512 and r["k"] > 0 and r["vocab"] > r["k"] and np.isfinite(r["loss"])
    bf16, e4m3 = r["bf16"], r["e4m3"]
    # BF16 keeps 8 bits of mantissa, E4M3 4: the logits' error and each token's loss change grow with it
    assert 0 < bf16["logit_rms_error"] < e4m3["logit_rms_error"] and bf16["logit_max_error"] < e4m3["logit_max_error"]
    assert 0 < bf16["token_loss_change"] < e4m3["token_loss_change"]
    # the operands are the model's head: their loss is the model's own on the same targets (its logits in BF16)
    assert abs(r["loss"] - r["model_loss"]) < 1e-2 * r["loss"]


def test_rounding_matches_the_formats():
    script = load_script("fp8_head_error")
    a = np.array([1.0, 1.0 + 2 ** -9, -3.0, 448.0 / 3], np.float32)
    assert script.rounded(a, "bf16")[1] == 1.0  # below BF16's half step at 1: rounds to 1
    e4m3 = script.rounded(a, "e4m3")  # scale 448 / amax = 3: 448 is exact, 3 -> 9 -> 9 (E4M3 has 3 mantissa bits)
    assert e4m3[3] == np.float32(448.0) / 3 and e4m3[2] == -3.0
    # the largest relative error E4M3 makes on normal values: half a step of 2^-3 just above a power of 2,
    # 2^-4 / (1 + 2^-4) = 1/17 (a format of 4 mantissa bits would stay under 1/33, E5M2's reach 1/9)
    x = np.random.default_rng(0).uniform(1, 2, 10_000).astype(np.float32) * 100
    rel = np.abs(script.rounded(x, "e4m3") - x) / x
    assert 0.055 < rel.max() <= 1 / 17 + 1e-6


def test_mistakes_are_one_line(tmp_path, trained_run):
    main = load_script("fp8_head_error").main
    for args, says in ((["--run-dir", str(tmp_path / "none")], "is not a run directory"),
                       (["--run-dir", str(trained_run), "--tokens", "100", "--seq-len", "128"],
                        "--seq-len 128 must be"),
                       (["--run-dir", str(trained_run), "--tokens", "1000000000", "--seq-len", "100000000"],
                        "fewer than one row of --seq-len")):
        rc, _, err = run_cli(main, args)
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, (args, err)
