"""The command line every yxanul command shares: its argument parser, the config arguments, and the
`cli_entry` wrapper that turns a user mistake into one `error:` line and exit code 2."""
from __future__ import annotations

import argparse
import functools
import re
from typing import Callable, TypeVar

from yxanul_jax.core import console
from yxanul_jax.core.coerce import keys_named
from yxanul_jax.core.config import Config, load_config
from yxanul_jax.core.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, UserError, one_line

F = TypeVar("F", bound=Callable[..., int | None])


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes (a missing, unknown or malformed flag) raise one UserError line naming
    the fix, instead of printing the usage block; every command's parser is one of these."""

    def error(self, message: str):
        hint = ""
        unknown = re.findall(r"--([\w-]+)", message) if message.startswith("unrecognized arguments") else []
        if unknown:
            keys = keys_named(unknown[0].replace("-", "_"), Config)
            if keys:
                hint = f"; config keys are set as key=value, e.g. {keys[0]}=VALUE"
        raise UserError(f"{message}{hint}; see {self.prog} --help")


def add_config_args(parser) -> None:
    """The `--config FILE` and trailing `key=value` arguments every command shares."""
    parser.add_argument("--config", default=None, help="YAML file overriding the defaults (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted config overrides")


def config_from_args(args) -> Config:
    return load_config(args.config, args.overrides)


def cli_entry(main: F) -> F:
    """Decorate a ``main(argv) -> int`` so that a user mistake ends in one `error:` line: a UserError
    or an operating-system error (read-only output, disk full, permissions, a missing file) exits 2,
    Ctrl-C exits 130. Files are written to temporary paths and renamed, so nothing is half-written."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
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
