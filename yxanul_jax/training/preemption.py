"""Stopping a run cleanly on SIGTERM/SIGINT: the signal guard, and when every process agrees to stop.

`SignalGuard` turns the first SIGTERM/SIGINT into a flag; `stop_requested(guard, step)` tells the
training loop whether to save a checkpoint and stop after `step`. With one process that is the
guard's own flag. With several, all of them must stop at the same step (a collective save that only
some processes enter would hang), so they decide together:

* every `STOP_CHECK_EVERY` steps the processes all-gather their guard flags
  (`multihost_utils.process_allgather`) and stop if any is set: a SIGTERM or Ctrl-C on one process
  stops all of them within that many steps;
* where JAX's preemption service is running, `multihost_utils.reached_preemption_sync_point(step)`
  is asked at every step as well, and a True from it also stops the run. The service agrees on the
  step itself, so it answers True at the same step on every process.

What JAX (0.10) does, read from its source (`jax/experimental/multihost_utils.py`,
`jax/_src/distributed.py`, and XLA's `tsl/distributed_runtime/preemption/preemption_notifier.cc`):

* `jax.distributed.initialize` creates the preemption sync manager after connecting the
  distributed client, unless `jax_enable_preemption_service` is off (it is on by default);
* `reached_preemption_sync_point(step)` returns False when there is no distributed client (a plain
  single-process run), raises `RuntimeError("Preemption sync manager has not been initialized...")`
  when there is a client but no manager (the service turned off), and otherwise asks the manager.
  The manager's protocol needs every process to call it at every step, from the same start step;
  after a preemption notice it returns True on all processes at one agreed step (the highest step
  any process had reached, plus one);
* the notice outside Google's builds is SIGTERM: the notifier installs a C-level SIGTERM handler
  (`std::signal`) that sets a flag its listener thread polls each second. A Python handler
  installed later (this module's `SignalGuard`) replaces that C handler, so while the guard is in
  place SIGTERM reaches the guard, not JAX's notifier, and the all-gathered flags carry it. The sync
  point then answers True for a notice that reached the notifier (a SIGTERM before the guard was
  entered, or a build with other notifiers).

`stop_requested` detects the service by calling `reached_preemption_sync_point` and treating exactly
that "has not been initialized" RuntimeError as "no service" (any other error propagates).
"""
from __future__ import annotations

import signal
import threading
from typing import Any

import jax
import numpy as np

from yxanul_jax.core import console

STOP_CHECK_EVERY = 5
"""Steps between the processes' all-gather of their guard flags (a small collective)."""
_NO_SERVICE = "has not been initialized"


class SignalGuard:
    """Context manager that turns SIGTERM/SIGINT into a flag the training loop polls.

    Inside the guard the first signal only sets `.requested` (and `.signal_name`, e.g.
    "SIGTERM"); the loop then saves a checkpoint and exits cleanly. A second signal runs the
    handler that was installed before the guard (Ctrl-C twice still interrupts). On exit the
    previous handlers are restored. Outside the main thread (where Python cannot install signal
    handlers) the guard does nothing and the flag stays False.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = signals
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "SignalGuard":
        if threading.current_thread() is not threading.main_thread():
            console.warn("SignalGuard used outside the main thread; signals will not be caught")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not self.requested:
            self.requested, self.signal_name = True, name
            console.note(f"{name} received: saving a checkpoint and stopping after this step "
                         "(send it again to stop at once)")
            return
        previous = self._previous.get(signum, signal.SIG_DFL)
        self._restore()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)


def _reached_sync_point(step: int) -> bool:
    """JAX's preemption sync point at `step`; False where the preemption service is not running."""
    from jax.experimental import multihost_utils

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError as e:
        if _NO_SERVICE in str(e):
            return False
        raise


def stop_requested(guard: SignalGuard, step: int) -> bool:
    """Whether to stop after `step`. One process: its own signal flag. Several: JAX's preemption sync
    point (asked every step, where the service runs) or any process's flag, shared every
    STOP_CHECK_EVERY steps; every process gets the same answer at the same step (module docstring).
    Call it once per step on every process."""
    if jax.process_count() == 1:
        return guard.requested
    preempted = _reached_sync_point(step)
    if step % STOP_CHECK_EVERY:
        return preempted
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.array([int(guard.requested)], np.int32))
    return preempted or bool(np.max(flags))
