"""Bad input as a class (issue 27): every numeric config field and command-line flag is range-checked before
anything is written; no progress bar line before a one-line error; every writer turns a full, read-only or
forbidden disk into one line naming the path, leaving nothing behind."""
import argparse
import contextlib
import dataclasses
import fcntl
import importlib
import os
import pty
import resource
import signal
import struct
import sys
import termios
import typing

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from yxanul_jax.core.args import ArgumentParser, Ranged
from yxanul_jax.core.config import Config, load_config
from yxanul_jax.core.errors import UserError

from data_fixtures import docs, run_cli, tiny_tok, tiny_tok_path, write_parquet  # noqa: F401 (fixtures)


# ---- (a) every numeric config field has a range check that names it


def _numeric_keys(cls=Config, prefix="") -> list[tuple[str, type]]:
    """(dotted key, int | float) of every numeric field of the schema; the curriculum as its stage 0."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        if tp in (int, float):
            out.append((key, tp))
        elif dataclasses.is_dataclass(tp):
            out += _numeric_keys(tp, f"{key}.")
        elif typing.get_origin(tp) is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out += _numeric_keys(typing.get_args(tp)[0], f"{key}.0.")
    return out


def test_every_numeric_config_field_refuses_an_out_of_range_value_naming_its_key():
    """-2 is outside every int field's range (-1 is the lowest any field means something by), -1.0, NaN and inf
    outside every float field's: each is one UserError line naming the key, and no other key (a rule that covered
    two keys named both, so the user could not tell which was wrong). A field added without a rule fails."""
    keys = _numeric_keys()
    assert len(keys) > 50 and ("data.num_workers", int) in keys and ("optim.eps", float) in keys
    missed = []
    for key, tp in keys:
        for bad in (["-2"] if tp is int else ["-1.0", "nan", "inf"]):
            try:
                load_config(None, [f"{key}={bad}"])
                missed.append(f"{key}={bad} accepted")
            except UserError as e:
                others = [k for k, _ in keys if k != key and f"'{k}'" in str(e)]
                if f"'{key}'" not in str(e) or "\n" in str(e) or others:
                    missed.append(f"{key}={bad}: {e}")
    assert not missed, "\n".join(missed)


# ---- (a) every numeric flag of every command is a `Ranged` type, refused while the flags are read


def _parsers() -> list[tuple[str, list[str], argparse.ArgumentParser]]:
    """(command, argv prefix, parser) of every command and sub-command, caught as its main() parses."""
    from yxanul_jax.cli import COMMANDS

    class Caught(Exception):
        pass

    def catch(self, *args, **kwargs):
        raise Caught(self)

    found = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ArgumentParser, "parse_args", catch)
        mp.setattr(ArgumentParser, "parse_intermixed_args", catch)
        for name in COMMANDS:
            try:
                module = importlib.import_module(f"yxanul_jax.{name}")
            except ModuleNotFoundError:
                continue  # a command this version lacks
            with pytest.raises(Caught) as caught:
                module.main([])
            parser = caught.value.args[0]
            found.append((name, [], parser))
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    found += [(name, [sub], p) for sub, p in action.choices.items()]
    return found


def test_every_numeric_flag_is_range_checked_before_anything_runs(tmp_path, monkeypatch):
    from yxanul_jax.cli import main

    parsers = _parsers()
    assert {"train", "prepare", "tokenizer", "generate", "plan", "analyze"} <= {c for c, _, _ in parsers}
    bare = [f"{c} {' '.join(pre)} {a.option_strings}" for c, pre, p in parsers for a in p._actions
            if a.type in (int, float)]
    assert not bare, f"numeric flags without a range (use core.args.Ranged): {bare}"
    tried = 0
    monkeypatch.chdir(tmp_path)  # a command that wrote anything would leave it here
    for command, prefix, parser in parsers:
        for action in parser._actions:
            if not isinstance(action.type, Ranged):
                continue
            flag = action.option_strings[-1]
            for bad in action.type.outside():
                rc, out, err = run_cli(main, [command, *prefix, flag, bad])
                lines = err.splitlines()
                assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag} {bad} must be "), err
                tried += 1
    assert tried >= 15 and not os.listdir(tmp_path)


def test_no_flag_or_argument_takes_an_empty_value(tmp_path, monkeypatch):
    """`--run-dir "$RUN"` with RUN unset: every value-taking flag and argument of every command refuses "" while the
    flags are read (before, an empty --run-dir or --checkpoint read as left out, and `prepare --input ""` tokenized
    the working directory)."""
    from yxanul_jax.cli import main

    tried = 0
    monkeypatch.chdir(tmp_path)
    for command, prefix, parser in _parsers():
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            args = [action.option_strings[-1], ""] if action.option_strings else [""]
            rc, out, err = run_cli(main, [command, *prefix, *args])
            lines = err.splitlines()
            assert rc == 2 and len(lines) == 1 and " is empty (an unset shell variable?)" in lines[0], (args, err)
            assert (action.option_strings[-1] if action.option_strings else "an argument where") in lines[0]
            tried += 1
    assert tried >= 40 and not os.listdir(tmp_path)


# ---- (c) no progress bar (or anything else) before the one-line error


def _damaged_parquet(path, docs):
    pq.write_table(pa.table({"text": docs * 4}), path, row_group_size=len(docs))  # snappy pages
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 2000] = b"\xff" * 2000  # inside the pages, far from the footer: found only while reading
    path.write_bytes(bytes(data))
    return path


def test_prepare_on_a_damaged_input_is_one_line_and_leaves_nothing(tmp_path, docs, tiny_tok_path):
    from yxanul_jax import prepare

    bad_utf8 = tmp_path / "b.txt"
    bad_utf8.write_bytes(b"good text\n\nbad \xff\xfe bytes\n")
    for inputs, needle in (([_damaged_parquet(tmp_path / "in.parquet", docs)], "is damaged after row"),
                           ([write_parquet(tmp_path / "ok.parquet", {"text": docs[:30]}), bad_utf8], "invalid UTF-8")):
        out = tmp_path / "new" / "deeper" / "out"
        rc, stdout, err = run_cli(prepare.main, ["--input", *inputs, "--tokenizer", tiny_tok_path, "--output", out])
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
        assert stdout == "" and not (tmp_path / "new").exists()  # the folders made for the output are gone too


def test_on_a_terminal_the_bar_is_erased_so_the_error_is_the_one_line_left(tmp_path, docs, tiny_tok_path,
                                                                          monkeypatch):
    """The same damaged input with stderr a real terminal (a pty): the bar is drawn, then erased before the
    error, so what the terminal shows (each line after its last carriage return) is the error alone."""
    from yxanul_jax import prepare

    src = _damaged_parquet(tmp_path / "in.parquet", docs)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 0x0 terminal gets no bar
    with os.fdopen(slave, "w", buffering=1) as term:
        monkeypatch.setattr(sys, "stderr", term)
        rc = prepare.main([str(a) for a in ("--input", src, "--tokenizer", tiny_tok_path, "--output", tmp_path / "o")])
        term.flush()
        monkeypatch.undo()
    written = b""
    while True:  # everything the command wrote to the terminal, until EIO: the terminal's other end is closed
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        written += chunk
    os.close(master)
    text = written.decode()
    assert rc == 2 and "tokenizing" in text  # the bar was there...
    shown = [line.split("\r")[-1].strip() for line in text.replace("\r\n", "\n").split("\n")]
    shown = [line for line in shown if line]
    assert len(shown) == 1 and shown[0].startswith("error: input") and "damaged" in shown[0], repr(text)


# ---- (b) every writer: a full / forbidden disk is one line naming the path, nothing left behind


@contextlib.contextmanager
def _files_capped_at(limit: int):
    """Files of this process may not grow past `limit` bytes (EFBIG, as on a full disk), while inside."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def _one_line_naming(rc: int, err: str, path) -> str:
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: cannot write "), err
    assert f"'{path}'" in err and "Traceback" not in err, err
    return err


def test_a_full_disk_while_preparing_or_training_a_tokenizer_is_one_line_naming_the_output(tmp_path, docs,
                                                                                          tiny_tok_path):
    from yxanul_jax import prepare, tokenizer

    src = write_parquet(tmp_path / "in.parquet", {"text": docs[:40]})
    out = tmp_path / "sub" / "prepared"
    with _files_capped_at(4096):  # the tokenizer copy alone is larger
        rc, _, err = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", out])
    assert "File too large" in _one_line_naming(rc, err, out)
    assert not (tmp_path / "sub").exists()  # no temp folder, no made parents
    tok_out = tmp_path / "tok"
    with _files_capped_at(4096):
        rc, _, err = run_cli(tokenizer.main, ["train", "--input", src, "--vocab-size", "300", "--output", tok_out])
    _one_line_naming(rc, err, tok_out)
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_a_forbidden_output_and_a_full_metrics_file_are_one_line(tmp_path, docs, tiny_tok_path):
    """/sys refuses new entries even to root (EPERM), a real refusal without mounts or chmod; metrics.jsonl
    under a file-size cap (EFBIG) is the metrics writer's own line."""
    from yxanul_jax import prepare
    from yxanul_jax.core.rundir import atomic_write
    from yxanul_jax.training.monitor import MetricsWriter

    src = write_parquet(tmp_path / "in.parquet", {"text": docs[:10]})
    out = "/sys/yxanul-test-output"
    rc, _, err = run_cli(prepare.main, ["--input", src, "--tokenizer", tiny_tok_path, "--output", out])
    if "is not writable" in err:  # /sys mounted read-only: refused up front (check_output_parent), also right
        pytest.skip(f"/sys is refused before any write here: {err!r}")
    _one_line_naming(rc, err, out)
    with pytest.raises(UserError, match=r"^cannot write '/sys/yxanul-test\.txt': .*errno (EPERM|EACCES|EROFS)"):
        atomic_write("/sys/yxanul-test.txt", "x")
    (tmp_path / "run").mkdir()
    with MetricsWriter(str(tmp_path / "run")) as mw:
        mw.write({"step": 1, "loss": 1.0})
        with _files_capped_at(64), pytest.raises(UserError) as e:
            mw.write({"step": 2, "loss": 2.0, "note": "x" * 200})
    assert str(e.value).startswith(f"cannot write '{tmp_path / 'run' / 'metrics.jsonl'}': File too large")


def test_a_write_the_system_refuses_names_the_output_never_its_temp_path(tmp_path):
    """/proc passes the permission check and refuses new files (ENOENT); a folder is not replaced by a file. The
    writers' line names the path asked for, not the hidden temp sibling written first, and the output checks
    find all of it (and an empty path) before any long work."""
    from yxanul_jax.core.rundir import atomic_write, check_new_output, check_output_file, staged_dir

    def stage(path):
        with staged_dir(path) as tmp:
            (tmp / "x").write_text("x")

    folder = tmp_path / "d.json"
    folder.mkdir()
    for write, path in ((lambda p: atomic_write(p, "x"), "/proc/yxanul-test.json"), (stage, "/proc/yxanul-test"),
                        (lambda p: atomic_write(p, "x"), str(folder))):
        with pytest.raises(UserError) as e:
            write(path)
        assert str(e.value).startswith(f"cannot write '{path}': ") and ".tmp-" not in str(e.value), e.value
    assert os.listdir(tmp_path) == ["d.json"] and not [p for p in os.listdir("/proc") if p.startswith(".yxanul")]
    for check, needle in ((lambda: check_output_file(folder), "is a folder"),
                          (lambda: check_new_output(folder, "never overwritten", file=True), "already exists"),
                          (lambda: check_new_output("/proc/yxanul-test", "never overwritten"), "/proc"),
                          (lambda: check_output_file(""), "--output is empty; --output must name a path")):
        with pytest.raises(UserError, match=needle) as e:
            check()
        assert ".tmp-" not in str(e.value)
    assert os.listdir(tmp_path) == ["d.json"] and not [p for p in os.listdir("/proc") if p.startswith(".yxanul")]


# ---- (c) nothing logged below the error line by threads that fail as the process ends


_LATE_LOGGER = """
import logging, sys, threading, time
from yxanul_jax.core.args import cli_entry
from yxanul_jax.core.errors import UserError

def late():  # as Orbax's threads after a failed save: they log once the interpreter is shutting down
    time.sleep(0.3)
    logging.getLogger("absl").error("_SignalingThread.run() raised an exception",
                                    exc_info=RuntimeError("cannot schedule new futures after interpreter shutdown"))

threading.Thread(target=late).start()

@cli_entry
def main(argv=None):
    raise UserError("bad input; fix it")

sys.exit(main())
"""


def test_nothing_is_logged_below_the_error_line_as_the_process_ends():
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _LATE_LOGGER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "error: bad input; fix it\n", proc.stderr
