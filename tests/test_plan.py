"""The plan command: table, --json line, console-script dispatch."""
import json

from yxanul_jax import cli, plan

from conftest import REPO


def test_plan_json_last_line(capsys):
    assert plan.main(["--config", str(REPO / "configs/yxanul_197m.yaml"), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    data = json.loads(out[-1])
    assert isinstance(data["params_total"], int) and data["params_total"] == 196_398_464
    assert sum(data["params_by_component"].values()) == data["params_total"]
    assert len(data["stages"]) == 10 and data["stages"][0]["seq_len"] == 8
    assert any("embedding" in line for line in out[:-1])  # the human table comes first


def test_console_script_dispatch(capsys):
    assert cli.main(["plan", "model.n_layers=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["params_total"] > 0
    assert cli.main(["plna"]) == 2
    assert "did you mean 'plan'" in capsys.readouterr().err


def test_an_absurd_depth_is_planned_at_once_and_says_why_nothing_fits(capsys):
    # the parameters are counted from a scanned trace (one layer's time): 10^8 unscanned layers once took minutes
    assert plan.main(["--config", str(REPO / "configs/tiny.yaml"), "model.n_layers=100000000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384 + 2 * 128  # tiny: q, o; k, v (2 of 4 heads); the MLP; 2 gains
    assert data["params_by_component"]["mlp"] == 10**8 * 3 * 128 * 384 and not data["fits"]
    assert data["params_total"] == 10**8 * layer + data["params_by_component"]["embedding"] + 128
    # the reason names the depth, not the vocabulary (a 512-row table is no problem)
    assert not data["suggestion"]["fits"] and "set a much smaller model.n_layers" in data["suggestion"]["changes"][-1]
    # a vocabulary a narrower model could hold, with the depth the problem: the reason still names the depth
    assert plan.main(["--config", str(REPO / "configs/tiny.yaml"), "model.vocab_size=12000000",
                      "model.n_layers=100000000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "set a much smaller model.n_layers" in data["suggestion"]["changes"][-1]
    # a vocabulary whose matrices alone outgrow the GPU: the reason names the tokenizer
    assert plan.main(["--config", str(REPO / "configs/tiny.yaml"), "model.vocab_size=2000000000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "use a smaller tokenizer" in data["suggestion"]["changes"][-1]


def test_the_table_names_the_optimizer_and_offers_no_config_that_does_not_fit(capsys):
    assert plan.main(["--config", str(REPO / "configs/tiny.yaml"), "optim.name=muon"]) == 0
    assert "Muon's momentum for the blocks' matrices, AdamW mu and nu for the rest" in capsys.readouterr().out
    # nothing fits: the nearest change tried is said, and no YAML is offered to train with
    assert plan.main(["--config", str(REPO / "configs/yxanul_197m.yaml"), "--headroom", "0.99"]) == 0
    out = capsys.readouterr().out
    assert "neither does the nearest change tried" in out and "train with --config FILE" not in out and "---" not in out
