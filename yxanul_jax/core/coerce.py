"""Typed building of frozen dataclasses from YAML files, plain dicts and dotted `key.sub=value` overrides, and back.

Generic over dataclasses (the config schema lives in `yxanul_jax.core.config`): every key is checked
against the dataclass fields (unknown keys get a close-match suggestion) and every value against the
field's annotation; lossless conversions (int -> float, list -> tuple, "a,b" -> tuple) are made. Any
failure raises `UserError` with one line naming the dotted key.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import os
import shlex
import textwrap
import types
import typing
from typing import Any, Iterable, Iterator, Literal, TypeVar

import yaml

from yxanul_jax.core.errors import UserError, one_line

T = TypeVar("T")


def suggest(key: str, choices: Iterable[str], prefix: str = "") -> str:
    """A close match spelled as a full dotted key, else the list of valid keys."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{_join(prefix, close[0])}'?)"
    return f" (valid: {', '.join(sorted(choices))})"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def type_name(tp: Any) -> str:
    """An annotation as a user reads it: `int`, `'a' | 'b'`, `list[str]` (a tuple), `dict[str, str]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple:
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _yaml11_number(value: Any) -> Any:
    """`value`, or the float a string spells: YAML 1.1 reads "1e-3" and "1e3" (no dot) as strings."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _coerce(value: Any, tp, key: str) -> Any:
    """Check `value` against the annotation `tp`; convert lossless cases (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UserError(f"config key '{key}' must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, key)
    if origin is Literal:
        if value not in args:
            raise UserError(f"config key '{key}' must be one of {type_name(tp)}, got {value!r}"
                            + (suggest(str(value), [str(a) for a in args]) if isinstance(value, str) else ""))
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for i, option in enumerate(inner):  # the first type that takes the value, in the order written
            try:
                return _coerce(value, option, key)
            except UserError as e:
                if i == len(inner) - 1:
                    if type(None) in args:  # the one spelling of "unset" YAML reads as None
                        raise UserError(f"{e}; or null to leave it unset") from None
                    raise
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key '{key}' must be a list, got {value!r}")
        elem = args[0]
        return tuple(_coerce(v, elem, _join(key, i)) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"config key '{key}' must be a mapping, got {value!r}")
        kt, vt = args
        return {_coerce(k, kt, key): _coerce(v, vt, _join(key, k)) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        value = _yaml11_number(value)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise UserError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        value = _yaml11_number(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        space = next((i for i, c in enumerate(key) if c.isspace()), None)
        if value is None and space is not None:  # `{a: x, b y}`: YAML reads `b y` as a key without a value
            last = key[key.rfind(".", 0, space) + 1:]
            first = last.split()[0]
            raise UserError(f"config key '{key}' has no value: YAML read '{last}' as one key; write '{first}: "
                            f"{last[len(first):].strip()}' (a ':' and a space after the key)")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            how = ""
            if value is None or isinstance(value, bool):  # what YAML made of an unquoted word
                how = (f" (YAML reads an unquoted yes/no/on/off/true/false as a boolean, and ~, null or a leading # "
                       f"as nothing); quote it, on the command line as \"{key}='...'\"")
            raise UserError(f"config key '{key}' must be a string, got {value!r}{how}")
        return str(value)
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")  # a bug, not a user error


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: dict | None, prefix: str = "") -> T:
    """Build dataclass `cls` from a (sparse) dict; unknown keys and bad types raise UserError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"config section '{prefix or '<root>'}' must be a mapping, got {data!r}")
    types_ = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise UserError(f"unknown config key '{_join(prefix, key)}'{suggest(str(key), names, prefix)}")
        kwargs[key] = _coerce(value, types_[key], _join(prefix, key))
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain dict/list form of a dataclass tree (YAML- and JSON-safe)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


# --------------------------------------------------------------------------------------------
# Dotted overrides


def _parse_value(text: str) -> Any:
    try:
        return load_yaml(text) if text != "" else ""
    except _DuplicateKey as e:  # never read as a string
        raise UserError(f"the override value '{text}': {yaml_problem(e)}") from None
    except yaml.YAMLError:
        return text


def _set_path(obj, path: list[str], raw: Any, done: str):
    """Return a copy of `obj` with `path` set to `raw` (type-checked against the field)."""
    key = path[0]
    here = _join(done, key)
    if isinstance(obj, tuple):
        if not key.lstrip("-").isdigit():
            raise UserError(f"config key '{here}': '{done}' is a list, index it with a number")
        i = int(key)
        if not -len(obj) <= i < len(obj):
            raise UserError(f"config key '{here}': index {i} out of range, '{done}' has {len(obj)} entries; to add "
                            f"one, set the whole list: {done}=[{{...}}, ...]")
        items = list(obj)
        if len(path) == 1:
            raise UserError(f"config key '{here}': set a field of the entry, e.g. '{here}.seq_len=...'")
        items[i] = _set_path(items[i], path[1:], raw, here)
        return tuple(items)
    if isinstance(obj, dict):
        if len(path) != 1:
            raise UserError(f"config key '{here}' is nested too deep")
        return {**obj, key: raw}
    if not dataclasses.is_dataclass(obj):
        raise UserError(f"config key '{done}' has no sub-keys")
    names = {f.name for f in dataclasses.fields(obj)}
    if key not in names:
        raise UserError(f"unknown config key '{here}'{suggest(key, names, done)}")
    tp = _hints(type(obj))[key]
    if len(path) == 1:
        value = _coerce(raw, tp, here)
    else:
        current = getattr(obj, key)
        if not (dataclasses.is_dataclass(current) or isinstance(current, (tuple, dict))) and _takes_mapping(tp):
            # e.g. data.train, a path or a mapping of them, holding a path: a mapping is given whole
            raise UserError(f"config key '{here}' has no sub-keys while it holds {current!r}; give the mapping "
                            f"whole, e.g. '{here}={{{path[1]}: ...}}'")
        value = _set_path(current, path[1:], raw, here)
        if isinstance(current, dict):
            value = _coerce(value, tp, here)
    return dataclasses.replace(obj, **{key: value})


def _takes_mapping(tp) -> bool:
    """Whether a field's type hint admits a dict (`dict[...]`, or a Union with one)."""
    return typing.get_origin(tp) is dict or any(typing.get_origin(a) is dict or a is dict
                                                 for a in typing.get_args(tp))


def apply_overrides(obj: T, overrides: list[str]) -> T:
    """Apply `key.sub=value` strings in order to dataclass `obj` (values parsed as YAML scalars/lists)."""
    for item in overrides:
        if "=" not in item:
            if item.endswith((".yaml", ".yml")):
                raise UserError(f"'{item}' looks like a config file; did you mean --config {item}?")
            raise UserError(f"override '{item}' is not of the form key.sub=value")
        key, _, text = item.partition("=")
        key = key.strip()
        if not key:
            raise UserError(f"override '{item}' names no key")
        if key.startswith("-"):  # a flag with a space in its value reaches here (argparse takes it for an override)
            hint = without_dashes(key, text, type(obj)) or "config keys are set as key=value, without dashes"
            raise UserError(f"override '{item}' starts with a dash; {hint}")
        obj = _set_path(obj, key.split("."), _parse_value(text), "")
    return obj


def without_dashes(flag: str, value: str | None, cls) -> str | None:
    """The hint for a config key given as a flag (`--optim.lr=0.01`, `--log-every 5`): the key=value form it
    meant, quoted for the shell where the value needs it; None when no key of `cls` has its name."""
    name = flag.lstrip("-").replace("-", "_")  # flags spell words with dashes, config keys with underscores
    keys = [name] if "." in name else keys_named(name, cls)
    if not keys:
        return None
    return (f"config keys are set as key=value, without dashes: "
            f"{shlex.quote(keys[0] + '=' + (value if value is not None else 'VALUE'))}")


def keys_named(name: str, cls, prefix: str = "") -> list[str]:
    """The dotted keys of dataclass `cls` whose last part is `name` ("steps" -> ["train.steps"]), for hints."""
    found = []
    types_ = _hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        if dataclasses.is_dataclass(types_[f.name]):
            found += keys_named(name, types_[f.name], key)
        elif f.name == name:
            found.append(key)
    return found


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> dict[str, str]:
    """The docstring written under each field of dataclass `cls` (the string literal after it), whitespace
    collapsed to one line; {} where the source cannot be read (a frozen build without .py files)."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    except (OSError, TypeError):
        return {}
    return {node.target.id: " ".join(doc.value.value.split())
            for node, doc in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}


def leaves(obj: Any, base: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, Any, str]]:
    """(dotted key, annotation, value in `base`, value in `obj`, doc) of every key of dataclass `obj` that an
    override sets, in schema order; `base` is a reference of the same type (the defaults). A list of
    dataclasses is one leaf for the whole list (doc: the element's class docstring), then each entry's keys
    (`curriculum.1.seq_len`) against `base`'s entry of that index, or past its end the element's defaults.
    Other lists and mappings are one leaf each."""
    types_, docs = _hints(type(obj)), field_docs(type(obj))
    for f in dataclasses.fields(obj):
        key, tp, value, default = _join(prefix, f.name), types_[f.name], getattr(obj, f.name), getattr(base, f.name)
        elem = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
        if dataclasses.is_dataclass(tp):
            yield from leaves(value, default, key)
        elif dataclasses.is_dataclass(elem):
            yield key, tp, default, value, " ".join((elem.__doc__ or "").split())
            for i, entry in enumerate(value):
                yield from leaves(entry, default[i] if i < len(default) else elem(), _join(key, i))
        else:
            yield key, tp, default, value, docs.get(f.name, "")


def to_yaml(obj: Any) -> str:
    """YAML text of a dataclass (its `to_dict`), fields in schema order."""
    return yaml.safe_dump(to_dict(obj), sort_keys=False)


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping (`_UniqueKeys`)."""


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key given twice in one mapping (it keeps the last one silently: a config
    that sets `d_model` twice would train the second without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be set again here, by design
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML's own error names it
                continue
            if twice:
                raise _DuplicateKey(None, None, f"found the key '{key}' twice in one mapping; keep one",
                                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """`yaml.safe_load` of a config's text (a file, or an override's value), with keys given twice refused."""
    return yaml.load(text, Loader=_UniqueKeys)


def yaml_problem(e: Exception) -> str:
    """A YAML parse error in one line with where it is: PyYAML's problem and its line and column (1-based), e.g.
    "found character '\\t' that cannot start any token (line 3, column 1)"; other errors as `one_line`."""
    mark = getattr(e, "problem_mark", None)
    if isinstance(e, yaml.MarkedYAMLError) and e.problem and mark is not None:
        tab = "; YAML indents with spaces, not tabs" if "'\\t'" in e.problem else ""
        return f"{e.problem} (line {mark.line + 1}, column {mark.column + 1}){tab}"
    return one_line(e)


def read_yaml(path: str, run: bool = False) -> dict:
    """The mapping in a YAML config file ({} for an empty one); UserError naming the file otherwise. `run`: a run
    directory's resolved config, which is never empty (an emptied one would read as the defaults)."""
    if not os.path.exists(path):
        near = f"configs/{path}.yaml"  # `--config yxanul_197m`: the file's name without its folder and ending
        hint = f"did you mean {near}?" if os.path.isfile(near) else "the repository's configs/ folder has examples"
        raise UserError(f"config file '{path}' does not exist; pass an existing YAML file ({hint})")
    if os.path.isdir(path):
        raise UserError(f"config file '{path}' is a directory; pass a YAML file in it (see configs/)")
    try:
        with open(path, encoding="utf-8") as fh:
            data = load_yaml(fh)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"config file '{path}' is not valid YAML: {yaml_problem(e)}") from None
    if data is None and run:
        raise UserError(f"run config '{path}' is empty, so the run's model and data are unknown; restore it (the "
                        "resolved config the run wrote when it started), or pass another --run-dir")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections (model:, fp8:, ...)")
    return data
