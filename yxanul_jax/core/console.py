"""The one output channel of yxanul-jax: what a command tells its user, and where.

* `info(msg)`: progress and results, on stdout;
* `note(msg)`: remarks about the run that are not its output (nothing to do, resumed, ...), on stderr;
* `warn(msg)`: `warning: msg` on stderr, once per distinct message;
* `error(msg)`: `error: msg` on stderr (the CLIs' one-line user errors).

Each message starts on a fresh line: a live progress line (`monitor.Progress`) registers itself here
and is ended before anything else is printed, so an error never lands at the tail of a progress bar (a
tqdm bar is erased before an error: the error is the one line left). Bars are drawn on terminals only
(`progress_wanted`), so a log or a pipe holds no bar line before an error.
Library callers that want silence or a log file can point `set_streams` elsewhere.
"""
from __future__ import annotations

import sys
from typing import TextIO

_out: TextIO | None = None  # None: the current sys.stdout / sys.stderr (pytest's capture replaces them)
_err: TextIO | None = None
_live = None  # the object whose partial line is on the terminal (has .close())
_warned: set[str] = set()


def set_streams(out: TextIO | None = None, err: TextIO | None = None) -> None:
    """Send info to `out` and notes, warnings and errors to `err` (None: stdout / stderr)."""
    global _out, _err
    _out, _err = out, err


def set_live(line) -> None:
    """Register (or with None, forget) the progress line to end before the next message."""
    global _live
    _live = line


def _end_live(erase: bool = False) -> None:
    global _live
    if _live is not None:
        live, _live = _live, None
        if erase and hasattr(live, "leave"):
            live.leave = False  # a tqdm bar: close() clears its line, so an error stands alone
        live.close()


def progress_wanted(asked: bool = True) -> bool:
    """Whether to draw a progress bar: `asked` (no --no-progress) and stderr is a terminal."""
    stream = _err or sys.stderr
    return asked and bool(getattr(stream, "isatty", lambda: False)())


def info(msg: str) -> None:
    _end_live()
    print(msg, file=_out or sys.stdout, flush=True)


def note(msg: str) -> None:
    _end_live()
    print(msg, file=_err or sys.stderr, flush=True)


def warn(msg: str) -> None:
    if msg in _warned:
        return
    _warned.add(msg)
    _end_live()
    print(f"warning: {msg}", file=_err or sys.stderr, flush=True)


def error(msg: str) -> None:
    _end_live(erase=True)
    print(f"error: {msg}", file=_err or sys.stderr, flush=True)
