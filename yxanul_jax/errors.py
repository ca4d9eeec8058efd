"""The one error type for user mistakes, and the CLI wrapper that turns it into exit code 2."""
from __future__ import annotations

import functools
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix: bad config, missing file, wrong column, ...

    The message is one line naming the problem and the fix. Command-line entry points print
    it as ``error: <message>`` and exit with code 2; library callers can catch it.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


def one_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (at most `limit` characters), or its type name."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if limit is None or len(line) <= limit else line[:limit - 3] + "..."


def cli_entry(main: F) -> F:
    """Decorate a ``main(argv) -> int`` so that a UserError prints one line and exits 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            from yxanul_jax import console  # deferred: errors is imported by everything, console by few

            console.error(str(e))
            return EXIT_USER_ERROR

    return wrapper  # type: ignore[return-value]
