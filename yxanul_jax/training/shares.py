"""The data mixture in the metrics log: each dataset's share of the training tokens per log window.

With `data.train` a mapping (`yxanul_jax.data.mixture`), every train.log_every steps (and at the last step)
one metrics row holds, per dataset `name`, `data/share/<name>`: its share of the tokens of the steps since the
last such row, and `data/tokens/<name>`: the tokens it gave over the whole run (resumes included), whose
ratios are the realized mixture to compare with data.weights.
"""
from __future__ import annotations

from yxanul_jax.training.hooks import Hook


class DomainShares(Hook):
    """Writes the rows of the module docstring into `writer` (a `MetricsWriter`, or `NullWriter` off process 0);
    reads the counts from the loop's stream (`MixtureStream.domain_tokens`) after each step is dispatched."""

    def __init__(self, cfg, writer):
        self.cfg, self.writer = cfg, writer
        self._last: dict[str, int] = {}

    def on_start(self, loop, state, step: int) -> None:
        self._last = loop.stream.domain_tokens()

    def after_step(self, loop, state, done: int) -> None:
        if done % self.cfg.train.log_every and done != self.cfg.train.steps:
            return
        now = loop.stream.domain_tokens()  # the stream has delivered the batch of step `done`, not yet the next
        window = {n: now[n] - self._last.get(n, 0) for n in now}
        total = max(sum(window.values()), 1)
        self.writer.write({"step": done, **{f"data/share/{n}": t / total for n, t in window.items()},
                           **{f"data/tokens/{n}": t for n, t in now.items()}})
        self._last = now
