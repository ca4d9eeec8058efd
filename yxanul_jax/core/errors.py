"""The one error type for user mistakes, and the exit codes the commands end with (`core.args.cli_entry`)."""
from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


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
