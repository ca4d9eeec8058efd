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
