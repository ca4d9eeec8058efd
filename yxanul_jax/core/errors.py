"""The one error type for user mistakes, the one line a failed write becomes (`writing`), and the exit codes the
commands end with (`core.args.cli_entry`)."""
from __future__ import annotations

import contextlib
import errno
import os
import re
from typing import Iterator

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


WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})
"""The operating system's reasons a write fails that the user fixes (disk full, quota, read-only, permissions,
a file-size limit): `writing` turns them into one line naming the path."""
_ERRNO_IN_TEXT = re.compile(r"os error (\d+)|os_error_code='?(\d+)")  # Rust's io::Error (tokenizers), TensorStore


def os_errno(e: BaseException) -> int | None:
    """The errno behind `e`: an OSError's, or the one a Rust (`tokenizers`) or TensorStore error spells in its
    message ("File too large (os error 27)"); None when it carries none."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno
    m = _ERRNO_IN_TEXT.search(str(e))
    return int(m.group(1) or m.group(2)) if m else None


class WriteError(UserError):
    """A write that failed for a reason the user fixes (`WRITE_ERRNOS`); `errno` holds which."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.errno = code


def write_error(e: BaseException, path: str | os.PathLike) -> WriteError | None:
    """The one-line UserError for a failed write of `path` (disk full, read-only, permissions: `WRITE_ERRNOS`),
    or None when `e` is not such a failure."""
    code = e.errno if isinstance(e, WriteError) else os_errno(e)
    if code not in WRITE_ERRNOS:
        return None
    name = errno.errorcode.get(code, code)
    return WriteError(f"cannot write '{os.fspath(path)}': {os.strerror(code)} (errno {name}); free space, fix the "
                      "permissions or pass another path, then run the command again", code)


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Inside, a write that fails for a reason in `WRITE_ERRNOS` raises one UserError line naming `path` (the
    outermost `writing` names it: the file or folder the user asked for, not a temporary name inside it);
    every other error passes unchanged. Every writer (prepared datasets, tokenizers, exports, run files,
    metrics) writes inside one."""
    try:
        yield
    except UserError as e:
        if isinstance(e, WriteError):
            raise write_error(e, path) from e.__cause__
        raise
    except Exception as e:  # noqa: BLE001 - only write failures are translated; the rest re-raised
        err = write_error(e, path)
        if err is None:
            raise
        raise err from e
