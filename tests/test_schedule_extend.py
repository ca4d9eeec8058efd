"""Raising train.steps on a resumed run (training/optim.py `continued`): refused by default in one line, or the
schedule goes on as train.extend says (decay: no jump; wsd: the stable peak), the data stream untouched."""
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from yxanul_jax.core.coerce import to_dict
from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.training.optim import base_schedule, continued

from conftest import TRAINED_RUN
from data_fixtures import run_cli

# TRAINED_RUN (the session's shared compiled shapes) with checkpoints at steps 3 and 6.
BASE = [*TRAINED_RUN, "checkpoint.interval=3", "train.log_every=1"]
PEAK = load_config(None, BASE).optim.peak_lr  # optim.lr (unset: the optimizer's own, Muon's AdamW group's)
FLOOR = PEAK * 0.1  # optim.lr * optim.min_lr_ratio (the default)


def cli(*args) -> tuple[int, str, str]:
    from yxanul_jax.cli import main

    return run_cli(main, ["train", *args])


def rows(run, after: int = 0) -> dict[int, dict]:
    """The metrics rows of the steps after `after`, by step."""
    with open(Path(run) / "metrics.jsonl") as fh:
        return {r["step"]: r for r in map(json.loads, fh) if "lr" in r and r["step"] > after}


def tree(path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def last_meta(run) -> dict:
    from yxanul_jax.training.checkpoint import Checkpointer

    with Checkpointer(str(Path(run) / "checkpoints"), read_only=True) as ckpt:
        return ckpt.read_meta()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny run trained to its end (6 steps, cosine, checkpoints at 3 and 6)."""
    run = tmp_path_factory.mktemp("extend") / "base"
    rc, _, err = cli("--run-dir", run, *BASE)
    assert rc == 0, err[-2000:]
    return run


@pytest.fixture(scope="module")
def extended(finished, tmp_path_factory):
    """The finished run raised to 10 steps with each choice: {choice: run dir}."""
    out = {}
    for how in ("decay", "wsd"):
        run = tmp_path_factory.mktemp(how) / "run"
        shutil.copytree(finished, run)
        rc, stdout, err = cli("--run-dir", run, *BASE, "train.steps=10", f"train.extend={how}")
        assert rc == 0 and f"train.extend={how}: from step 6" in stdout, err[-2000:]
        out[how] = run
    return out


def test_raising_steps_on_a_finished_run_is_refused_in_one_line_and_changes_nothing(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = tree(run)
    rc, _, err = cli("--run-dir", run, *BASE, "train.steps=10")
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and lines[-1].startswith("error: train.steps went from 6 to 10"), err[-2000:]
    assert f"would jump from lr {FLOOR:.3g} to" in lines[-1]  # the cosine's floor, back up to mid-decay
    assert "train.extend=decay" in lines[-1] and "train.extend=wsd" in lines[-1]
    assert tree(run) == before


def test_decay_from_a_finished_run_stays_at_the_floor_and_wsd_goes_back_to_the_peak(finished, extended):
    decay, wsd = rows(extended["decay"], 6), rows(extended["wsd"], 6)
    assert sorted(decay) == sorted(wsd) == [7, 8, 9, 10]
    # decay: the lr of step 7 (schedule at 6) is the lr the finished schedule had reached there: the floor
    assert all(math.isclose(decay[s]["lr"], FLOOR, rel_tol=1e-5) for s in decay)
    # wsd: the stable peak, then the last 0.2 x 10 steps decay linearly to the floor at step 10
    assert [round(wsd[s]["lr"] / PEAK, 5) for s in (7, 8, 9, 10)] == [1.0, 1.0, 1.0, round((1 + 0.1) / 2, 5)]
    for how, run in extended.items():
        cfg = load_config(str(Path(run) / "config.yaml"))
        assert (cfg.train.extend, cfg.optim.continue_as, cfg.optim.continue_from) == (how, how, 6)
        assert math.isclose(float(base_schedule(cfg)(10)), FLOOR, rel_tol=1e-5)
        history = [json.loads(line) for line in (Path(run) / "config_history.jsonl").read_text().splitlines()]
        assert history[-1]["changes"]["optim.continue_as"] == ["none", how]
    # only the lr differs: step 7's loss (parameters after 6 steps, the 7th batch) and the data cursor agree
    assert decay[7]["loss"] == wsd[7]["loss"]
    assert last_meta(extended["decay"])["data"] == last_meta(extended["wsd"])["data"]


def test_decay_from_mid_schedule_goes_on_from_the_current_lr(finished, tmp_path):
    run = tmp_path / "from3"
    rc, _, err = cli("--run-dir", run, *BASE, "train.steps=10", "train.extend=decay", "--checkpoint",
                     finished / "checkpoints" / "3")
    assert rc == 0, err[-2000:]
    old, new = rows(finished), rows(run)
    assert sorted(new) == list(range(4, 11))
    assert new[4]["lr"] == pytest.approx(old[4]["lr"], rel=1e-6)  # no jump: the rate step 4 had in the 6-step run
    assert old[4]["lr"] > 2 * FLOOR
    lrs = [new[s]["lr"] for s in sorted(new)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))  # then down, more slowly than the 6-step run went
    assert new[5]["lr"] > old[5]["lr"]
    cfg = load_config(str(run / "config.yaml"))
    assert math.isclose(float(base_schedule(cfg)(10)), FLOOR, rel_tol=1e-5)
    assert new[4]["loss"] == old[4]["loss"]  # the same parameters on the same 4th batch


def test_a_resume_carries_the_continuation_and_a_jumpless_change_needs_no_choice():
    cfg = load_config(None, [*BASE, "train.steps=10", "train.extend=decay"])
    chosen = continued(cfg, to_dict(load_config(None, BASE)), 3)
    assert (chosen.optim.continue_as, chosen.optim.continue_from) == ("decay", 3)
    assert chosen.optim.continue_lr == pytest.approx(float(base_schedule(load_config(None, BASE))(3)))
    # killed at step 8 of the extension: the same command without train.extend resumes on the same schedule
    again = continued(load_config(None, [*BASE, "train.steps=10"]), to_dict(chosen), 8)
    assert again.optim == chosen.optim
    # raised again later without a choice: the decay's end moves, so the rate would jump
    with pytest.raises(UserError, match="train.steps went from 10 to 20 on a run resuming at step 8"):
        continued(load_config(None, [*BASE, "train.steps=20"]), to_dict(chosen), 8)
    # a WSD run still in its stable phase: the longer run only moves the decay, no jump, nothing recorded
    wsd = [*BASE, "optim.schedule=wsd"]
    same = continued(load_config(None, [*wsd, "train.steps=20"]), to_dict(load_config(None, wsd)), 3)
    assert same.optim.continue_as == "none"


def test_a_changed_lr_scales_a_continuation_as_it_scales_the_schedule():
    """optim.lr changed on resuming an extended run: the continuation moves with it, as the rest of the schedule
    does, and Muon's group keeps its own peak (it had been divided by the new lr alone). A continuation recorded
    before optim.continue_peak existed keeps its rate as written."""
    from yxanul_jax.training.optim import lr_schedule

    chosen = continued(load_config(None, [*BASE, "train.steps=10", "train.extend=decay"]),
                       to_dict(load_config(None, BASE)), 3)
    assert chosen.optim.lr is None and chosen.optim.continue_peak == chosen.optim.peak_lr  # unset: Muon's own
    doubled = dataclasses.replace(chosen, optim=dataclasses.replace(chosen.optim, lr=2 * chosen.optim.peak_lr))
    for step in (3, 6, 10):
        assert float(base_schedule(doubled)(step)) == pytest.approx(2 * float(base_schedule(chosen)(step)), rel=1e-6)
    # Muon's rate (`make_optimizer`: the schedule times muon_lr / lr) is the same under either lr
    assert float(lr_schedule(doubled)(6)) / doubled.optim.peak_lr == pytest.approx(
        float(lr_schedule(chosen)(6)) / chosen.optim.peak_lr, rel=1e-6)
    legacy = dataclasses.replace(doubled, optim=dataclasses.replace(doubled.optim, continue_peak=0.0))
    assert float(base_schedule(legacy)(3)) == pytest.approx(chosen.optim.continue_lr, rel=1e-6)


def test_the_refusal_says_when_the_peak_rate_changed_too():
    """A run saved at another optim.lr (a Muon run of the old default 0.003, now 0.012): the jump named is at this
    command's rate, and the message says what the run trained at."""
    saved = to_dict(load_config(None, ["train.steps=100", "optim.lr=0.003"]))
    with pytest.raises(UserError, match=r"there \(rates at this command's optim.lr 0.012; the run trained at 0.003\)"):
        continued(load_config(None, ["train.steps=200"]), saved, 50)
    with pytest.raises(UserError, match=r"to [0-9.e-]+ there; choose how"):  # the same rate: nothing more said
        continued(load_config(None, ["train.steps=200", "optim.lr=0.003"]), saved, 50)


def test_a_typed_continuation_without_its_step_is_refused():
    with pytest.raises(UserError, match="'optim.continue_as' is 'decay' with no optim.continue_from.*set train.extend"):
        load_config(None, [*BASE, "optim.continue_as=decay"])
