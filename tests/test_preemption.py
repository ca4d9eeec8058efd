"""Tests for yxanul_jax.training.preemption: the signal guard (real signals) and the stop decision."""
from __future__ import annotations

import signal

import numpy as np
import pytest

from yxanul_jax.training import preemption
from yxanul_jax.training.preemption import STOP_CHECK_EVERY, SignalGuard, stop_requested


def test_signal_guard_sets_flag_and_restores_handlers():
    # signal.raise_signal runs the Python handler before it returns (main thread), so nothing races
    calls = []
    original_int = signal.getsignal(signal.SIGINT)
    original_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with SignalGuard() as guard:
            assert not guard.requested
            signal.raise_signal(signal.SIGTERM)
            assert guard.requested  # still alive: the default would have killed us
            assert guard.signal_name == "SIGTERM" and calls == []
            signal.raise_signal(signal.SIGINT)  # a second signal goes to the previous handler
            assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is original_term
        assert signal.getsignal(signal.SIGINT) is not original_int and callable(signal.getsignal(signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, original_int)


def test_stop_requested_follows_the_guard_on_one_process():
    with SignalGuard() as guard:
        assert not any(stop_requested(guard, step) for step in range(1, 12))
        signal.raise_signal(signal.SIGTERM)
        # one process: at once, at any step (no agreement to wait for)
        assert all(stop_requested(guard, step) for step in (1, 2, STOP_CHECK_EVERY + 1))


def test_without_a_distributed_client_jax_reports_no_sync_point():
    assert preemption._reached_sync_point(7) is False  # this process never called jax.distributed.initialize


class _Processes:
    """Two processes as stop_requested sees them: every process's flag, and JAX's sync point."""

    def __init__(self, monkeypatch, flags, sync=lambda step: False):
        from jax.experimental import multihost_utils

        self.gathers = []
        monkeypatch.setattr(preemption.jax, "process_count", lambda: len(flags))
        monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", sync)

        def allgather(x):
            self.gathers.append(int(x[0]))
            return np.array([[int(x[0])], *[[f] for f in flags[1:]]], np.int32)
        monkeypatch.setattr(multihost_utils, "process_allgather", allgather)


def test_several_processes_share_their_flags_every_few_steps(monkeypatch):
    procs = _Processes(monkeypatch, flags=[0, 1])  # a SIGTERM reached the other process
    guard = SignalGuard()
    stops = [step for step in range(1, 2 * STOP_CHECK_EVERY + 1) if stop_requested(guard, step)]
    assert stops == [STOP_CHECK_EVERY, 2 * STOP_CHECK_EVERY] and procs.gathers == [0, 0]


def test_jax_preemption_sync_point_stops_at_its_step(monkeypatch):
    procs = _Processes(monkeypatch, flags=[0, 0], sync=lambda step: step == 7)
    guard = SignalGuard()
    assert [step for step in range(1, 11) if stop_requested(guard, step)] == [7]
    assert procs.gathers == [0, 0]  # the flags are still gathered at steps 5 and 10 on every process


def test_without_jaxs_preemption_service_the_flags_decide(monkeypatch):
    def not_initialized(step):
        raise RuntimeError("Preemption sync manager has not been initialized. Make sure the "
                           "'jax_enable_preemption_service' config is enabled.")
    _Processes(monkeypatch, flags=[0, 0], sync=not_initialized)
    guard = SignalGuard()
    guard.requested = True  # this process's own flag
    assert [step for step in range(1, 11) if stop_requested(guard, step)] == [5, 10]

    def broken(step):
        raise RuntimeError("coordination service unreachable")
    _Processes(monkeypatch, flags=[0, 0], sync=broken)
    with pytest.raises(RuntimeError, match="unreachable"):  # only "not initialized" means "no service"
        stop_requested(guard, 3)
