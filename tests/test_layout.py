"""The package's layering, read from the source: sub-packages only import the layers below them, the
commands at the top level import the library and never each other, and every module says what it is for."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "yxanul_jax"

# Lower layers never import higher ones; packages on one layer never import each other.
LAYERS = {"core": 0, "data": 1, "model": 1, "analysis": 2, "training": 3, "inference": 4}
COMMANDS = 5  # the modules directly under yxanul_jax/: `python -m yxanul_jax.<command>` and `yxanul`


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _group(dotted: str) -> str:
    """'yxanul_jax.training.steps' -> 'training'; 'yxanul_jax.train' -> 'train' (a command)."""
    return dotted.split(".")[1]


def _layer(group: str) -> int:
    return LAYERS.get(group, COMMANDS)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, 'yxanul_jax.x.y') for every import of the package in the file, deferred ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("yxanul_jax"):
            if node.module == "yxanul_jax":
                found += [(node.lineno, f"yxanul_jax.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("yxanul_jax.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "relative"))
    return found


def _own_group(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return _group(".".join(rel.parts)) if len(rel.parts) > 2 else "<command>"


def test_the_package_has_the_layout_the_test_knows():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)
    assert all((PACKAGE / g / "__init__.py").is_file() for g in LAYERS)


def _violations(own: str, imports: list[tuple[int, str]]) -> list[str]:
    """What breaks the layering in a module of group `own` ('<command>' for a top-level module)."""
    own_layer = COMMANDS if own == "<command>" else LAYERS[own]
    bad = []
    for line, target in imports:
        if target == "relative":
            bad.append(f"line {line}: a relative import (the package imports itself by absolute path)")
            continue
        group = _group(target)
        if group == own or (own == "<command>" and group in LAYERS):
            continue
        if own == "<command>":
            bad.append(f"line {line}: a command imports the command {target}")
        elif _layer(group) >= own_layer:
            bad.append(f"line {line}: {own} (layer {own_layer}) imports {target} (layer {_layer(group)})")
    return bad


def test_imports_only_go_down():
    bad = [f"{path.relative_to(PACKAGE)} {v}" for path in _modules() for v in _violations(_own_group(path), _imports(path))]
    assert len(_modules()) > 40 and not bad, "\n".join(bad)


def test_every_module_starts_by_saying_what_it_is_for():
    def says(path):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        return bool(doc) and len(doc.splitlines()[0]) > 20
    assert not [str(p.relative_to(PACKAGE)) for p in _modules() if not says(p)]


def test_the_layering_check_can_fail(tmp_path):
    """Upward, sideways and command-to-command imports are each reported, deferred ones included."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from yxanul_jax.train import main\n"
                      "from yxanul_jax.data import corpus\nfrom yxanul_jax.core.config import Config\n")
    imports = sorted(_imports(module))
    assert imports == [(2, "yxanul_jax.train"), (3, "yxanul_jax.data"), (4, "yxanul_jax.core.config")]
    assert _violations("model", imports) == ["line 2: model (layer 1) imports yxanul_jax.train (layer 5)",
                                             "line 3: model (layer 1) imports yxanul_jax.data (layer 1)"]
    assert _violations("training", imports) == ["line 2: training (layer 3) imports yxanul_jax.train (layer 5)"]
    assert _violations("<command>", [(1, "yxanul_jax.plan")]) == ["line 1: a command imports the command yxanul_jax.plan"]
    assert _violations("<command>", [(1, "yxanul_jax.training.steps")]) == []


def test_the_top_level_holds_the_commands_and_nothing_else():
    from yxanul_jax.cli import COMMANDS

    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "cli"}
    assert top == set(COMMANDS), "a top-level module must be a `yxanul` command (library code goes in a sub-package)"


def test_errors_imports_nothing_from_the_package():
    """Everything imports `core.errors`, so it imports no module of the package (not even deferred): no cycle."""
    assert _imports(PACKAGE / "core" / "errors.py") == []
