"""Tests for yxanul_jax.training.orbax_logs: what is dropped, and that nothing outlives its holders."""
from __future__ import annotations

import logging
import sys
import types

import pytest

from yxanul_jax.training import orbax_logs
from yxanul_jax.training.orbax_logs import LOG_FILTER, quiet_orbax, write_failure


@pytest.fixture
def fresh(monkeypatch):
    """The module as in a process where nothing holds it (a Checkpointer an earlier test leaked would)."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "filters", [f for f in logger.filters if f is not LOG_FILTER])
    monkeypatch.setattr(orbax_logs, "_holders", 0)
    monkeypatch.setattr(orbax_logs, "_hook", None)


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord("absl", logging.WARNING, __file__, 1, msg, None,
                             (type(exc), exc, None) if exc else None)


def test_the_filter_drops_normal_use_and_failed_writes_only():
    assert not LOG_FILTER.filter(_record("Metrics ... did not provide metrics for step 3"))
    full = ValueError("Error writing: ... [os_error_code=28] ...")
    assert write_failure(full) == "No space left on device"
    assert not LOG_FILTER.filter(_record("background save failed", full))
    assert LOG_FILTER.filter(_record("background save failed", KeyError("x")))
    assert LOG_FILTER.filter(_record("something else"))


def test_nested_holders_share_one_installation_and_the_last_removes_it(fresh):
    absl, asyncio_log = logging.getLogger("absl"), logging.getLogger("asyncio")
    filters, hook = (list(absl.filters), list(asyncio_log.filters)), sys.unraisablehook
    seen = []
    monkey_previous = lambda u: seen.append(u.exc_value)  # noqa: E731
    sys.unraisablehook = monkey_previous
    try:
        with quiet_orbax():
            with quiet_orbax():
                assert absl.filters.count(LOG_FILTER) == asyncio_log.filters.count(LOG_FILTER) == 1
                closed, other = RuntimeError("Event loop is closed"), RuntimeError("other")
                for exc in (closed, other):
                    sys.unraisablehook(types.SimpleNamespace(exc_value=exc))
                assert seen == [other]  # only the closed event loop's errors are dropped
            assert orbax_logs.is_quiet() and LOG_FILTER in absl.filters
        assert not orbax_logs.is_quiet()
        assert (list(absl.filters), list(asyncio_log.filters)) == filters
        assert sys.unraisablehook is monkey_previous
    finally:
        sys.unraisablehook = hook


def test_a_hook_wrapped_over_ours_stays_and_ours_passes_everything_on(fresh):
    hook = sys.unraisablehook
    seen = []
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        with quiet_orbax():
            ours = sys.unraisablehook
            sys.unraisablehook = theirs = lambda u: ours(u)  # someone wraps ours while we hold it
        assert sys.unraisablehook is theirs  # left alone
        closed = RuntimeError("Event loop is closed")
        theirs(types.SimpleNamespace(exc_value=closed))
        assert seen == [closed]  # ours no longer drops anything
    finally:
        sys.unraisablehook = hook
