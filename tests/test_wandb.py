"""`monitor.wandb`: the scalars TensorBoard gets also go to a Weights & Biases run (offline here: no network),
a resumed run continues the same W&B run, a start refused before its first step leaves no empty run (the next start
takes it on), and a missing wandb package is one line before anything is written."""
import glob
import json
import os
import struct
import sys

import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.training.loop import fit
from yxanul_jax.training.monitor import WANDB_ID_FILE

from conftest import TRAINED_RUN, stop_after
from data_fixtures import run_cli

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="wandb is the optional extra [wandb]")

WANDB = [*TRAINED_RUN, "train.steps=6", "train.log_every=1", "monitor.wandb=true", "monitor.wandb_project=yx-test",
         "monitor.wandb_name=tiny-run"]


def wandb_records(path: str) -> list:
    """The records of an offline run's `run-<id>.wandb` file, parsed with wandb's own protobuf schema: a
    7-byte header (":W&B", magic, version), then LevelDB log records in 32 KiB blocks (crc32c, length,
    type: 1 full, 2 first, 3 middle, 4 last; a block's tail shorter than a record header is padding)."""
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B", path
    pos, buf, out, block = 7, b"", [], 32 * 1024
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:
            pos += left
            continue
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = payload if kind in (1, 2) else buf + payload
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def offline_runs(run_dir) -> list[tuple[str, str, dict[int, dict]]]:
    """(run id, display name, {step: logged scalars}) of each offline W&B run under `run_dir/wandb`, oldest first."""
    runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        records = wandb_records(path)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        history = {}
        for r in records:
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.setdefault(r.history.step.num, {}).update(
                    {k: v for k, v in items.items() if not k.startswith("_")})  # W&B's own _step, _runtime
        runs.append((run.run_id, run.display_name, history))
    return runs


def jsonl_scalars(run_dir) -> dict[int, dict]:
    """{step: every numeric value of metrics.jsonl's rows of that step} (what TensorBoard gets)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        for row in map(json.loads, fh):
            out.setdefault(row["step"], {}).update(
                {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline, its settings and caches inside tmp_path, quiet, no network."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_MODE", "offline")  # monitor.wandb_mode=auto takes it
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / key.lower()))


@pytest.mark.slow
def test_offline_run_logs_what_tensorboard_gets_a_resume_continues_it_and_overwrite_starts_anew(offline, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(None, WANDB)
    first = fit(cfg, str(run_dir), hooks=[stop_after(3)])
    assert first.interrupted and first.step == 3
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert fit(cfg, str(run_dir)).step == 6  # resumes from the checkpoint of step 3
    runs = offline_runs(run_dir)
    assert [(i, name) for i, name, _ in runs] == [(run_id, "tiny-run")] * 2  # the same W&B run, continued
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == run_id
    expected = jsonl_scalars(run_dir)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6] and "val/mean/loss" in expected[6] and "fp8_saturation" in expected[2]
    assert sorted(runs[0][2]) == [1, 2, 3] and sorted(runs[1][2]) == [4, 5, 6]
    logged = {**runs[0][2], **runs[1][2]}
    for step, values in expected.items():
        assert logged[step] == pytest.approx(values, rel=1e-6), step
    # --overwrite starts over from step 0: a new run in TensorBoard (its files moved aside) and in W&B
    fit(cfg, str(run_dir), overwrite=True, hooks=[stop_after(1)])
    new_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert new_id != run_id and [i for i, _, _ in offline_runs(run_dir)] == [run_id, run_id, new_id]


def test_without_wandb_installed_one_line_and_nothing_written(monkeypatch, tmp_path):
    from yxanul_jax.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without the extra imports
    run_dir = tmp_path / "run"
    rc, out, err = run_cli(main, ["train", "--run-dir", str(run_dir), *WANDB])
    assert rc == 2 and err == ('error: monitor.wandb=true needs the wandb package, which is not installed; pip '
                               'install -e ".[wandb]" (or pip install wandb), or set monitor.wandb=false\n'), err
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_start_refused_before_its_first_step_leaves_its_wb_run_to_the_next_start(offline, tmp_path):
    from yxanul_jax.core.errors import UserError
    from yxanul_jax.training.hooks import Hook

    class Refuse(Hook):  # what any refusal between the W&B start and the first step does (a compile, a batch)
        def on_start(self, loop, state, step):
            raise UserError("refused before the first step")

    run_dir, cfg = tmp_path / "run", load_config(None, WANDB)
    with pytest.raises(UserError, match="refused before the first step"):
        fit(cfg, str(run_dir), hooks=[Refuse()])
    run_id, mark = (run_dir / WANDB_ID_FILE).read_text().splitlines()
    assert mark == "no steps logged" and [(i, steps) for i, _, steps in offline_runs(run_dir)] == [(run_id, {})]
    fit(cfg, str(run_dir), hooks=[stop_after(2)])  # the next start (from step 0) logs to that same W&B run
    assert (run_dir / WANDB_ID_FILE).read_text() == run_id + "\n"
    runs = offline_runs(run_dir)
    assert [i for i, _, _ in runs] == [run_id, run_id] and sorted(runs[1][2]) == [1, 2]


@pytest.mark.slow
def test_an_id_wandb_refuses_gives_way_to_a_new_run_at_step_0_and_is_one_line_on_a_resume(offline, tmp_path):
    # A W&B run id the library refuses ("/" is not allowed in one: wandb raises UsageError, offline too), standing
    # for any id W&B will not take again (a run deleted in its UI): left unused by a start that logged nothing, the
    # next start at step 0 tries it, then goes on in a new W&B run
    from yxanul_jax.core.errors import UserError

    run_dir, cfg = tmp_path / "run", load_config(None, WANDB)
    run_dir.mkdir()
    (run_dir / WANDB_ID_FILE).write_text("not/an-id\nno steps logged\n")
    fit(cfg, str(run_dir), hooks=[stop_after(2)])
    new_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert new_id != "not/an-id" and [(i, sorted(s)) for i, _, s in offline_runs(run_dir)] == [(new_id, [1, 2])]
    # a resume has only its own run to continue: W&B's refusal is one line naming the ways on, the id file's removal
    # among them; that removal gives the rest of the run a new W&B run
    (run_dir / WANDB_ID_FILE).write_text("not/an-id\n")
    with pytest.raises(UserError) as e:
        fit(cfg, str(run_dir), hooks=[stop_after(3)])
    assert str(e.value).startswith("Weights & Biases did not start (UsageError: Run ID cannot contain") and \
        str(e.value).endswith(f"remove {run_dir / WANDB_ID_FILE} to go on in a new W&B run") and \
        "\n" not in str(e.value), str(e.value)
    assert [i for i, _, _ in offline_runs(run_dir)] == [new_id]
    (run_dir / WANDB_ID_FILE).unlink()
    assert fit(cfg, str(run_dir), hooks=[stop_after(3)]).step == 3  # resumed from step 2
    third = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert [(i, sorted(s)) for i, _, s in offline_runs(run_dir)][1:] == [(third, [3])] and third != new_id
