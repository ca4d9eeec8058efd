"""Config system: defaults, sparse YAML, dotted overrides, and one-line errors with exit code 2."""
import contextlib
import dataclasses
import re
import subprocess
import sys

import pytest
import yaml

from yxanul_jax import plan
from yxanul_jax.core.coerce import apply_overrides, from_dict, to_dict, to_yaml
from yxanul_jax.core.config import Config, load_config, resumable, validate
from yxanul_jax.core.errors import UserError

from conftest import REPO


def test_defaults_validate_and_roundtrip():
    cfg = validate(Config())
    again = from_dict(Config, to_dict(cfg))
    assert again == cfg
    assert from_dict(Config, yaml.safe_load(to_yaml(cfg))) == cfg


def test_yaml_overrides_sparsely(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 64\n  n_heads: 2\n  n_kv_heads: 1\n")
    cfg = load_config(str(path))
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.n_kv_heads) == (64, 2, 1)
    assert cfg.model.n_layers == Config().model.n_layers  # untouched fields keep their defaults
    assert cfg.fp8 == Config().fp8


def test_dotted_overrides_types_and_lists():
    cfg = apply_overrides(Config(), ["model.d_model=256", "optim.lr=1e-3", "fp8.enabled=false",
                                     "fp8.targets=[q,k]", "curriculum.1.batch_size=4", "eval.domains.code=/x"])
    assert cfg.model.d_model == 256 and isinstance(cfg.model.d_model, int)
    assert cfg.optim.lr == 1e-3 and cfg.fp8.enabled is False
    assert cfg.fp8.targets == ("q", "k")
    assert cfg.curriculum[1].batch_size == 4 and cfg.curriculum[0].batch_size == Config().curriculum[0].batch_size
    assert cfg.eval.domains == {"code": "/x"}
    assert apply_overrides(Config(), ["optim.lr=1"]).optim.lr == 1.0  # int accepted for float
    xla = apply_overrides(Config(), ["train.xla_options.xla_gpu_enable_triton_gemm=false",
                                     "train.xla_options.xla_gpu_autotune_level=0"]).train.xla_options
    assert xla == {"xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0}  # typed, for .compile()
    padded = apply_overrides(Config(), ["model.vocab_size=200005", "model.vocab_pad_to=128"]).model
    assert padded.padded_vocab == 200064 and padded.vocab_padding_params == 59 * (padded.embed_rank or padded.d_model)


@pytest.mark.parametrize("override, needle", [
    ("model.d_modle=3", "model.d_modle' (did you mean 'model.d_model'"),
    ("modle.d_model=3", "did you mean 'model'"),
    ("model.d_model=wide", "model.d_model' must be an integer"),
    ("fp8.enabled=maybe", "fp8.enabled' must be true or false"),
    ("model.head=shared", "model.head' must be one of"),
    ("model.n_kv_heads=3", "model.n_kv_heads"),
    ("curriculum.5.seq_len=8", "index 5 out of range"),
    ("curriculum.1.start_step=0", "curriculum.1.start_step"),
    ("curriculum.0.seq_len=99999", "curriculum.0.seq_len"),
    ("fp8.targets=[q,kk]", "fp8.targets.1"),
    ("optim.lr=-1", "optim.lr"),
    ("optim.lr=none", "'optim.lr' must be a number, got 'none'; or null to leave it unset"),
    ("model.vocab_pad_to=0", "model.vocab_pad_to"),
    ("eval.seq_len=99999", "eval.seq_len"),
    ("fp8.scaling=later", "fp8.scaling' must be one of"),
    ("fp8.te_layers=true", "set fp8.backend=te or fp8.te_layers=false"),
    ("model.d_model", "key.sub=value"),
    ("data.train={a: /data/a, b /data/b.v2}", "config key 'data.train.b /data/b.v2' has no value: YAML read "
                                              "'b /data/b.v2' as one key; write 'b: /data/b.v2'"),  # a ':' left out
])
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_te_fused_layers_need_every_fused_projection_in_fp8():
    cfg = load_config(None, ["fp8.backend=te", "fp8.te_layers=true"])
    assert cfg.fp8.fused and not dataclasses.replace(cfg.fp8, enabled=False).fused
    with pytest.raises(UserError, match="fp8.targets lacks k,up; add them or set fp8.te_layers=false"):
        load_config(None, ["fp8.backend=te", "fp8.te_layers=true", "fp8.targets=[q,v,o,gate,down]"])


def test_scan_unroll_is_at_least_one_layer():
    assert not load_config(None, ["model.scan_layers=true", "model.scan_unroll=4"]).model.layer_loop  # 4 layers
    with pytest.raises(UserError, match=r"'model.scan_unroll' must be >= 1 \(1: a loop over the layers, n_layers: no"):
        load_config(None, ["model.scan_unroll=0"])
    # a loop with leftover layers (4 of 6) would run them outside it, without remat's CSE barrier
    with pytest.raises(UserError, match=r"'model.scan_unroll' \(4\) must divide model.n_layers \(6\) or be at least"):
        load_config(None, ["model.scan_layers=true", "model.n_layers=6", "model.scan_unroll=4"])
    assert load_config(None, ["model.scan_layers=true", "model.n_layers=6", "model.scan_unroll=3"]).model.layer_loop


def test_unknown_yaml_key_and_bad_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 3\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(bad))}: unknown config key 'model.n_layer' \(did you mean "
                                        r"'model.n_layers'"):  # which file, when a config is built from several
        load_config(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(str(broken))
    with pytest.raises(UserError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="is a directory; pass a YAML file in it"):
        load_config(str(tmp_path))



# What a resumed run may change (it changes neither the model nor the data stream): whole sections end in "."
RESUMABLE = ("train.steps", "train.log_every", "train.sample_prompt", "train.sample_tokens", "train.xla_options",
             "train.loss_kernel",  # the same sums by another kernel (tests/test_fused_ce.py)
             "train.fused_ce_tiles",  # the same sums in other blocks (tests/test_fused_ce.py, MIXED_TILES)
             "train.micro_split",  # the same sums in smaller micro-batches (tests/test_steps.py)
             "train.loss_chunk",  # the same sums and FP8 state in other chunks (tests/test_steps.py)
             "model.scan_unroll",  # the same stacked parameters and gradients (tests/test_model.py)
             "model.remat", "model.attention",  # memory against time, another attention kernel: the same function
             "eval.", "checkpoint.interval", "checkpoint.max_to_keep", "checkpoint.async_save", "profile.",
             "optim.lr", "optim.muon_lr", "data.num_workers", "data.prefetch", "monitor.",
             "optim.muon_ns_dtype",  # the same state, the iterations rounded otherwise (tests/test_muon.py)
             "train.extend", "optim.continue_",  # how a changed train.steps goes on (tests/test_schedule_extend.py)
             # how the FP8 GEMMs are written and the weight gradient's precision: no state, no stream changes
             "fp8.gemm_form", "fp8.wgrad",
             # how the process group forms (a resumed job gets a new port, another launcher): not the data or model
             "mesh.coordinator_address", "mesh.process_id", "mesh.cluster", "mesh.heartbeat_timeout_s",
             "mesh.init_timeout_s",
             # the mesh and the process count: the checkpoint is read resharded, the stream keeps its global
             # batches (tests/test_sharding.py resumes two processes as one on another mesh)
             "mesh.data", "mesh.fsdp", "mesh.num_processes",
             "init.")  # read at a fresh start only (tests/test_init_from_checkpoint.py: a resume with the source gone)


def _field_keys(cls, prefix=""):
    """Every dotted key of a dataclass's fields, sections included."""
    import typing

    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        yield key
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _field_keys(tp, key + ".")


def test_the_fields_say_which_keys_a_resume_may_change():
    marked = {k for k in _field_keys(Config) if resumable(k)}
    listed = {k for k in _field_keys(Config) if any(k == r or k.startswith(r) for r in RESUMABLE)}
    assert marked == listed | {"eval", "profile", "monitor", "init"}
    for key in ("train.steps", "eval.interval", "eval.domains.web", "profile.start_step", "optim.lr",
                "train.xla_options.xla_gpu_autotune_level", "checkpoint.async_save", "data.prefetch"):
        assert resumable(key), key
    for key in ("model.d_model", "optim.b1", "curriculum.0.seq_len", "curriculum", "train.seed", "train",
                "data.lanes", "checkpoint.keep_best", "train.stepz", "eval.bogus", "nope", ""):
        assert not resumable(key), key


def test_a_run_dir_with_checkpoints_takes_resumable_changes_and_refuses_the_rest(tmp_path):
    from yxanul_jax.core.rundir import prepare_run_dir

    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), load_config())
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    taken = ["profile.start_step=5", "eval.domains.web=/w", "data.num_workers=2", "checkpoint.max_to_keep=9",
             "train.sample_tokens=0", "train.xla_options.xla_gpu_autotune_level=0"]
    prepare_run_dir(str(run_dir), load_config(None, taken))
    assert from_dict(Config, yaml.safe_load((run_dir / "config.yaml").read_text())) == load_config(None, taken)
    for refused in ("train.seed=1", "optim.b1=0.8", "curriculum.0.seq_len=32", "data.shuffle_seed=3"):
        key = refused.partition("=")[0]
        with pytest.raises(UserError, match=f"holds a run whose '{re.escape(key)}' is"):
            prepare_run_dir(str(run_dir), load_config(None, taken + [refused]))

def test_a_run_saved_before_a_key_existed_resumes_with_its_default(tmp_path):
    # A run directory written by an older version lacks the keys added since (e.g. model.fuse_projections,
    # train.loss_kernel): they read as their defaults, not as a change of the model.
    from yxanul_jax.core.rundir import prepare_run_dir

    run_dir = tmp_path / "run"
    prepare_run_dir(str(run_dir), load_config())
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    del saved["model"]["fuse_projections"], saved["train"]["loss_kernel"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    prepare_run_dir(str(run_dir), load_config())  # resumes
    with pytest.raises(UserError, match="holds a run whose 'model.fuse_projections' is False, not True"):
        prepare_run_dir(str(run_dir), load_config(None, ["model.fuse_projections=true"]))


def test_a_resume_compares_optim_lr_by_the_rate_it_trains_at(tmp_path, capsys, monkeypatch):
    """optim.lr left unset is the optimizer's own rate: a run saved with that number written out resumes unchanged,
    and a Muon run saved at 0.003 (the default before 2026-11-29) is told that its AdamW group now steps at 0.012."""
    from yxanul_jax.core.rundir import prepare_run_dir

    kept = "optim.lr 0.003 -> 0.012 (recorded in config_history.jsonl); to keep the saved values, pass them: optim.lr=0.003"
    for written, said in ((0.012, None), (0.003, kept)):
        run_dir = tmp_path / str(written)
        prepare_run_dir(str(run_dir), load_config())
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["optim"]["lr"] is None
        saved["optim"]["lr"] = written
        (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
        (run_dir / "checkpoints" / "10").mkdir(parents=True)
        capsys.readouterr()
        prepare_run_dir(str(run_dir), load_config())
        err = capsys.readouterr().err
        assert (said in err) if said else "differ from the run's config.yaml" not in err, err
    # fit records the rate (OptimConfig.with_rate), so a later change of the default is said on resume too
    from yxanul_jax.core import config as config_module

    run_dir = tmp_path / "recorded"
    cfg = load_config()
    prepare_run_dir(str(run_dir), dataclasses.replace(cfg, optim=cfg.optim.with_rate()))
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["optim"]["lr"] == 0.012
    (run_dir / "checkpoints" / "10").mkdir(parents=True)
    monkeypatch.setitem(config_module.DEFAULT_LR, "muon", 0.02)
    capsys.readouterr()
    prepare_run_dir(str(run_dir), load_config())
    assert "optim.lr 0.012 -> 0.02" in capsys.readouterr().err


def test_the_resume_note_names_each_saved_value_one_override_gives_back():
    from yxanul_jax.core.rundir import ABSENT, changes_note

    note = changes_note([("optim.lr", 0.012, 0.05), ("optim.continue_as", "none", "decay"), ("optim.muon_lr", 0.01, 0.5),
                         ("eval.domains.code", ABSENT, "/d"), ("eval.seq_len", None, 64), ("fp8.targets", ["q"], ["k"]),
                         ("train.sample_prompt", "yes", "no")])
    # every key a user set, in their order, the trainer's own writes left out; none a single override cannot restore
    assert note.endswith("; to keep the saved values, pass them: optim.lr=0.012 optim.muon_lr=0.01 eval.seq_len=null "
                         "\"train.sample_prompt='yes'\""), note


@pytest.mark.parametrize("args, needle", [
    (["model.d_modle=3"], "model.d_modle"),               # unknown key
    (["model.n_layers=two"], "model.n_layers"),           # wrong type
    (["model.n_kv_heads=3"], "model.n_kv_heads"),         # bad value (3 does not divide 4 heads)
])
def test_cli_exits_2_with_one_line(args, needle):
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.plan", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr


def test_plan_main_returns_2_in_process(capsys):
    assert plan.main(["model.d_model=abc"]) == 2
    assert "model.d_model" in capsys.readouterr().err


def test_os_errors_and_ctrl_c_are_one_line_with_their_exit_codes(capsys):
    from yxanul_jax.core.args import cli_entry
    from yxanul_jax.core.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR

    @cli_entry
    def full(argv=None):
        raise OSError(28, "No space left on device", "/out/model.safetensors")

    @cli_entry
    def stopped(argv=None):
        raise KeyboardInterrupt

    assert full([]) == EXIT_USER_ERROR and stopped([]) == EXIT_INTERRUPTED  # argv given: a caller, not the command
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 2 and err[0].startswith("error: No space left on device '/out/model.safetensors'")
    assert err[1].startswith("error: interrupted (Ctrl-C)")


def test_a_command_stopped_by_ctrl_c_exits_130_without_waiting_on_its_threads():
    # a Ctrl-C during a checkpoint restore left native threads running, and the interpreter's teardown under them
    # crashed (exit 139 after the error line) or printed tracebacks: the command ends at once after its line. Here
    # a thread that would hold the teardown for a minute stands for them.
    # Both ways in: `python -m yxanul_jax.X` (its main()) and the `yxanul X` script (cli.main() passes the arguments on)
    for call in ("main()", "cli.main()"):
        code = ("import threading, time, sys\n"
                "from yxanul_jax import analyze, cli\n"
                "from yxanul_jax.core.args import cli_entry\n"
                "threading.Thread(target=time.sleep, args=(60,)).start()\n"
                "@cli_entry\n"
                "def main(argv=None):\n"
                "    print('started', flush=True)\n"
                "    raise KeyboardInterrupt\n"
                "analyze.main = main\n"
                "sys.argv = ['yxanul', 'analyze']\n"
                f"sys.exit({call})\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=30)
        assert proc.returncode == 130 and proc.stdout == "started\n", (call, proc.stderr)
        assert proc.stderr.startswith("error: interrupted (Ctrl-C)") and proc.stderr.count("\n") == 1, proc.stderr


_GC_CALLBACK = ("def callback(phase, info):\n"
                "    if phase == 'start' and not fired:\n"
                "        fired.append(1)\n"
                "        os.kill(os.getpid(), signal.SIGINT)\n"
                "        for _ in range(10000): pass  # the signal is taken here, inside the callback\n"
                "def trigger():\n"
                "    gc.callbacks.append(callback)\n"
                "    gc.collect()\n")
_WAITING_DEL = ("class Held:\n"
                "    def __del__(self):\n"
                "        os.kill(os.getpid(), signal.SIGINT)\n"
                "        time.sleep(30)  # a finalizer that waits: the Ctrl-C still breaks the wait\n"
                "def trigger():\n"
                "    Held()\n")


@pytest.mark.parametrize("where", [_GC_CALLBACK, _WAITING_DEL], ids=["gc-callback", "waiting-del"])
def test_a_ctrl_c_that_python_could_only_print_still_stops_the_command(where):
    # JAX runs `_xla_gc_callback` on every collection; a SIGINT inside it (or in a `__del__`) was printed as
    # "Exception ignored in ..." and swallowed, and the command went on to finish and exit 0. Here a callback and a
    # finalizer of our own take the signal at the same place, as JAX's would.
    code = ("import gc, os, signal, sys, time\n"
            "from yxanul_jax.core.args import cli_entry\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: xdist's workers ignore it\n"
            "fired = []\n"
            f"{where}"
            "@cli_entry\n"
            "def main(argv=None):\n"
            "    trigger()\n"
            "    print('triggered', flush=True)\n"
            "    time.sleep(20)\n"
            "    print('finished', flush=True)\n"
            "    return 0\n"
            "sys.exit(main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 130 and "finished" not in proc.stdout, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: interrupted (Ctrl-C)") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("command, argv, needle", [
    ("train", ["--steps", "5"], "unrecognized arguments: --steps; config keys are set as key=value, without dashes: "
                                "train.steps=VALUE"),
    ("train", ["--optim.lr=0.01"], "config keys are set as key=value, without dashes: optim.lr=0.01;"),
    ("train", ["--train.sample-prompt=a", "b"], "without dashes: train.sample_prompt=a;"),
    ("export", ["--run-dir", "runs/x"], "the following arguments are required: --output"),
    ("export", ["--run-dir", "runs/x", "--output", "o", "--dtype", "float16"], "invalid choice: 'float16'"),
    ("generate", ["--run-dir", "runs/x", "--max-new-tokens", "abc"], "invalid int value: 'abc'"),
    ("tokenizer", ["train", "--vocab-size", "x"], "invalid int value: 'x'"),
])
def test_a_malformed_command_line_is_one_error_line_not_a_usage_block(command, argv, needle):
    import importlib

    from data_fixtures import run_cli

    rc, out, err = run_cli(importlib.import_module(f"yxanul_jax.{command}").main, argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert lines[0].endswith("--help") and not out.strip()


def test_a_config_key_given_as_a_flag_with_a_space_in_its_value_is_hinted_whole():
    """argparse takes `--key=a b` for an override (it has a space), argparse's own message joins the unknown
    arguments with spaces: either way the hint shows the whole value, quoted for the shell."""
    from data_fixtures import run_cli
    from yxanul_jax import train

    rc, _, err = run_cli(train.main, ["--train.sample-prompt=Once upon"])
    assert rc == 2 and err == ("error: override '--train.sample-prompt=Once upon' starts with a dash; config keys are set "
                               "as key=value, without dashes: 'train.sample_prompt=Once upon'\n"), err
    rc, _, err = run_cli(train.main, ["--optim.lr=0.01", "--train.sample-prompt=x"])
    assert rc == 2 and "unrecognized arguments: --optim.lr=0.01 --train.sample-prompt=x; config keys are set as " \
                       "key=value, without dashes: optim.lr=0.01;" in err, err


def test_every_path_flag_expands_a_tilde_after_an_equals_sign(monkeypatch, tmp_path):
    # bash expands `--run-dir ~/x` but leaves `--run-dir=~/x` as it is: the flag's type expands it, so the path a
    # command checks and the one it writes are the same (a folder called `~` in the working directory was made)
    import argparse

    from yxanul_jax.core.args import ArgumentParser, user_path
    from yxanul_jax.inference.trained import add_source_args
    from yxanul_jax.train import parse_args

    monkeypatch.setenv("HOME", str(tmp_path))
    args = parse_args(["--run-dir=~/r", "--checkpoint=~/c", "--config=~/c.yaml"])
    assert (args.run_dir, args.checkpoint, args.config) == (f"{tmp_path}/r", f"{tmp_path}/c", f"{tmp_path}/c.yaml")
    p = ArgumentParser()
    add_source_args(p)
    assert p.parse_args(["--run-dir=~/r"]).run_dir == f"{tmp_path}/r"
    with pytest.raises(UserError, match=r"'~nosuchuser_yx/r': there is no user 'nosuchuser_yx' whose home "):
        p.parse_args(["--run-dir=~nosuchuser_yx/r"])  # pathlib's expanduser raised RuntimeError deep in a command
    # every command's flag that names a file or folder has that type (read from the parsers the commands build)
    import importlib

    seen = {}
    real_add = argparse._ActionsContainer.add_argument

    def add(self, *names, **kw):
        seen.setdefault(kw.get("type"), []).extend(n for n in names if n.startswith("--") or not n.startswith("-"))
        return real_add(self, *names, **kw)

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", add)
    for command in ("analyze", "evaluate", "export", "generate", "plot", "prepare", "tokenizer", "train"):
        with contextlib.suppress(SystemExit, Exception):
            importlib.import_module(f"yxanul_jax.{command}").main(["--help"])
    paths = {"--config", "--run-dir", "--checkpoint", "--output", "--hlo-out", "--compare-config", "--include-path",
             "--heldout", "--prompt-file", "--tokenizer", "--input", "--hf-dataset", "--target", "run_dirs"}
    untyped = paths & set(seen.get(None, []))
    assert not untyped and paths <= set(seen[user_path]), untyped


def test_an_empty_flag_value_is_refused_and_only_an_optional_flag_may_be_left_out():
    from data_fixtures import run_cli
    from yxanul_jax import export, generate

    rc, _, err = run_cli(export.main, ["--run-dir", "runs/x", "--output", ""])  # required: giving it is the fix
    assert rc == 2 and err == "error: --output is empty (an unset shell variable?); give it a value\n", err
    rc, _, err = run_cli(generate.main, ["--run-dir", "runs/x", "--prompt-file", ""])
    assert rc == 2 and err.endswith("--prompt-file is empty (an unset shell variable?); give it a value, or leave it "
                                    "out\n"), err
