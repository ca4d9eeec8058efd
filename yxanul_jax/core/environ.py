"""Temporary process settings: environment variables and module attributes set for a block and put back after
(as they were, a variable that was unset unset again), for commands that a caller may run in its own process."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """`os.environ` with `values` set inside the block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def attributes(obj: Any, **values: Any) -> Iterator[None]:
    """`obj`'s attributes set to `values` inside the block (each must exist)."""
    saved = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(obj, k, v)
