"""Path safety (issue 27): names from configs and manifests are names, not paths; a prepared dataset's manifest
names only files inside its folder (symlinks resolved), so nothing outside the run directory, the cache and the
paths the user gave is read or written."""
import json
import os
import shutil

import pytest

from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.names import inside, safe_name
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.layout import TOKENIZER, manifest_path

from data_fixtures import docs, prepared, run_cli, tiny_tok  # noqa: F401 (fixtures)

NOT_NAMES = ["..", "../evil", "../../etc", "/abs", "a/b", ".", "", " ", "~", "~root", "a\\b"]


def test_safe_name_takes_names_and_refuses_paths():
    for good in ("tiny", "yxanul-197m", "llama3.2_1b", "web.en", "..x", "a..b"):
        assert safe_name("config key 'model.name'", good) == good
    for bad in NOT_NAMES:
        with pytest.raises(UserError, match="config key 'model.name' .* is not a name"):
            safe_name("config key 'model.name'", bad)


def test_model_name_and_domain_names_from_a_config_are_names(tmp_path):
    for bad in NOT_NAMES:
        with pytest.raises(UserError, match="'model.name'"):
            load_config(None, [f"model.name={bad!r}"])
        with pytest.raises(UserError, match="'eval.domains'"):
            load_config(None, [f"eval.domains={{{json.dumps(bad)}: x.parquet}}"])
    yaml = tmp_path / "c.yaml"
    yaml.write_text("model:\n  name: ../../outside\n")
    with pytest.raises(UserError, match="'model.name' '../../outside' is not a name"):
        load_config(str(yaml))


def test_train_with_a_path_as_model_name_writes_nothing(tmp_path, monkeypatch):
    """Before, `model.name=../../evil` trained into runs/../../evil: outside runs/."""
    from yxanul_jax.cli import main

    monkeypatch.chdir(tmp_path)
    for bad in ("../evil", "/tmp/evil-run", "a/b"):
        rc, out, err = run_cli(main, ["train", f"model.name={bad}"])
        assert rc == 2 and err.count("\n") == 1 and "'model.name'" in err and "is not a name" in err, err
    assert os.listdir(tmp_path) == [] and not os.path.exists(tmp_path.parent / "evil") \
        and not os.path.exists("/tmp/evil-run")


def _copy(prepared, tmp_path, name="ds"):
    ds = tmp_path / name
    shutil.copytree(prepared, ds)
    return ds


def _edit_manifest(ds, edit):
    m = json.loads(manifest_path(ds).read_text())
    edit(m)
    manifest_path(ds).write_text(json.dumps(m))


def test_a_manifest_names_only_files_inside_its_dataset(prepared, tmp_path):
    outside = tmp_path / "elsewhere.json"  # a real tokenizer file, but not the dataset's
    shutil.copyfile(prepared / TOKENIZER, outside)
    good = _copy(prepared, tmp_path, "good")
    assert open_dataset(good).tokenizer_path == str((good / TOKENIZER).resolve())
    cases = {
        "absolute": lambda m: m["tokenizer"].update(file=str(outside)),
        "dotdot": lambda m: m["tokenizer"].update(file="../elsewhere.json"),
        "shard": lambda m: m["splits"]["train"]["shards"][0].update(tokens="../good/train/00000.tokens.npy"),
        "offsets": lambda m: m["splits"]["val"]["shards"][0].update(offsets="/etc/hostname"),
    }
    for name, edit in cases.items():
        ds = _copy(prepared, tmp_path, name)
        _edit_manifest(ds, edit)
        with pytest.raises(UserError, match=r"outside its folder; .* prepare it again") as e:
            ds_obj = open_dataset(ds)
            ds_obj.split("train"), ds_obj.split("val")
        assert "\n" not in str(e.value) and str(ds) in str(e.value), name
    linked = _copy(prepared, tmp_path, "linked")  # the manifest's own name, but a symlink out of the folder
    (linked / TOKENIZER).unlink()
    (linked / TOKENIZER).symlink_to(outside)
    with pytest.raises(UserError, match="its tokenizer 'tokenizer.json', outside its folder"):
        open_dataset(linked)


def test_inside_resolves_symlinked_dataset_folders(tmp_path):
    real = tmp_path / "real"
    (real / "train").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real)  # a dataset reached through a symlinked folder is still itself
    assert inside(tmp_path / "alias", "train/x.npy", "a shard") == real / "train" / "x.npy"
    with pytest.raises(UserError):
        inside(tmp_path / "alias", "train/../../x", "a shard")


def test_train_on_a_manifest_pointing_outside_is_one_line_and_writes_nothing(prepared, tmp_path):
    """Before, the file the manifest named was copied into the run as its tokenizer.json."""
    from yxanul_jax.cli import main

    secret = tmp_path / "secret.json"
    shutil.copyfile(prepared / TOKENIZER, secret)  # a valid tokenizer: only where it lies is wrong
    ds = _copy(prepared, tmp_path)
    _edit_manifest(ds, lambda m: m["tokenizer"].update(file=str(secret)))
    run = tmp_path / "run"
    rc, _, err = run_cli(main, ["train", "--run-dir", run, f"data.train={ds}", "model.vocab_size=384",
                                "train.steps=1", "train.sample_tokens=0"])
    assert rc == 2 and err.count("\n") == 1 and "outside its folder" in err, err
    assert not run.exists()
