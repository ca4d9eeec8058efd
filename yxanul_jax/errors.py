"""The one error type for user mistakes, and the CLI wrapper that turns it into exit code 2."""
from __future__ import annotations

import functools
import sys
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


def one_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def cli_entry(main: F) -> F:
    """Decorate a ``main(argv) -> int`` so that a UserError prints one line and exits 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USER_ERROR

    return wrapper  # type: ignore[return-value]
