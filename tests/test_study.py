"""The plot command and scripts/study.py: real runs, real metrics files, a real PNG and table."""
from __future__ import annotations

import json
import os

import pytest

from conftest import TRAINED_RUN, load_script
from data_fixtures import run_cli
from yxanul_jax import plot
from yxanul_jax.training.monitor import MetricsWriter

pytestmark = pytest.mark.slow  # runs a script end to end: `pytest -m "not slow"` skips it

PNG = b"\x89PNG\r\n\x1a\n"


def _study():
    return load_script("study")


def test_plot_command_draws_runs_and_refuses_mistakes(tmp_path):
    for name, slope in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        with MetricsWriter(str(tmp_path / name)) as w:
            for step in range(1, 6):
                w.write({"step": step, "loss": 6 - slope * step / 5, "lr": 1e-3, "tokens": 100 * step,
                         "tokens_per_sec": 1000.0})
            w.write({"step": 5, "tokens": 500, "val/mean/loss": 5.0 - slope / 10})
    out = tmp_path / "cmp.png"
    rc, stdout, stderr = run_cli(plot.main, [tmp_path / "a", tmp_path / "b", "--output", out])
    assert rc == 0 and out.read_bytes().startswith(PNG) and "2 runs" in stdout
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # written through a rename
    assert plot.series(plot.read_metrics(str(tmp_path / "b")), "val/mean/loss") == ([500.0], [4.8])
    runs = {name: plot.read_metrics(str(tmp_path / name)) for name in ("a", "b")}
    assert plot.panels_of(runs) == plot.PANELS  # no loss term of one's own: the four panels
    with MetricsWriter(str(tmp_path / "b"), resume_step=5) as w:  # a run with a term of its own (fit(loss=...))
        w.write({"step": 6, "loss": 4.0, "lr": 1e-3, "tokens": 600, "tokens_per_sec": 1000.0, "loss/hidden_l2": 0.3})
    runs["b"] = plot.read_metrics(str(tmp_path / "b"))
    assert plot.panels_of(runs) == (*plot.PANELS, ("loss/hidden_l2", "loss/hidden_l2 (per token)"))
    rc, _, _ = run_cli(plot.main, [tmp_path / "a", tmp_path / "b", "--output", out])
    assert rc == 0 and out.read_bytes().startswith(PNG)
    for argv, words in (([tmp_path / "missing"], "no metrics.jsonl"),
                        ([tmp_path / "a", "--output", tmp_path / "x.jpg"], "must end in .png"),
                        ([tmp_path / "a", "--output", out / "x.png"], "is a file")):
        rc, _, stderr = run_cli(plot.main, argv)
        assert rc == 2 and words in stderr and len(stderr.strip().splitlines()) == 1
    rc, _, _ = run_cli(plot.main, [tmp_path / "a", "--output", tmp_path / "new" / "dir" / "x.png"])
    assert rc == 0 and (tmp_path / "new" / "dir" / "x.png").read_bytes().startswith(PNG)  # its folders made


def test_plot_refuses_a_binary_metrics_file_and_outputs_it_cannot_write(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"\xff\xfe\x00 not text\n")
    folder = tmp_path / "d.png"
    folder.mkdir()
    binary = f"'{run / 'metrics.jsonl'}' line 1 holds invalid UTF-8"
    for argv, needle in (([run, "--output", tmp_path / "x.png"], binary),
                         ([run, "--output", ""], "--output is empty (an unset shell variable?)"),
                         ([run, "--output", folder], f"--output '{folder}' is a folder"),
                         ([run, "--output", "/proc/yxanul-plot.png"], "'/proc/yxanul-plot.png'")):
        rc, _, stderr = run_cli(plot.main, argv)
        assert rc == 2 and needle in stderr and stderr.count("\n") == 1 and ".tmp-" not in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["d.png", "run"] and os.listdir(folder) == []
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # rows, but none with a metric to draw (was a traceback)
    rc, _, stderr = run_cli(plot.main, [run, "--output", tmp_path / "x.png"])
    assert rc == 2 and "holds loss, " in stderr and stderr.count("\n") == 1 and not (tmp_path / "x.png").exists()


def test_plot_skips_rows_without_a_step_or_numbers_and_writes_where_a_tilde_points(tmp_path, monkeypatch):
    # rows a hand edit or another tool left (a string, a list, no step) are skipped as torn lines are (each was a
    # traceback); `--output=~/x.png` (bash leaves `~` there) is written in the home folder, not in a folder `~`
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    (home / "run").mkdir(parents=True)
    cwd.mkdir()
    rows = [{"step": 1, "tokens": "abc", "loss": 3.0}, {"tokens": 100, "loss": 3.0}, {"step": [1], "loss": 2.0},
            {"step": True, "tokens": 50, "loss": 9.0}, {"step": 2, "tokens": 200, "loss": 2.5},
            {"step": 3, "tokens": 300, "loss": 2.0, "lr": "x"}]
    (home / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot.series(plot.read_metrics(str(home / "run")), "loss") == ([200.0, 300.0], [2.5, 2.0])
    assert plot.series(plot.read_metrics(str(home / "run")), "lr") == ([], [])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    rc, stdout, stderr = run_cli(plot.main, ["~/run", "--output=~/x.png"])
    assert rc == 0 and (home / "x.png").read_bytes().startswith(PNG), stdout + stderr
    assert os.listdir(cwd) == []


def test_tokens_to_target_interpolates_and_summary_compares_arms():
    study = _study()
    assert study.tokens_to([100, 200, 300], [6.0, 5.0, 4.0], 4.5) == pytest.approx(250)
    assert study.tokens_to([100, 200], [6.0, 5.0], 4.0) is None
    rows = lambda losses: [{"step": i + 1, "tokens": 100 * (i + 1), "val/mean/loss": v} for i, v in enumerate(losses)]
    summary = study.summarize({"a": {0: rows([6, 5, 4]), 1: rows([6, 5, 4.2])},
                               "b": {0: rows([6, 5.5, 5]), 1: rows([6, 5.4, 4.8])}}, target=5.0)
    a, b = summary["arms"]["a"], summary["arms"]["b"]
    assert a["mean"] == pytest.approx(4.1) and a["spread"] == pytest.approx(0.1414, abs=1e-4)
    # b's seed 1 crosses 5.0 between (200, 5.4) and (300, 4.8): 200 + 100 * 0.4 / 0.6
    assert a["mean_tokens_to_target"] == 200 and b["tokens_to_target"] == {"0": 300, "1": 267}
    assert b["mean_tokens_to_target"] == 283 and b["tokens_ratio"] == pytest.approx(283 / 200, abs=1e-3)
    assert b["mean_delta"] == pytest.approx(0.8)
    # paired by seed: a reaches its own final loss at its last point (1.0x); b never reaches a's 4 on seed 0, and
    # reaches a's 4.2 on seed 1 nowhere either (4.8 at the end); a at b's losses: b is the second arm, not compared
    assert a["paired_tokens_ratio"] == {"0": 1.0, "1": 1.0} and b["paired_tokens_ratio"] == {"0": None, "1": None}
    fast = study.summarize({"slow": {0: rows([6, 5, 4])}, "fast": {0: rows([5, 4, 3])}}, target=None)
    assert fast["arms"]["fast"]["paired_tokens_ratio"] == {"0": pytest.approx(200 / 300, abs=1e-3)}  # slow's 4: 200 of 300
    assert "0.67x" in study.markdown(fast, [0], "h")


def test_study_runs_arms_and_seeds_and_writes_table_and_plot(tmp_path):
    overrides = [o for o in TRAINED_RUN if not o.startswith(("train.steps", "eval.interval"))]
    argv = ["--out", str(tmp_path / "st"), "--seeds", "0", "1", "--eval-seq-len", "32",
            "--set", *overrides, "model.n_layers=1", "train.steps=4", "eval.interval=2",
            "--arm", "plain", "--arm", "hot", "optim.lr=0.01"]
    rc, stdout, _ = run_cli(_study().main, argv)
    assert rc == 0, stdout
    record = json.loads(stdout.strip().splitlines()[-1])
    assert set(record["arms"]) == {"plain", "hot"} and record["seeds"] == [0, 1]
    finals = record["arms"]["plain"]["final"]
    assert set(finals) == {"0", "1"} and finals["0"] != finals["1"]  # seeds differ
    assert record["arms"]["hot"]["final"] != finals  # the arm's override took effect
    assert (tmp_path / "st" / "study.png").read_bytes().startswith(PNG)
    assert "| plain |" in (tmp_path / "st" / "study.md").read_text()
    saved = (tmp_path / "st" / "runs" / "hot" / "seed1" / "config.yaml").read_text()
    assert "lr: 0.01" in saved and "seq_len: 32" in saved
    rc, _, stderr = run_cli(_study().main, ["--out", str(tmp_path / "bad"), "--arm", "x", "model.nope=1"])
    assert rc == 2 and "model.nope" in stderr and not (tmp_path / "bad").exists()  # checked before writing
