"""`python -m yxanul_jax.config show`: every config key with its type, default, current value and doc.

    python -m yxanul_jax.config show [--config FILE] [key=value ...] [--json]

The keys, types and docs are read from the schema itself (the dataclasses of `yxanul_jax.core.config` and
the docstring under each field), so the listing cannot fall behind it. The current value is the config the
other commands would build from the same `--config` and overrides (unknown keys and bad values are the same
one-line errors); a key whose value differs from the default is marked. The curriculum is shown as the list
(`curriculum`, its stage count) and then every stage's keys, `curriculum.N.KEY`, each against the default
curriculum's stage N (or a default stage past its end). `--json` prints one JSON list of
{key, type, default, value, overridden, doc} instead.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import typing

from yxanul_jax.core.args import ArgumentParser, add_config_args, cli_entry, config_from_args
from yxanul_jax.core.coerce import leaves, to_dict, type_name
from yxanul_jax.core.config import Config
from yxanul_jax.core.errors import UserError

LIST_DOC = "Set one stage's field with curriculum.N.KEY=VALUE, or the whole list with curriculum=[{...}, ...]."


def rows(cfg: Config) -> list[dict]:
    """One dict per key of `cfg` (schema order): key, type, default, value (JSON-safe), overridden, doc."""
    out = []
    for key, tp, default, value, doc in leaves(cfg, Config()):
        is_list = isinstance(value, tuple) and bool(value) and dataclasses.is_dataclass(value[0])
        out.append({"key": key, "type": type_name(tp), "default": to_dict(default), "value": to_dict(value),
                    "overridden": to_dict(value) != to_dict(default),
                    "doc": f"{doc} {LIST_DOC}" if is_list else doc})
    return out


def _text(value) -> str:
    """A value as an override writes it: true, 0.003, [q, k, v], {web: /data/web}, "" and "def " quoted."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        plain = value and value == value.strip() and not any(c in value for c in ",:[]{}#\"'")
        return value if plain else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _shown(row: dict, key: str):
    """The listing's value or default of a row: a list of stages as its length."""
    value = row[key]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return f"{len(value)} stage{'s' if len(value) != 1 else ''}"
    return _text(value)


def format_rows(table: list[dict]) -> str:
    """The text listing: a heading per section (its class docstring), then per key `key: type = value`,
    `(default)` or `(overridden; default D)`, and the doc indented under it."""
    hints = typing.get_type_hints(Config)
    changed = sum(r["overridden"] for r in table if not r["key"].startswith("curriculum."))
    lines = [f"{len(table)} config keys, {changed} overridden; set any with key=value (lists: [a, b], "
             "mappings: {k: v}) or in a --config YAML file"]
    section = None
    for row in table:
        head = row["key"].split(".")[0]
        if head != section:
            section = head
            tp = hints[head]
            cls = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
            lines += ["", f"# {head}: {' '.join((cls.__doc__ or '').split())}"]
        note = f"(overridden; default {_shown(row, 'default')})" if row["overridden"] else "(default)"
        lines.append(f"{row['key']}: {row['type']} = {_shown(row, 'value')}  {note}")
        if row["doc"]:
            lines.append(textwrap.fill(row["doc"], width=100, initial_indent="    ", subsequent_indent="    ",
                                       break_on_hyphens=False))
    return "\n".join(lines)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m yxanul_jax.config", description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["show"], help="show: list every key")
    add_config_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the text listing")
    args = parser.parse_intermixed_args(argv)  # overrides may come before, between or after flags
    if args.action is None:
        raise UserError("say what to do: python -m yxanul_jax.config show [--config FILE] [key=value ...] [--json]")
    table = rows(config_from_args(args))
    print(json.dumps(table) if args.json else format_rows(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
