"""The command line every yxanul command shares: its argument parser, the config arguments, and the
`cli_entry` wrapper that turns a user mistake into one `error:` line and exit code 2."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import io
import logging
import math
import os
import re
import signal
import sys
import threading
from typing import Callable, TypeVar

from yxanul_jax.core import console
from yxanul_jax.core.coerce import without_dashes
from yxanul_jax.core.config import Config, load_config
from yxanul_jax.core.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, UserError, one_line

F = TypeVar("F", bound=Callable[..., int | None])


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes (a missing, unknown or malformed flag) raise one UserError line naming
    the fix, instead of printing the usage block; every command's parser is one of these."""

    def error(self, message: str):
        ranged = re.fullmatch(r"argument (\S+): (\S+ must be .*)", message)  # a `Ranged` flag's value
        if ranged:
            message = f"{ranged.group(1).split('/')[-1]} {ranged.group(2)}"
        hint = ""
        unknown = [m.groups() for m in map(re.compile(r"--([\w.-]+)(=.*)?", re.S).fullmatch, self._unrecognized) if m]
        if unknown and message.startswith("unrecognized arguments"):
            name, value = unknown[0]
            said = without_dashes(name, value and value[1:], Config)  # None: a flag that is no config key either
            hint = f"; {said}" if said else ""
        raise UserError(f"{message}{hint}; see {self.prog} --help")

    _unrecognized: list[str] = []

    def parse_args(self, args=None, namespace=None):
        """argparse's own, keeping the unrecognized arguments as given (its message joins them with spaces, so a
        value with a space could not be told from the next argument)."""
        return self._refuse_unrecognized(*self.parse_known_args(args, namespace))

    def parse_intermixed_args(self, args=None, namespace=None):
        """As `parse_args`, for overrides given before, between or after the flags."""
        return self._refuse_unrecognized(*self.parse_known_intermixed_args(args, namespace))

    def _refuse_unrecognized(self, namespace, unrecognized: list[str]):
        self._unrecognized = unrecognized
        if unrecognized:
            self.error(f"unrecognized arguments: {' '.join(unrecognized)}")
        return namespace

    def _get_value(self, action, arg_string):
        """Each value as argparse converts it, an empty one refused: no flag or argument of ours takes "", and an
        unset shell variable (`--run-dir "$RUN"`) would otherwise read as the flag left out, or as the working
        directory for a path (`prepare --input ""` tokenized everything below it)."""
        if arg_string == "" and not isinstance(action, argparse._SubParsersAction):  # its parser checks its own
            name = (action.option_strings[-1] if action.option_strings
                    else f"an argument where {action.metavar or action.dest} goes")
            leave = "" if action.required else ", or leave it out"
            raise UserError(f"{name} is empty (an unset shell variable?); give it a value{leave}")
        return super()._get_value(action, arg_string)


class Ranged:
    """The `type=` of every numeric flag: parses an int or a finite float and checks it lies in [lo, hi] (an
    open end with `lo_open` / `hi_open`; None: unbounded), so an out-of-range value is refused while the flags
    are read, before anything is written: `error: --top-k -1 must be >= 0; see ... --help` (`why`, when given,
    follows in parentheses)."""

    def __init__(self, kind: type, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False, why: str = ""):
        self.kind, self.lo, self.hi, self.lo_open, self.hi_open, self.why = kind, lo, hi, lo_open, hi_open, why
        self.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"

    def describe(self) -> str:
        """The range in words: `>= 0`, `in [0, 1)` (an int's ends written whole: `in [0, 4294967295]`)."""
        lo, hi = (None if v is None else str(v) if self.kind is int else f"{v:g}" for v in (self.lo, self.hi))
        if lo is not None and hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        return f"{'<' if self.hi_open else '<='} {hi}" if hi is not None else "a number"

    def outside(self) -> list[str]:
        """Values just outside the range (what the tests try on every flag)."""
        out = []
        if self.lo is not None:
            out.append(str(self.kind(self.lo) if self.lo_open else self.kind(self.lo) - 1))
        if self.hi is not None:
            out.append(str(self.kind(self.hi) if self.hi_open else self.kind(self.hi) + 1))
        return out + (["nan"] if self.kind is float else [])

    def __call__(self, text: str):
        value = self.kind(text)  # ValueError: argparse says "invalid int value"
        if not math.isfinite(value) or (
                self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)) or (
                self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)):
            why = f" ({self.why})" if self.why else ""
            finite = "" if math.isfinite(value) else "a finite number "  # inf is >= 0, and NaN is neither
            raise argparse.ArgumentTypeError(f"{text} must be {finite}{self.describe()}{why}")
        return value


def user_path(text: str) -> str:
    """The `type=` of every flag that names a file or folder: `~` expanded. bash expands `--output ~/x` but not
    `--output=~/x`, where the check of a path and its write would otherwise name different ones (a folder `~`).
    `~name` of no user on this machine is refused (pathlib's expanduser raised deep inside the command)."""
    path = os.path.expanduser(text)
    if path.startswith("~"):
        user = path[1:].split(os.sep, 1)[0]
        raise argparse.ArgumentTypeError(f"'{text}': there is no user '{user}' whose home '~{user}' names; write "
                                         f"./{path} for a file or folder of that name here")
    return path


def add_config_args(parser) -> None:
    """The `--config FILE` and trailing `key=value` arguments every command shares."""
    parser.add_argument("--config", default=None, type=user_path, help="YAML file overriding the defaults (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted config overrides")


def config_from_args(args) -> Config:
    return load_config(args.config, args.overrides)


def _silence_logging() -> None:
    logging.disable(logging.CRITICAL)


class _LoopClosedFilter(io.TextIOBase):
    """This process's stderr without the tracebacks that end in "RuntimeError: Event loop is closed" and come from
    threads other than the main one: after a failed restore, TensorStore's callbacks print them from their own
    threads as Orbax's event loop closes (4 to 28 lines around the error line of `export` or `generate` on a
    truncated checkpoint, 2026-11-27). Every other write passes unchanged. Installed by `cli_entry` for a process
    run as the command only."""

    def __init__(self, stream):
        self.stream = stream
        self._held: dict[int, list[str]] = {}  # thread -> the traceback it is writing, until its exception line

    def write(self, text: str) -> int:
        ident = threading.get_ident()
        if threading.current_thread() is threading.main_thread() or (
                ident not in self._held and not text.startswith("Traceback (most recent call last)")):
            return self.stream.write(text)
        held = self._held.setdefault(ident, [])
        held.append(text)
        block = "".join(held)
        last = block.rstrip("\n").rsplit("\n", 1)[-1]
        if block.endswith("\n") and last and not last.startswith((" ", "Traceback")):  # its exception line: complete
            del self._held[ident]
            if last != "RuntimeError: Event loop is closed":
                self.stream.write(block)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


_as_command = False


def command_stderr() -> None:
    """This process is a command (`python -m yxanul_jax.X`, `yxanul X`): its stderr drops what `_LoopClosedFilter`
    drops, and a Ctrl-C ends it at once (`_exit_now`), wherever it lands (`_unraisable`). Idempotent."""
    global _as_command, _unraisable_before
    _as_command = True
    if not isinstance(sys.stderr, _LoopClosedFilter):
        sys.stderr = _LoopClosedFilter(sys.stderr)
    if sys.unraisablehook is not _unraisable:
        _unraisable_before, sys.unraisablehook = sys.unraisablehook, _unraisable


_unraisable_before = sys.unraisablehook


def _unraisable(info) -> None:
    """A command's hook for the exceptions Python can only print ("Exception ignored in ..."): a Ctrl-C that lands
    in a garbage-collection callback (JAX's `_xla_gc_callback` runs on every collection), a `__del__` or a weakref
    callback was printed and lost, and the command went on to finish and exit 0. It is raised again 10 ms later
    (a one-shot SIGALRM, no thread), by then outside that callback, where it stops the command as a Ctrl-C does."""
    if not (isinstance(info.exc_value, KeyboardInterrupt) and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()):
        _unraisable_before(info)
        return
    before = signal.getsignal(signal.SIGALRM)

    def again(signum, frame):
        signal.signal(signal.SIGALRM, signal.SIG_DFL if before is None else before)
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, again)
    signal.setitimer(signal.ITIMER_REAL, 0.01)


def _quiet_at_exit() -> None:
    """After a user error, nothing more is logged when the process ends: background threads that fail as the
    interpreter shuts down (Orbax's after a failed save: "ERROR:absl:... cannot schedule new futures after
    interpreter shutdown" and a traceback) would print below the one `error:` line. Registered with threading's
    exit hooks, which run before those threads are joined (and never while a library caller goes on)."""
    global _quiet_registered
    if not _quiet_registered:
        _quiet_registered = True
        register = getattr(threading, "_register_atexit", atexit.register)  # CPython >= 3.9: before the joins
        with contextlib.suppress(RuntimeError):  # already shutting down
            register(_silence_logging)


_quiet_registered = False


def _exit_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown: a Ctrl-C during a checkpoint restore left
    TensorStore's and JAX's native threads running, and tearing the interpreter down under them crashed it
    (exit 139 after the `error:` line, not 130), or printed a KeyboardInterrupt traceback from the thread joins."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def cli_entry(main: F) -> F:
    """Decorate a ``main(argv) -> int`` so that a user mistake ends in one `error:` line: a UserError
    or an operating-system error (read-only output, disk full, permissions, a missing file) exits 2,
    Ctrl-C exits 130. Files are written to temporary paths and renamed, so nothing is half-written."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        if not args and not kwargs:  # run as the command (`python -m ...`)
            command_stderr()
        try:
            return main(*args, **kwargs)
        except UserError as e:
            console.error(str(e))
            _quiet_at_exit()
            return EXIT_USER_ERROR
        except OSError as e:
            _quiet_at_exit()
            where = f" '{e.filename}'" if getattr(e, "filename", None) else ""
            what = e.strerror or one_line(e)
            console.error(f"{what}{where} ({type(e).__name__}); free space, fix the permissions or pass "
                          "another path, then run the command again")
            return EXIT_USER_ERROR
        except KeyboardInterrupt:
            if _as_command:  # a second Ctrl-C while the line is printed would raise inside this handler
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
            console.error("interrupted (Ctrl-C); finished files and checkpoints are intact, temporary ones "
                          "are removed on the next run")
            if _as_command:  # the command (not a caller of main(argv)): end now, every `finally` has run
                _exit_now(EXIT_INTERRUPTED)
            return EXIT_INTERRUPTED
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            _quiet_at_exit()
            console.error(f"out of memory ({one_line(e).removeprefix('RESOURCE_EXHAUSTED: ')}): run a smaller batch "
                          "(a stage's batch_size with more grad_accum_steps holds the same tokens, or train.micro_split) "
                          "or save memory (model.remat=full); `python -m yxanul_jax.plan --config FILE --gpu GPU` "
                          "checks a config against a GPU's memory")
            return EXIT_USER_ERROR

    return wrapper  # type: ignore[return-value]


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is JAX's report of a device (or host) allocation it could not make: a batch or model too large
    for the machine, which the user fixes (`cli_entry`), unlike XLA's other runtime errors."""
    text = str(e)
    return type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and text.startswith("RESOURCE_EXHAUSTED") \
        and "Out of memory" in text
