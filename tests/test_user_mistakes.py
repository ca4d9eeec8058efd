"""User mistakes an adversarial pass found ending in a traceback (2026-11-27): each is now one `error:` line, exit 2,
found before a run writes anything where it can be (a compile-time or out-of-memory failure comes later)."""
import os
import re

import pytest

from yxanul_jax import analyze, train
from yxanul_jax.core.coerce import read_yaml
from yxanul_jax.core.config import load_config
from yxanul_jax.core.errors import UserError
from yxanul_jax.core.tiles import MAX_BLOCK, parse_tiles

from data_fixtures import run_cli


def _one_line(rc: int, err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 2 and lines and lines[-1].startswith("error: ") and "Traceback" not in err, err
    for w in words:
        assert w in lines[-1], (w, lines[-1])
    return lines[-1]


@pytest.mark.parametrize("spec,why", [
    (f"dx={2 * MAX_BLOCK}x16", f"a power of 2 from 16 to {MAX_BLOCK}"),  # 2**70 ran to an int64 overflow in jit
    ("dx=65536x65536", f"a power of 2 from 16 to {MAX_BLOCK}"),  # a 34 GB allocation in interpret mode
    ("dx=128x128s9", "stages 9 must be 1 to 8"), ("dx=128x128w3", "warps 3 must be 1, 2, 4, 8 or 16"),
    ("dx=64x64,", "an empty part"), (",dx=64x64", "an empty part"), ("", "an empty part"),
    ("dx=64x64,dx=128x128", "dx given twice"),  # the last one won, silently
    ("default,dx=64x64", "'default' stands alone"),
])
def test_fused_ce_tile_specs_out_of_range_or_malformed(spec, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_tiles(spec)
    with pytest.raises(UserError, match=f"^config key 'train.fused_ce_tiles': .*{re.escape(why)}"):
        load_config(None, [f"train.fused_ce_tiles={spec}"])
    assert parse_tiles("fwd=256x64,dx=128x64s3").dx.bv == 64  # what stays allowed


def test_xla_options_and_forced_cudnn_refused_before_the_run_directory(tmp_path):
    run = tmp_path / "run"
    for override, words in [("train.xla_options.xla_no_such_flag=1", ("train.xla_options", "xla_no_such_flag")),
                            ("train.xla_options.xla_gpu_enable_triton_gemm=notabool", ("notabool",)),
                            ("model.attention=cudnn", ("model.attention=cudnn", "auto or xla"))]:
        rc, _, err = run_cli(train.main, ["train.steps=1", "--run-dir", run, override])
        _one_line(rc, err, *words)
        assert not run.exists()  # checked before anything is written
    # analyze checks the same, with --xla-option (the same as train.xla_options.K=V) and the --compare variant
    rc, _, err = run_cli(analyze.main, ["--xla-option", "xla_no_such_flag=1"])
    _one_line(rc, err, "xla_no_such_flag")
    rc, _, err = run_cli(analyze.main, ["--xla-option", "xla_gpu_enable_triton_gemm=true", "fp8.gemm_form=dequant"])
    _one_line(rc, err, "needs Triton GEMMs off")  # was accepted: the option was applied after the config's checks
    rc, _, err = run_cli(analyze.main, ["--target", "h100", "--compare", "train.fused_ce_tiles=dx=64x"])
    _one_line(rc, err, "train.fused_ce_tiles")  # was a ValueError traceback after the base config's compile


def test_vocabulary_sizes_beyond_int32_or_a_trainable_bpe(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"^config key 'model.vocab_size' \(10,000,000,000, .*int32"):
        load_config(None, ["model.vocab_size=10000000000"])  # was an int32 OverflowError in plan, a Rust abort in train
    from yxanul_jax.data.corpus import ensure_demo_dataset

    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    for size in (100, 2**21 + 1):
        with pytest.raises(UserError, match=rf"^model.vocab_size \(the demo corpus trains its own BPE\): {size} "):
            ensure_demo_dataset(vocab_size=size)
    assert not (tmp_path / "cache").exists()  # refused before its lock file


def test_seeds_beyond_64_bits_are_refused_with_the_config():
    # a larger train.seed reached JAX's PRNG key (a signed 64-bit int) only after the run directory was written
    for key in ("train.seed", "data.shuffle_seed"):
        with pytest.raises(UserError, match=rf"^config key '{key}' must be in \[0, 2\*\*63 - 1\], got {2**63}$"):
            load_config(None, [f"{key}={2**63}"])
        assert load_config(None, [f"{key}={2**63 - 1}"])


def test_an_out_of_memory_step_is_one_line_naming_the_fixes(tmp_path):
    # 65,536 rows of 64 tokens: XLA's CPU client cannot allocate the 235 GB the step asks for
    rc, _, err = run_cli(train.main, ["train.steps=1", "--run-dir", tmp_path / "run", "curriculum.0.batch_size=65536",
                                      "curriculum.1.batch_size=65536"])
    _one_line(rc, err, "out of memory (Out of memory allocating", "grad_accum_steps", "yxanul_jax.plan")


def test_a_yaml_error_names_its_line_and_column(tmp_path):
    path = tmp_path / "tabs.yaml"
    path.write_text("model:\n\td_model: 64\n")
    with pytest.raises(UserError, match=r"not valid YAML: found character '\\t' .*\(line 2, column 1\); YAML indents "
                                        r"with spaces, not tabs$"):
        read_yaml(str(path))
    assert os.path.exists(path)


def test_a_config_named_without_its_folder_and_ending_is_pointed_to(tmp_path, monkeypatch):
    from yxanul_jax.core.config import load_config

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("train:\n  steps: 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"config file 'mine' does not exist; .*\(did you mean configs/mine.yaml\?\)$"):
        load_config("mine")
    with pytest.raises(UserError, match=r"config file 'other' does not exist; .*configs/ folder has examples\)$"):
        load_config("other")
    with pytest.raises(UserError, match=r"index 2 out of range, 'curriculum' has 2 entries; to add one, set the whole "
                                        r"list: curriculum=\[\{\.\.\.\}, \.\.\.\]$"):
        load_config(None, ["curriculum.2.seq_len=64"])


def test_what_yaml_makes_of_an_unquoted_word_is_named_with_the_fix():
    """`model.name=on` (a boolean), `train.sample_prompt=#include` (a comment: nothing): the error says why and how to
    quote; the quoted forms are taken. `train.steps=1e3` (YAML 1.1: a string) is the integer 1000."""
    from yxanul_jax.core.config import load_config

    for override, got in (("model.name=on", "True"), ("train.sample_prompt=#include", "None")):
        with pytest.raises(UserError, match=rf"must be a string, got {got} \(YAML reads .*quote it, on the command "
                                            rf"line as \"{override.split('=')[0]}='\.\.\.'\"$"):
            load_config(None, [override])
    cfg = load_config(None, ["model.name='on'", "train.sample_prompt='#include'", "train.steps=1e3"])
    assert (cfg.model.name, cfg.train.sample_prompt, cfg.train.steps) == ("on", "#include", 1000)
    with pytest.raises(UserError, match=r"'train.steps' must be an integer, got 1.5$"):
        load_config(None, ["train.steps=1.5e0"])


def test_a_key_given_twice_is_refused_naming_it_not_the_last_one_kept(tmp_path):
    """PyYAML keeps the last of a duplicated key silently; a config file or an override's value names it instead."""
    from yxanul_jax.core.config import load_config

    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  d_model: 64\n  n_layers: 2\n  d_model: 96\n")
    with pytest.raises(UserError, match=r"not valid YAML: found the key 'd_model' twice in one mapping; keep one "
                                        r"\(line 4, column 3\)$"):
        read_yaml(str(path))
    with pytest.raises(UserError, match=r"found the key 'seq_len' twice"):
        load_config(None, ["curriculum=[{start_step: 0, seq_len: 32, seq_len: 64, batch_size: 4}]"])
    path.write_text("model:\n  d_model: 64\ntrain:\n  steps: 3\n")  # the same key in two sections is two keys
    assert read_yaml(str(path)) == {"model": {"d_model": 64}, "train": {"steps": 3}}
    # a merge key's fields may be set again beside it (that is what `<<:` is for); an unhashable key stays PyYAML's
    path.write_text("curriculum:\n  - &s {start_step: 0, seq_len: 32, batch_size: 4}\n  - <<: *s\n"
                    "    start_step: 3\n    seq_len: 64\n")
    stages = load_config(str(path)).curriculum
    assert [(c.start_step, c.seq_len, c.batch_size) for c in stages] == [(0, 32, 4), (3, 64, 4)]
    path.write_text("train:\n  ? [a]\n  : 1\n")
    with pytest.raises(UserError, match=r"not valid YAML: found unhashable key \(line 2, column 5\)$"):
        read_yaml(str(path))


def test_no_command_and_a_zero_memory_size_are_error_lines():
    from yxanul_jax import cli, plan

    rc, out, err = run_cli(cli.main, [])
    assert "commands:" in out  # the usage, as before
    _one_line(rc, err, "no command given")  # was exit 2 with nothing on stderr
    rc, _, err = run_cli(plan.main, ["--gpu", "0GB"])
    _one_line(rc, err, "--gpu 0GB: a memory size must be more than 0")  # was "unknown GPU ... or a size such as 24GB"


def test_a_run_directory_whose_config_is_a_yaml_list_is_one_short_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("- 1\n")
    rc, _, err = run_cli(train.main, ["train.steps=1", "--run-dir", run])
    line = _one_line(rc, err, "does not hold a run's config (a YAML list")
    assert len(line) < 300  # was 2,528 characters: the whole resolved config, as the value it differed from
    assert sorted(os.listdir(run)) == ["config.yaml"]


def test_a_sub_key_of_a_field_that_takes_a_mapping_says_to_give_it_whole():
    with pytest.raises(UserError, match=r"^config key 'data.train' has no sub-keys while it holds ''; give the "
                                        r"mapping whole, e.g. 'data.train=\{books: \.\.\.\}'$"):
        load_config(None, ["data.train.books=prepared/books"])
    with pytest.raises(UserError, match=r"^config key 'train.steps' has no sub-keys$"):  # no mapping to suggest
        load_config(None, ["train.steps.x=1"])


def test_event_loop_closed_tracebacks_from_other_threads_are_dropped_from_a_commands_stderr():
    # TensorStore's callbacks print these from their threads after a failed restore (export / generate on a truncated
    # checkpoint: 4-28 lines around the error line); every other write passes, the main thread's untouched
    import io
    import threading

    from yxanul_jax.core.args import _LoopClosedFilter

    out = io.StringIO()
    err = _LoopClosedFilter(out)

    def traceback(last: str):  # written in pieces, as Python's traceback printer writes
        for piece in ("Traceback (most recent call last):", "\n", '  File "base_events.py", line 806, in x\n',
                      "    self._check_closed()\n", last.split(":")[0], ": " + last.split(": ", 1)[1], "\n"):
            err.write(piece)

    for last in ("RuntimeError: Event loop is closed", "ValueError: something else"):
        t = threading.Thread(target=traceback, args=(last,))
        t.start()
        t.join()
    err.write("error: the one line\n")
    text = out.getvalue()
    assert "Event loop is closed" not in text and "ValueError: something else\n" in text
    assert text.endswith("error: the one line\n") and text.count("Traceback") == 1
    traceback("RuntimeError: Event loop is closed")  # the main thread's own output is never filtered
    assert out.getvalue().endswith("RuntimeError: Event loop is closed\n")
