"""The one error type for user mistakes, and the CLI wrapper that turns it into exit code 2."""
from __future__ import annotations

import argparse
import functools
import re
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


class UserError(Exception):
    """A mistake the user can fix: bad config, missing file, wrong column, ...

    The message is one line naming the problem and the fix. Command-line entry points print
    it as ``error: <message>`` and exit with code 2; library callers can catch it.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes (a missing, unknown or malformed flag) raise one UserError line naming
    the fix, instead of printing the usage block; every command's parser is one of these."""

    def error(self, message: str):
        hint = ""
        unknown = re.findall(r"--([\w-]+)", message) if message.startswith("unrecognized arguments") else []
        if unknown:
            from yxanul_jax.core.config import keys_named  # deferred: config imports this module

            keys = keys_named(unknown[0].replace("-", "_"))
            if keys:
                hint = f"; config keys are set as key=value, e.g. {keys[0]}=VALUE"
        raise UserError(f"{message}{hint}; see {self.prog} --help")


def one_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (at most `limit` characters), or its type name."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if limit is None or len(line) <= limit else line[:limit - 3] + "..."


def cli_entry(main: F) -> F:
    """Decorate a ``main(argv) -> int`` so that a user mistake ends in one `error:` line: a UserError
    or an operating-system error (read-only output, disk full, permissions, a missing file) exits 2,
    Ctrl-C exits 130. Files are written to temporary paths and renamed, so nothing is half-written."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        from yxanul_jax.core import console  # deferred: errors is imported by everything, console by few

        try:
            return main(*args, **kwargs)
        except UserError as e:
            console.error(str(e))
            return EXIT_USER_ERROR
        except OSError as e:
            where = f" '{e.filename}'" if getattr(e, "filename", None) else ""
            what = e.strerror or one_line(e)
            console.error(f"{what}{where} ({type(e).__name__}); free space, fix the permissions or pass "
                          "another path, then run the command again")
            return EXIT_USER_ERROR
        except KeyboardInterrupt:
            console.error("interrupted (Ctrl-C); finished files and checkpoints are intact, temporary ones "
                          "are removed on the next run")
            return EXIT_INTERRUPTED

    return wrapper  # type: ignore[return-value]
