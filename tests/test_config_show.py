"""`python -m yxanul_jax.config show` (and `yxanul config show`): every key of the schema with its type,
default, current value and doc, as text and as JSON; bad keys are the usual one-line errors."""
import dataclasses
import json
import typing

from yxanul_jax.cli import main as yxanul
from yxanul_jax.config import main
from yxanul_jax.core.coerce import field_docs, to_dict
from yxanul_jax.core.config import Config, ModelConfig, StageConfig, load_config

from conftest import REPO
from data_fixtures import run_cli

THREE_STAGES = "curriculum=[{start_step: 0}, {start_step: 5, seq_len: 32}, {start_step: 9, batch_size: 4}]"


def show(*args) -> list[dict]:
    rc, out, err = run_cli(main, ["show", "--json", *args])
    assert rc == 0 and err == "", err
    assert len(out.splitlines()) == 1  # one JSON document, one line
    return json.loads(out)


def _schema_keys(cls, prefix=""):
    """The settable keys of a dataclass walked here independently of the command (lists of stages: none)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _schema_keys(hints[f.name], f"{prefix}{f.name}.")
        elif f.name != "curriculum":
            yield f"{prefix}{f.name}"


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[int(part)] if isinstance(cfg, tuple) else getattr(cfg, part)
    return cfg


def test_every_key_of_the_schema_with_its_type_default_value_and_doc():
    rows = show("model.d_model=256", "fp8.targets=[q,k]", "eval.domains.web=/data/web")
    by_key = {r["key"]: r for r in rows}
    assert [r["key"] for r in rows if not r["key"].startswith("curriculum")] == list(_schema_keys(Config))
    assert all(set(r) == {"key", "type", "default", "value", "overridden", "doc"} and r["doc"] for r in rows)
    assert by_key["model.d_model"] == {"key": "model.d_model", "type": "int", "default": 128, "value": 256,
                                       "overridden": True, "doc": "Width of the residual stream."}
    assert by_key["fp8.targets"]["type"] == "list[str]" and by_key["fp8.targets"]["value"] == ["q", "k"]
    assert by_key["eval.domains"]["value"] == {"web": "/data/web"} and by_key["eval.domains"]["default"] == {}
    assert by_key["model.head"]["type"] == "'tied' | 'factorized' | 'untied'"
    # the docs are the schema's own field docstrings (multi-line ones joined into one line)
    assert by_key["model.embed_rank"]["doc"] == " ".join(field_docs(ModelConfig)["embed_rank"].split())
    assert by_key["model.embed_rank"]["doc"].startswith("Rank r of the factorized input embedding")
    assert sorted(r["key"] for r in rows if r["overridden"]) == ["eval.domains", "fp8.targets", "model.d_model"]
    cfg = load_config(None, ["model.d_model=256", "fp8.targets=[q,k]", "eval.domains.web=/data/web"])
    for r in rows:  # every value is the config's own
        assert r["value"] == to_dict(_get(cfg, r["key"])), r["key"]


def test_a_config_file_and_a_longer_curriculum():
    rows = show("--config", str(REPO / "configs" / "yxanul_197m.yaml"), THREE_STAGES)
    by_key = {r["key"]: r for r in rows}
    assert by_key["model.vocab_size"]["value"] == 200005 and by_key["model.vocab_size"]["overridden"]
    # the list itself: its stages in full, then each stage's keys against the default curriculum's stage
    # of that index, past its end against a default stage
    stages = by_key["curriculum"]
    assert stages["type"] == "list[StageConfig]" and len(stages["value"]) == 3 and len(stages["default"]) == 2
    assert stages["overridden"] and "curriculum.N.KEY" in stages["doc"]
    n_fields = len(dataclasses.fields(StageConfig))
    assert len([r for r in rows if r["key"].startswith("curriculum.")]) == 3 * n_fields
    assert by_key["curriculum.1.seq_len"] == {**by_key["curriculum.1.seq_len"], "default": 128, "value": 32,
                                              "overridden": True}
    assert by_key["curriculum.2.batch_size"]["default"] == StageConfig().batch_size
    assert by_key["curriculum.2.batch_size"]["value"] == 4 and by_key["curriculum.2.start_step"]["overridden"]


def test_the_text_listing_through_the_yxanul_command():
    rc, out, err = run_cli(yxanul, ["config", "show", "model.d_model=256", "train.steps=5"])
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"{len(show())} config keys, 2 overridden")
    i = lines.index("model.d_model: int = 256  (overridden; default 128)")
    assert lines[i + 1] == "    Width of the residual stream."
    assert 'train.sample_prompt: str = "def "  (default)' in lines  # quoted: the space is part of it
    assert "model.name: str = tiny  (default)" in lines and "# model: Architecture of the decoder-only transformer." in lines
    assert "curriculum: list[StageConfig] = 2 stages  (default)" in lines
    assert all(len(line) <= 104 for line in lines if line.startswith("    "))  # docs wrapped under their key


def test_mistakes_are_one_line_errors():
    for argv, message in (
            (["show", "model.d_modle=3"], "error: unknown config key 'model.d_modle' (did you mean 'model.d_model'?)"),
            (["show", "model.d_model=wide"], "error: config key 'model.d_model' must be an integer, got 'wide'"),
            (["show", "--config", "nope.yaml"], "error: config file 'nope.yaml' does not exist"),
            ([], "error: say what to do: python -m yxanul_jax.config show"),
            (["list"], "error: argument action: invalid choice: 'list'")):
        rc, out, err = run_cli(main, argv)
        assert rc == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(message), (argv, err)


def test_field_docs_reads_the_string_under_each_field():
    @dataclasses.dataclass(frozen=True)
    class Section:
        documented: int = 1
        """First line,
        second line."""
        bare: str = ""
        after: bool = False
        """Its own doc, not bare's."""

    assert field_docs(Section) == {"documented": "First line, second line.", "after": "Its own doc, not bare's."}
