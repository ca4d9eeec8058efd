"""The benchmark kit runs on a CPU too: scripts/gpu_bench.py (tiny config, predicted for an H100 and
profiled against that prediction), scripts/profile_summary.py."""
from __future__ import annotations

import pytest

import json
import os

from conftest import REPO, load_script
from data_fixtures import run_cli

from yxanul_jax.analysis import gpus, perf

pytestmark = pytest.mark.slow  # runs a script end to end: `pytest -m "not slow"` skips it


def test_gpu_bench_measures_each_precision_and_the_pytorch_reference(tmp_path):
    out = tmp_path / "bench"
    rc, stdout, _ = run_cli(load_script("gpu_bench").main,
                            ["--config", REPO / "configs/tiny.yaml", "--stages", "0", "--baseline", "",
                             "--precisions", "bf16", "fp8-xla", "fp8-te", "--steps", "2", "--warmup", "1",
                             "--torch", "--predict-for", "h100", "--profile", "--profile-steps", "1", "--out", out,
                             "model.attention=xla"])
    assert rc == 0
    record = json.loads(stdout.strip().splitlines()[-1])
    rows = {r["precision"]: r for r in record["rows"]}
    assert set(rows) == {"bf16", "fp8-xla", "fp8-te"}
    for name in ("bf16", "fp8-xla"):
        r = rows[name]
        assert r["tokens_per_sec"] > 0 and r["compile_s"] > 0 and r["tokens_per_step"] == 64 * 32
        assert r["planner_bytes"] > 0 and r["xla_peak_bytes"] > 0
        # HLO FLOPs (trip counts, remat recompute): at least the model's 6 N + attention
        assert r["hlo_tflops_per_step"] >= 0.9 * r["model_tflops_per_step"] > 0
        assert r["mfu_hlo"] is None  # a CPU has no peak; the prediction is for the named GPU
        assert r["predicted_gpu"] == "h100" and r["predicted_step_ms"] > 0 and r["predicted_tokens_per_s"] > 0
        assert r["measured_over_predicted"] == pytest.approx(1e3 * r["step_s"] / r["predicted_step_ms"])
        assert sum(r["predicted_categories"].values()) == pytest.approx(r["predicted_step_ms"])
        # the CPU trace's XLA ops are the model's kernels: (nearly) all predicted time is matched
        ratios = r["category_ratios"]
        assert any(c["measured_ms"] > 0 for c in ratios.values())
        predicted = sum(c["predicted_ms"] for c in ratios.values())
        assert sum(c["matched_predicted_ms"] for c in ratios.values()) >= 0.9 * predicted
        assert r["profile"]["matched_ms_per_step"] >= 0.9 * r["profile"]["device_ms_per_step"] > 0
        # a profiled cell runs without command buffers, keeps its HLO, names what it predicted but never saw
        assert r["overrides"] == ["model.attention=xla"] and r["command_buffers"] == "off"
        assert isinstance(r["profile"]["not_seen_top"], list)
        assert (out / "profile" / f"tiny-stage0-{name}" / "step.hlo.gz").exists()
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert len(logs) == 3 and all(n.startswith("tiny-stage0-") and n.endswith(".log") for n in logs)
    assert "Transformer Engine" in rows["fp8-te"]["skipped"]  # not installed here: recorded, not hidden
    torch_row = rows["bf16"]["torch"]
    assert torch_row["engine"] == "pytorch" and torch_row["tokens_per_sec"] > 0
    assert rows["bf16"]["ratio_vs_torch"] == rows["bf16"]["tokens_per_sec"] / torch_row["tokens_per_sec"]
    assert json.loads((out / "bench.json").read_text())["rows"] == record["rows"]
    md = (out / "bench.md").read_text()
    assert "| tiny | 0 | 64 x 32 | fp8-xla |" in md and "| predicted ms | measured / predicted |" in md
    assert "| MFU HLO |" in md
    calib = perf.load_calibration("h100", str(out / "calibration.json"))
    assert calib["ratios"] and all(v > 0 for v in calib["ratios"].values())
    assert "gpu_bench.py --profile" in calib["source"] and "tiny stage 0 fp8-xla" in calib["source"]
    assert "copy its 'h100' entry into yxanul_jax/analysis/perf_calibration.json" in stdout
    # a calibrated prediction multiplies each category by its ratio
    kernels = [perf.Kernel("k", "fusion", "kLoop", 1, 0.0, 1e9, None, "copies", "")]
    plain = perf.predict(kernels, gpus.GPUS["h100"])["predicted_step_ms"]
    calibrated = perf.predict(kernels, gpus.GPUS["h100"], calibration=calib)["predicted_step_ms"]
    assert calibrated == pytest.approx(plain * calib["ratios"].get("copies", 1.0))
    # --calibrate-from: profiled cells of several runs merged (this run twice: every sum doubles, ratios stay)
    merged_out = tmp_path / "merged"
    rc, stdout, _ = run_cli(load_script("gpu_bench").main,
                            ["--calibrate-from", out / "bench.json", out / "bench.json", "--out", merged_out])
    merged = perf.load_calibration("h100", str(merged_out / "calibration.json"))
    assert rc == 0 and "merged from 2 runs" in merged["source"]
    assert "4 cells re-read with the model of" in merged["source"]  # the kept traces and HLO, read again
    for cat, c in merged["categories"].items():
        assert c["measured_ms"] == pytest.approx(2 * calib["categories"][cat]["measured_ms"])
        assert merged["ratios"].get(cat) == pytest.approx(calib["ratios"].get(cat))
    rc, _, err = run_cli(load_script("gpu_bench").main, ["--calibrate-from", tmp_path / "nope.json", "--out", tmp_path])
    assert rc == 2 and err.startswith("error: --calibrate-from ") and len(err.strip().splitlines()) == 1
    # a kept HLO cut short: named in one line, nothing written
    hlo = out / "profile" / "tiny-stage0-bf16" / "step.hlo.gz"
    hlo.write_bytes(hlo.read_bytes()[:100])
    rc, _, err = run_cli(load_script("gpu_bench").main, ["--calibrate-from", out / "bench.json", "--out", tmp_path / "cut"])
    assert rc == 2 and "step.hlo.gz of a profiled cell is not readable" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cut").exists()


def test_a_profile_from_before_the_kernels_were_timed_gives_no_head_and_loss_ratio_when_re_read():
    # A kept H200 profile of 2026-11-26 (its trace and step.hlo.gz in docs/bench): re-read with today's model, which
    # charges the fused kernels at the rates of those timed on perf.FUSED_CE_MEASURED_DATE, it must not calibrate
    # head + loss (that day's kernels, under the same names, were others); its other categories it still does
    import copy

    gpu_bench = load_script("gpu_bench")
    from yxanul_jax.analysis import perf

    cell = REPO / "docs/bench/h200_2026-11-26_night/calibrate/s9_fp8p"
    record = json.loads((cell / "bench.json").read_text())
    old = copy.deepcopy(record["rows"][0])
    assert record["date"] < perf.FUSED_CE_MEASURED_DATE and "output head + loss" in old["category_ratios"]
    assert gpu_bench.reread_profile(old, str(cell), record["date"])
    assert "output head + loss" not in old["category_ratios"] and perf.FUSED_CE_TIMED not in old["category_ratios"]
    assert {"GEMM fp8", "attention", "FP8 scaling"} <= set(old["category_ratios"])
    dated_today = copy.deepcopy(record["rows"][0])  # the same cell as if run on the day of the timing: both kept
    assert gpu_bench.reread_profile(dated_today, str(cell), perf.FUSED_CE_MEASURED_DATE)
    assert {"output head + loss", perf.FUSED_CE_TIMED} <= set(dated_today["category_ratios"])


def test_gpu_bench_without_a_gpu_records_no_prediction(tmp_path):
    gpu_bench = load_script("gpu_bench")
    row = gpu_bench.prediction([], None, 1.0, 1, 0.1, "cpu")
    assert row["predicted_step_ms"] is None and row["prediction"].startswith("none:")
    assert "- | - |" in gpu_bench.table([{"config": "c", "stage": 0, "precision": "bf16", "compile_s": 1.0,
                                          "step_s": 0.1, "tokens_per_sec": 1.0, "mfu_model": None, "mfu_hlo": None,
                                          "peak_bytes": None, "xla_peak_bytes": None, "planner_bytes": None, **row}])
    with pytest.raises(SystemExit):
        run_cli(gpu_bench.main, ["--predict-for", "h1000", "--out", tmp_path])


def test_kernel_times_match_gpu_kernel_events_to_hlo_instructions():
    ps = load_script("profile_summary")
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13(Compute)"}}]

    def kernel(name, dur, **args):
        return {"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": dur, "name": name, "args": args}

    events = meta + [
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 10.0, hlo_op="custom-call.3", hlo_module="jit_train_step"),
        kernel("loop_add_fusion_2", 4.0, hlo_op="loop_add_fusion.2", hlo_module="jit_train_step"),
        kernel("loop_add_fusion_2", 3.0, hlo_op="loop_add_fusion.5", hlo_module="jit_train_step"),  # a reused kernel
        kernel("input_reduce_fusion_1", 2.0, hlo_op="command_buffer", hlo_module="jit_train_step"),  # in a CUDA graph
        kernel("triton_softmax_4_0", 1.0),  # no hlo_op: its name, less a launch suffix
        kernel("memcpy32_post", 5.0),  # nothing of the step's
        kernel("loop_add_fusion_2", 50.0, hlo_op="loop_add_fusion.2", hlo_module="jit_other")]  # another module
    names = ["custom-call.3", "loop_add_fusion.2", "loop_add_fusion.5", "input_reduce_fusion.1", "triton_softmax.4"]
    t = ps.kernel_times(events, names, "HloModule jit_train_step, is_scheduled=true\n")
    assert t["us"] == {"custom-call.3": 10.0, "loop_add_fusion.2": 4.0, "loop_add_fusion.5": 3.0,
                       "input_reduce_fusion.1": 2.0, "triton_softmax.4": 1.0}
    assert t["unmatched"] == {"memcpy32_post": 5.0} and t["total_us"] == 25.0 and t["matched_us"] == 20.0


def test_profile_summary_finds_the_ops_of_a_traced_step(tmp_path):
    rc, stdout, _ = run_cli(load_script("profile_summary").main,
                            ["--config", REPO / "configs/tiny.yaml", "--steps", "1", "--out", tmp_path / "p"])
    assert rc == 0, stdout
    record = json.loads(stdout.strip().splitlines()[-1])
    assert record["ops"] > 0 and record["top"] and abs(sum(record["categories"].values()) - 1) < 1e-6
    # categories from the performance model's kernels (the CPU trace names XLA ops by instruction)
    assert record["category_source"].startswith("performance model")
    assert any(c.startswith("GEMM") for c in record["categories"]) and record["top"][0]["category"] in perf.CATEGORIES
    assert sum(v for c, v in record["categories"].items() if c in perf.CATEGORIES) >= 0.9


def test_fused_ce_check_is_correct_and_timed_on_a_cpu(tmp_path):
    # The lent GPU's check (scripts/fused_ce_check.py) at a tiny shape: Pallas interpret mode on CPU.
    out = tmp_path / "fused_ce.json"
    rc, stdout, _ = run_cli(load_script("fused_ce_check").main,
                            ["--config", REPO / "configs/tiny.yaml", "--check-tokens", "130", "--time-tokens", "128",
                             "--iters", "1", "--json-out", out, "--tiles", "default", "fwd=64x32,dw=32x64w4",
                             "dx=128x128s2:mosaic"])
    assert rc == 0, stdout
    record = json.loads(stdout.strip().splitlines()[-1])
    assert record == json.loads(out.read_text()) and record["ok"]
    small, small64, overflow, overflow_triton, full, tiled, tiled_overflow, mosaic_small, mosaic_overflow = (
        record["checks"])
    assert overflow_triton["tiles"] == "dx=128x128s2,dw=128x128s2" and overflow_triton["inputs"] == "overflow"
    # a set with a mosaic kernel (asked for, or the default's `auto` dx): its small case at K 64 (the narrowest it
    # takes) and the overflow rows as well
    assert (mosaic_small["tiles"], mosaic_small["k"]) == ("dx=128x128s2:mosaic", 64)
    assert (mosaic_overflow["tiles"], mosaic_overflow["inputs"]) == ("dx=128x128s2:mosaic", "overflow")
    assert (small["tokens"], small["vocab_rows"], small["v_real"], small["k"], small64["k"]) == (200, 300, 290, 32, 64)
    assert overflow["inputs"] == "overflow" and small["inputs"] == full["inputs"] == "random"  # the fallback walk
    assert full["tokens"] == 130 and full["k"] == record["k"] == 128
    assert tiled["tiles"] == tiled_overflow["tiles"] == "fwd=64x32,dw=32x64w4" and tiled["tokens"] == 200
    # each row names the kernels that ran: on a CPU the Triton ones in interpret mode, whatever was asked
    assert {c["runs"] for c in (small, small64, full, mosaic_small)} == {
        "fwd=128x64w8s3,dx=128x128w8s2,dw=128x128w8s2"}
    assert tiled["runs"] == "fwd=64x32w8s3,dx=128x128w8s2,dw=32x64w4s2"
    for c in record["checks"]:
        assert c["ok"] and c["padded_rows_zero_grad"]
        assert all(0 <= e <= c["bounds"][n] for n, e in c["rel_err"].items())
    fused_sets = ("default", "fwd=64x32,dw=32x64w4", "dx=128x128s2:mosaic")
    assert {(r["kernel"], r["tiles"], r["mode"]) for r in record["timing"]} == {
        *(("fused", t, m) for t in fused_sets for m in ("fwd", "train-fwd", "fwd+bwd")),
        ("chunked", "", "fwd"), ("chunked", "", "fwd+bwd")}
    assert record["fastest_tiles"]["128"] in ("default", "fwd=64x32,dw=32x64w4", "dx=128x128s2:mosaic")
    assert all(r["ms"] > 0 and r["of_peak"] is None for r in record["timing"])  # a CPU has no BF16 peak
    # the kernels read from the compiled HLO: none as custom calls on a CPU (interpret mode: plain HLO ops); the
    # sm_90 reading of the same function is tests/test_gpu_target.py's
    assert all(r["compiled"] == {} for r in record["timing"] if r["kernel"] == "fused")
    import math

    import numpy as np

    fce = load_script("fused_ce_check")
    rc, _, err = run_cli(fce.main, ["--config", REPO / "configs/tiny.yaml", "--tiles", "dx=48x64", "--json-out",
                                    tmp_path / "bad.json"])
    assert rc == 2 and err.startswith("error: --tiles dx=48x64: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad.json").exists()
    assert math.isnan(fce.rel_err(np.array([np.nan, 1.0]), np.ones(2)))  # NaN never passes a bound
    assert fce.rel_err(np.array([1.0, 1.1]), np.ones(2)) > fce.VALUE_RTOL


def test_a_timing_whose_compiled_kernels_are_not_the_asked_ones_is_named():
    # `runs` is what the tiles ask for, `compiled` what the timed HLO held (a GPU): a Mosaic form that did not build
    # (the default's `auto` falls back to Triton) must not pass as the Mosaic kernels' time
    fce = load_script("fused_ce_check")
    mosaic = "fwd=128x64w8s3,dx=128x128w8s2:mosaic,dw=128x128w8s2:mosaic-rs"
    both = {"fused_ce_fwd_dx_ws": "mosaic_gpu_v2", "fused_ce_dw_ws": "mosaic_gpu_v2"}
    assert fce.unlike({"mode": "fwd+bwd", "runs": mosaic, "compiled": both}) == []
    fell_back = {"fused_ce_fwd_dx": "__gpu$xla.gpu.triton", "fused_ce_dw_ws": "mosaic_gpu_v2"}
    assert fce.unlike({"mode": "fwd+bwd", "runs": mosaic, "compiled": fell_back}) == [
        "dx asked for fused_ce_fwd_dx_ws, compiled ['fused_ce_dw_ws', 'fused_ce_fwd_dx']"]
    assert fce.unlike({"mode": "train-fwd", "runs": fce.TRITON, "compiled": {"fused_ce_fwd_dx_ws": "m"}}) == [
        "dx asked for fused_ce_fwd_dx, compiled ['fused_ce_fwd_dx_ws']"]
    # dw is not in the training forward alone, the forward alone runs neither, and a CPU compiles no custom call
    assert fce.unlike({"mode": "train-fwd", "runs": mosaic, "compiled": {"fused_ce_fwd_dx_ws": "m"}}) == []
    assert fce.unlike({"mode": "fwd", "runs": mosaic, "compiled": {"fused_ce_fwd": "t"}}) == []
    assert fce.unlike({"mode": "fwd+bwd", "runs": mosaic, "compiled": {}}) == []
    # the row then says what ran: `runs` the kernels timed (dx Triton's at its blocks), `asked` the tiles' ask
    row = {"mode": "fwd+bwd", "runs": mosaic}
    fce.read_ran(row, fell_back)
    assert row["asked"] == mosaic and row["runs"] == "fwd=128x64w8s3,dx=128x128w8s2,dw=128x128w8s2:mosaic-rs"
    assert row["unlike"] == ["dx asked for fused_ce_fwd_dx_ws, compiled ['fused_ce_dw_ws', 'fused_ce_fwd_dx']"]
    row = {"mode": "fwd+bwd", "runs": mosaic}
    fce.read_ran(row, both)
    assert row == {"mode": "fwd+bwd", "runs": mosaic, "compiled": both}  # as asked: nothing more


def test_the_fastest_tiles_of_each_kernel_are_put_together():
    fce = load_script("fused_ce_check")

    def rows(spec, fwd, both):
        return [{"kernel": "fused", "tiles": spec, "mode": "fwd", "tokens": 8, "ms": fwd},
                {"kernel": "fused", "tiles": spec, "mode": "fwd+bwd", "tokens": 8, "ms": both}]

    timed = (rows("default", 10, 30) + rows("fwd=64x128", 8, 29) + rows("fwd=256x128", 9, 20)
             + rows("dx=64x128", 10, 25) + rows("dw=128x64", 10, 35) + rows("fwd=16x16,dx=16x16", 1, 1))
    specs = ["default", "fwd=64x128", "fwd=256x128", "dx=64x128", "dw=128x64", "fwd=16x16,dx=16x16"]
    # the forward by its forward time, dx and dw by forward + backward; sets changing two kernels say nothing; each
    # keeps its default warps and stages (core.tiles: the forward 3 stages, the training kernels 2)
    assert fce.combined_spec(timed, specs, 8) == "fwd=64x128w8s3,dx=64x128w8s2"
    assert fce.combined_spec(timed, specs + ["dx=64x128,fwd=64x128"], 8) is None  # timed already
    assert fce.combined_spec(rows("default", 1, 1) + rows("dx=64x128", 2, 2), ["default", "dx=64x128"], 8) is None


def test_attention_check_times_xla_attention_per_stage_on_a_cpu():
    rc, stdout, _ = run_cli(load_script("attention_check").main,
                            ["--config", REPO / "configs/yxanul_197m.yaml", "--stages", "0", "3", "--iters", "1",
                             "--max-tokens", "256"])
    assert rc == 0, stdout
    rows = json.loads(stdout.strip().splitlines()[-1])["rows"]
    assert [(r["stage"], r["seq_len"], r["tokens"]) for r in rows] == [(0, 8, 256), (3, 64, 256)]
    assert all(r["xla_ms"] > 0 and "cudnn_ms" not in r for r in rows)  # cuDNN needs a GPU: not timed here


def test_gpu_lease_skips_what_its_deadline_cannot_hold(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    bad = subprocess.run(["bash", "scripts/gpu_lease.sh", "60", "nope"], cwd=REPO, env=env, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: unknown plan 'nope' (bench | mosaic | ab | tiles | short | proj | split | calibrate | fp8 | wgrad)"
    assert not (tmp_path / "lease.log").exists()  # refused before anything was written
    # every plan under a deadline too short for any step: each says so and still packs its results (the plans
    # run side by side, each with its own OUT)
    steps = {"calibrate": ("s9_fp8_prof", "s0_fp8_prof", "s9_bf16_prof", "s2_fp8_prof"),
             "fp8": ("gemm_probe", "s9_fp8_dequant_prof", "s9_fp8_f32", "s0_fp8_dequant"),
             "ab": ("fused_ce", "s9_fp8", "s9_fp8_remat_full", "s0_fp8", "s0_fp8_xla_attention", "s9_bf16",
                    "s9_bf16_remat_full", "s8_fp8"),
             "tiles": ("tiles_sweep",),
             "short": ("s0_fp8", "s0_fp8_xla_attention", "s2_fp8", "s1_fp8_xla_attention", "s0_fp8_prof",
                       "r270_s5_fp8-xla", "r270_s5_bf16"),
             "proj": ("s0_fp8", "s0_fp8_loop", "s9_fp8", "s9_fp8_loop_o_fp8", "s9_bf16_loop_unfused"),
             "split": ("fused_ce", "s9_fp8", "s9_fp8_attention", "s1_fp8", "s1_fp8_full"),
             "mosaic": ("muon_rounding", "fused_ce", "s9_fp8", "s0_fp8", "s9_fp8_rs", "s9_bf16")}
    procs = {plan: subprocess.Popen(["bash", "scripts/gpu_lease.sh", "12", plan], cwd=REPO,
                                    env={**env, "OUT": str(tmp_path / plan)}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for plan in steps}
    for plan, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        log = (tmp_path / plan / "lease.log").read_text()
        assert all(f"== {step}: skipped" in log for step in steps[plan]), (plan, log)
        assert (tmp_path / plan / "results.tgz").exists()
    assert "== fastest tiles: default" in (tmp_path / "tiles" / "lease.log").read_text()


def test_a_cell_past_its_time_limit_is_recorded_and_the_rest_written(tmp_path):
    out = tmp_path / "bench"
    rc, stdout, _ = run_cli(load_script("gpu_bench").main,
                            ["--config", REPO / "configs/tiny.yaml", "--stages", "0", "--baseline", "",
                             "--precisions", "bf16", "--steps", "1", "--warmup", "1", "--no-torch",
                             "--cell-timeout", "0.5", "--out", out])
    assert rc == 0
    row = json.loads((out / "bench.json").read_text())["rows"][0]
    assert row["failed"] == "stopped after --cell-timeout 0.5 s" and (out / "logs").is_dir()



def test_fp8_gemm_probe_reports_each_form_as_it_ends(tmp_path, capsys):
    # scripts/fp8_gemm_probe.py on a CPU at a tiny size: every (option set, form) cell is timed, lists its
    # kernels, agrees with the `f32` form, and is printed when it ends (a GPU run cut short keeps its lines).
    out = tmp_path / "probe.json"
    rc, stdout, _ = run_cli(load_script("fp8_gemm_probe").main,
                            ["--tokens", "64", "--shapes", "32x48", "--iters", "2", "--options", "default",
                             "no_triton_gemm", "--json-out", str(out)])
    assert rc == 0, stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["options"], r["form"]) for r in rows] == [(o, f) for o in ("default", "no_triton_gemm")
                                                         for f in ("bf16", "f32", "direct", "dequant")]
    assert all(r["ms"] > 0 and r["gemm_kernels"] == 3 for r in rows)
    assert all(r["agree"] for r in rows if r["form"] in ("direct", "dequant"))
    lines = stdout.splitlines()
    assert lines[0].startswith("32x48 default bf16: ") and "GEMM +" in lines[0]
    assert json.loads(lines[-1])["cells"][1]["form"] == "f32"
    with pytest.raises(SystemExit) as e:
        load_script("fp8_gemm_probe").main(["--shapes", "32by48"])
    assert e.value.code == 2 and "not IxO" in capsys.readouterr().err


def test_gpu_bench_refuses_stages_beyond_the_curriculum_before_running_any(tmp_path):
    # yxanul-270m has 6 stages: --stages 9 is one line, exit 2, and nothing is written (no cell started)
    rc, _, err = run_cli(load_script("gpu_bench").main, ["--config", "configs/yxanul_270m.yaml", "--stages", "0", "9",
                                                         "--out", tmp_path / "out"])
    assert rc == 2 and err.strip() == ("error: --stages 9: configs/yxanul_270m.yaml has 6 curriculum stages, 0-5; "
                                       "pick --stages among them")
    assert not (tmp_path / "out").exists()
    rc, _, err = run_cli(load_script("gpu_bench").main, ["--config", "configs/tiny.yaml", "model.nope=1", "--stages",
                                                         "0", "--out", tmp_path / "out"])
    assert rc == 2 and err.startswith("error: ") and "model.nope" in err and len(err.strip().splitlines()) == 1
