"""Names that become paths: a name from a config or a manifest is one path component (`safe_name`), and a file
a manifest names lies inside its folder (`inside`), so nothing is read or written outside the run directory,
the cache and the paths the user gave."""
from __future__ import annotations

import os
from pathlib import Path

from yxanul_jax.core.errors import UserError


def safe_name(key: str, value: str, example: str = "tiny") -> str:
    """`value` when it is a plain name (one path component: not empty, `.` or `..`, no `/` or `\\`, not
    absolute); else UserError naming `key` (the config key or manifest field it came from)."""
    text = str(value)
    if (not text.strip() or text in (".", "..") or "/" in text or "\\" in text or "\0" in text
            or os.path.isabs(text) or text.startswith("~")):
        raise UserError(f"{key} {text!r} is not a name: it becomes a folder name, so it may not be empty, '.', "
                        f"'..', absolute or hold '/'; use a plain name such as {example!r}")
    return text


def inside(root: str | os.PathLike, relative: str, what: str) -> Path:
    """`root / relative` with symlinks resolved, or UserError when it is absolute or leads outside `root` (a
    manifest that names another file on the machine); `what` names the field, e.g. "its tokenizer"."""
    base = Path(root).resolve()
    target = (base / str(relative)).resolve()
    if os.path.isabs(str(relative)) or not target.is_relative_to(base):
        raise UserError(f"'{root}' names {what} '{relative}', outside its folder; a prepared dataset holds its own "
                        "files: prepare it again with `python -m yxanul_jax.prepare`")
    return target
