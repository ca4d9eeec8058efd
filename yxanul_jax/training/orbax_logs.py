"""Quieting Orbax while checkpoints are open: its log noise, and what a failed async write leaves behind.

`quiet_orbax()` is a context manager (reference-counted: nested and concurrent Checkpointers share
one installation) that, while any holder is inside it, adds one `logging.Filter` to the "absl" and
"asyncio" loggers and wraps `sys.unraisablehook`; the last holder's exit removes exactly those two
again (a hook wrapped over ours by someone else is left in place, ours then passes everything on).
What is dropped:

* Orbax's warnings about normal use here (`_ORBAX_NOISE`);
* the tracebacks Orbax's background threads (absl) and unawaited write tasks (asyncio) log for a
  failed write, which the Checkpointer reports itself in one line (`write_failure`);
* TensorStore's callbacks that find Orbax's event loop already closed after a failed write
  (hundreds of "Exception ignored ... Event loop is closed" unraisable RuntimeErrors).

A failed async write keeps producing the last two, and Python's "coroutine ... was never awaited"
RuntimeWarnings for the writes Orbax had queued, after the Checkpointer is closed: while the
process shuts down, when the abandoned tasks are collected. So `keep_quiet_until_exit()`, called
once a write has failed, installs a second filter and hook of its own for the rest of the process,
and only then a warnings filter for those RuntimeWarnings. A process whose writes all succeed has
none of this left once its Checkpointers are closed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from typing import Iterator

from yxanul_jax.core.errors import one_line, os_errno

_LOGGERS = ("absl", "asyncio")  # Orbax's threads log to absl; its unawaited write tasks to asyncio
_ORBAX_NOISE = ("did not provide metrics", "read_only=True, setting save_interval_steps", "Given directory is read only")
"""Orbax warnings about what is normal here: a save without metrics once best-tracking is on, and a
read-only manager (a reader beside a run) being read-only."""
_NEVER_AWAITED = "coroutine .* was never awaited"


def write_failure(e: BaseException) -> str | None:
    """The operating system's reason ("No space left on device", "Read-only file system", ...) when
    `e` is a failed write, else None. TensorStore reports these as ValueError carrying the errno."""
    if isinstance(e, OSError):
        return e.strerror or one_line(e)
    code = os_errno(e)  # the one reader of errnos spelled in messages (core.errors)
    return os.strerror(code) if code is not None else None


class _OrbaxLogFilter(logging.Filter):
    """Drops two kinds of Orbax log records: its warnings about normal use (`_ORBAX_NOISE`), and the
    tracebacks its background threads and tasks log for a failed write."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(noise in message for noise in _ORBAX_NOISE):
            return False
        return not (record.exc_info and record.exc_info[1] is not None and write_failure(record.exc_info[1]))


class _UnraisableHook:
    """`sys.unraisablehook` that drops "Event loop is closed" RuntimeErrors and passes the rest to
    the hook it replaced (everything, once `active` is False)."""

    def __init__(self, previous):
        self.previous = previous
        self.active = True

    def __call__(self, unraisable) -> None:
        exc = unraisable.exc_value
        if self.active and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        self.previous(unraisable)


LOG_FILTER = _OrbaxLogFilter()
"""The one filter object `quiet_orbax` adds to the "absl" and "asyncio" loggers."""
_AFTER_FAILURE_FILTER = _OrbaxLogFilter()  # keep_quiet_until_exit's own

_lock = threading.Lock()
_holders = 0
_hook: _UnraisableHook | None = None
_pinned = False


def _acquire() -> None:
    global _holders, _hook
    with _lock:
        if _holders == 0:
            for name in _LOGGERS:
                logging.getLogger(name).addFilter(LOG_FILTER)
            _hook = _UnraisableHook(sys.unraisablehook)
            sys.unraisablehook = _hook
        _holders += 1


def _release() -> None:
    global _holders, _hook
    with _lock:
        _holders -= 1
        if _holders > 0:
            return
        for name in _LOGGERS:
            logging.getLogger(name).removeFilter(LOG_FILTER)
        if _hook is not None:
            if sys.unraisablehook is _hook:
                sys.unraisablehook = _hook.previous
            else:  # wrapped over by someone else since: stay in their chain, passing everything on
                _hook.active = False
            _hook = None


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """Drop Orbax's noise (module docstring) while inside; nested and concurrent uses share one filter."""
    _acquire()
    try:
        yield
    finally:
        _release()


def keep_quiet_until_exit() -> None:
    """After a failed write: drop the same noise for the rest of the process, with a filter and a hook
    of its own (so `quiet_orbax`'s holders still remove exactly theirs), and ignore the "coroutine ...
    was never awaited" RuntimeWarnings of the writes Orbax abandoned (they surface when the process
    shuts down). Idempotent."""
    global _pinned
    with _lock:
        if _pinned:
            return
        _pinned = True
        for name in _LOGGERS:
            logging.getLogger(name).addFilter(_AFTER_FAILURE_FILTER)
        sys.unraisablehook = _UnraisableHook(sys.unraisablehook)
        warnings.filterwarnings("ignore", message=_NEVER_AWAITED, category=RuntimeWarning)


def is_quiet() -> bool:
    """Whether `quiet_orbax`'s filter and hook are installed now (some holder is inside it; what
    `keep_quiet_until_exit` installed is not counted)."""
    with _lock:
        return _holders > 0
