"""Every fenced `python` and `bash` block of README.md and docs/*.md runs (issue 28), and every default
output of the commands and of those examples is git-ignored.

A block that cannot run on a CPU or in a test (an install, a GPU machine's commands, minutes of work, a
server) carries `<!-- no-test: reason -->` on the line just before its fence. Every other block runs
here, in document order, in one temporary workspace per file that holds:

  configs/, scripts/    the repository's (links)
  ../shared             the real corpora and tokenizers beside the checkout (a file that needs them skips
                        without them, as every test reading them does)
  runs/tiny             the quick start's run: the session's trained tiny run (conftest.trained_run), copied
  data/docs.parquet     documents for the README's "your own data" (`data/*.parquet`)
  val/code.parquet      the evaluation domain of the README's configuration example

Python blocks run as written, in this process. A shell block is cut into commands at line ends (after
joining `\\` continuations) and `&&`, and bash itself splits each into words (quotes, globs, comments);
`python -m yxanul_jax.X ARGS` (or `yxanul X ARGS`) then calls that command's `main(ARGS)` in this process
and must exit 0, and `python -c CODE` runs CODE here. Anything else (pip, another program, a pipe) is
refused: mark the block. Training is the one command changed, to the tiny config and tiny step counts:
`--config F` becomes configs/tiny.yaml with F's vocabulary (so data prepared for F still fits), and
`TINY_TRAIN` comes last.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SHARED
from data_fixtures import real_documents, run_cli, write_parquet

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "bash"}
FENCE = re.compile(r"^```(\S*)\s*$")
NO_TEST = re.compile(r"^<!-- no-test: (.*?) -->$")
TINY = "configs/tiny.yaml"
TINY_TRAIN = ["train.steps=2", "curriculum=[{start_step: 0, seq_len: 32, batch_size: 4}]", "eval.interval=0",
              "eval.max_batches=1", "eval.batch_size=4", "checkpoint.interval=0", "checkpoint.async_save=false",
              "optim.warmup_steps=1", "train.sample_tokens=0"]
WORKSPACE_INPUTS = ("configs", "scripts", "data", "val")  # what the workspace starts with (runs/ is checked)


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str  # the fence's info string, lower case ("" for none)
    text: str
    no_test: str | None  # the reason of a `<!-- no-test: ... -->` just before the fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in LANGS and self.no_test is None


class Unrunnable(Exception):
    """A command this test does not run: the block needs a `<!-- no-test: reason -->` mark."""


def doc_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the no-test mark on the line before it, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{path.name}:{i + 1}: a fence that is never closed"
        mark = NO_TEST.match(lines[i - 1].strip()) if i else None
        blocks.append(Block(path, i + 1, m.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n",
                            mark.group(1).strip() if mark else None))
        i = end + 1
    return blocks


# --------------------------------------------------------------------------------------------
# Running a block


def shell_commands(text: str, cwd: Path) -> list[list[str]]:
    """The commands of a shell block as argument lists, split into words by bash (quotes, globs, comments)."""
    commands = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        for part in re.split(r"\s&&\s", line):
            lexer = shlex.shlex(part, posix=True, punctuation_chars=True)
            operators = [t for t in lexer if t and set(t) <= set("();<>|&")]
            if operators:
                raise Unrunnable(f"{part.strip()!r}: shell operators {operators} are not run here")
            out = subprocess.run(["bash", "-c", "printf '%s\\0' " + part], cwd=cwd, capture_output=True, text=True,
                                 check=True).stdout
            words = [w for w in out.split("\0") if w]
            if words:
                commands.append(words)
    return commands


def command_module(argv: list[str]) -> tuple[str, list[str]] | None:
    """("yxanul_jax.X", ARGS) of `python -m yxanul_jax.X ARGS` or `yxanul X ARGS`; None for `python -c`;
    Unrunnable for anything else."""
    if argv[0] in ("python", "python3") and len(argv) > 2 and argv[1] == "-m" and argv[2].startswith("yxanul_jax."):
        return argv[2], argv[3:]
    if argv[0] == "yxanul" and len(argv) > 1:
        return f"yxanul_jax.{argv[1]}", argv[2:]
    if argv[0] in ("python", "python3") and len(argv) == 3 and argv[1] == "-c":
        return None
    raise Unrunnable(f"{shlex.join(argv)}: only `python -m yxanul_jax.X`, `yxanul X` and `python -c` run here")


def tiny_train(args: list[str]) -> list[str]:
    """`train`'s arguments on the tiny config with tiny step counts (the module docstring)."""
    from yxanul_jax.core.config import load_config

    args, named = list(args), None
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            named, args[i + 1] = args[i + 1], TINY
        elif arg.startswith("--config="):
            named, args[i] = arg.split("=", 1)[1], f"--config={TINY}"
    if named is not None and (vocab := load_config(named).model.vocab_size) != load_config(TINY).model.vocab_size:
        args.append(f"model.vocab_size={vocab}")
    return args + TINY_TRAIN


def run_block(block: Block, cwd: Path) -> list[str]:
    """Run one block in `cwd` (the current directory); returns what ran, one entry per command. Raises
    when a command fails or cannot be run here."""
    if LANGS[block.lang] == "python":
        exec(compile(block.text, block.where, "exec"), {"__name__": "__main__"})
        return [f"python block {block.where}"]
    ran = []
    for argv in shell_commands(block.text, cwd):
        target = command_module(argv)
        if target is None:
            exec(compile(argv[2], f"{block.where} (python -c)", "exec"), {"__name__": "__main__"})
            ran.append(shlex.join(argv))
            continue
        module, args = target
        if module == "yxanul_jax.train":
            args = tiny_train(args)
        rc, out, err = run_cli(importlib.import_module(module).main, args)
        assert rc == 0, f"{block.where}: `{shlex.join([module, *args])}` exited {rc}\n{(out + err)[-4000:]}"
        ran.append(shlex.join(["python", "-m", module, *args]))
    assert ran, f"{block.where}: a shell block with no command"
    return ran


def make_workspace(root: Path, trained_run: Path) -> Path:
    ws = root / "repo"
    ws.mkdir(parents=True)
    for name in ("configs", "scripts"):
        (ws / name).symlink_to(REPO / name)
    if SHARED.exists():
        (root / "shared").symlink_to(SHARED)
    shutil.copytree(trained_run, ws / "runs" / "tiny", ignore=shutil.ignore_patterns(".lock"))
    docs = real_documents()
    (ws / "data").mkdir()
    write_parquet(ws / "data" / "docs.parquet", {"text": docs})
    (ws / "val").mkdir()
    write_parquet(ws / "val" / "code.parquet", {"text": docs[::7]})
    return ws


def git_ignored(path: str) -> bool:
    """Whether the repository's .gitignore ignores `path` (relative to the repository root; a trailing / for
    a folder), whether or not it exists."""
    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", "--", path]).returncode == 0


# --------------------------------------------------------------------------------------------
# The tests


def test_every_block_runs_here_or_says_why_not():
    """Marks sit right before a fence, with a reason; every unmarked python/bash block parses and holds only
    commands this test runs (so the run below cannot leave one out)."""
    problems, runnable = [], 0
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("<!--") and "no-test" in line and not (
                    NO_TEST.match(line.strip()) and i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                problems.append(f"{path.name}:{i + 1}: a no-test mark must be `<!-- no-test: reason -->` on the "
                                "line just before a fence")
        for b in doc_blocks(path):
            if b.no_test is not None and (not b.no_test or b.lang not in LANGS):
                problems.append(f"{b.where}: a no-test mark needs a reason and a python or bash block")
            if not b.runs:
                continue
            runnable += 1
            try:
                if LANGS[b.lang] == "python":
                    compile(b.text, b.where, "exec")
                else:
                    assert shell_commands(b.text, REPO), "no command"
                    for argv in shell_commands(b.text, REPO):
                        command_module(argv)
            except (Unrunnable, SyntaxError, AssertionError) as e:
                problems.append(f"{b.where}: {e} (mark it `<!-- no-test: reason -->` if it cannot run in a test)")
    assert not problems, "\n".join(problems)
    assert runnable >= 8  # the README's and docs' examples are found at all (9 on 2026-11-24)


def test_a_broken_block_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = lambda lang, text: Block(REPO / "README.md", 1, lang, text, None)  # noqa: E731
    assert run_block(block("python", "x = 1 + 1\n"), tmp_path) == ["python block README.md:1"]
    with pytest.raises(NameError, match="tokens_BxL"):
        run_block(block("python", "import jax\nprint(tokens_BxL.shape)\n"), tmp_path)
    with pytest.raises(AssertionError, match="exited 2"):  # a user mistake: one error line, exit 2
        run_block(block("bash", "python -m yxanul_jax.plan --config configs/missing.yaml\n"), tmp_path)
    with pytest.raises(AssertionError, match="exited 2"):  # a bracketed synopsis is not a command
        run_block(block("bash", "python -m yxanul_jax.plan [--json]\n"), tmp_path)
    for text in ("pip install -e .\n", "python -m yxanul_jax.plan --json | tail -3\n", "make all && ls\n"):
        with pytest.raises(Unrunnable):
            run_block(block("bash", text), tmp_path)
    with pytest.raises(AssertionError, match="no command"):
        run_block(block("bash", "# only a comment\n"), tmp_path)
    # words as bash makes them: quotes, continuations, comments, && chains
    assert shell_commands("python -m yxanul_jax.plan --gpu 'a b' \\\n  --json  # note\nyxanul plan && yxanul x\n",
                          tmp_path) == [["python", "-m", "yxanul_jax.plan", "--gpu", "a b", "--json"],
                                        ["yxanul", "plan"], ["yxanul", "x"]]


def test_train_runs_on_the_tiny_config_with_the_named_vocabulary():
    assert tiny_train(["--config", "configs/yxanul_197m.yaml", "data.train=prepared/"]) == [
        "--config", TINY, "data.train=prepared/", "model.vocab_size=200005", *TINY_TRAIN]
    assert tiny_train(["--config=configs/tiny.yaml", "model.d_model=256"]) == [
        f"--config={TINY}", "model.d_model=256", *TINY_TRAIN]


@pytest.mark.slow
@pytest.mark.parametrize("doc", [p for p in DOCS if any(b.runs for b in doc_blocks(p))],
                         ids=lambda p: p.name)
def test_doc_blocks_run(doc, tmp_path, monkeypatch, trained_run, capsys):
    blocks = [b for b in doc_blocks(doc) if b.runs]
    if not SHARED.exists() and any("../shared" in b.text for b in blocks):
        pytest.skip(f"{doc.name} uses ../shared, absent at {SHARED}")
    ws = make_workspace(tmp_path, trained_run)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # transformers reads the exported folder, never the hub
    ran = {}
    for b in blocks:
        ran[b.where] = run_block(b, ws)
    assert list(ran) == [b.where for b in blocks]  # every unmarked block ran
    with capsys.disabled():
        print(f"\n{doc.name}: " + "; ".join(f"{w}: {len(c)} command(s)" for w, c in ran.items()))
    # everything the examples wrote is ignored by git
    made = sorted(p.name + ("/" if p.is_dir() else "") for p in ws.iterdir() if p.name not in WORKSPACE_INPUTS)
    assert [m for m in made if not git_ignored(m)] == []


def test_default_outputs_are_git_ignored():
    """Each command's and script's default output (an `--out`/`--output` default, the train command's run
    directory) is in .gitignore, and so is what the README's own commands write."""
    from yxanul_jax.core.config import load_config
    from yxanul_jax.train import default_run_dir

    pattern = re.compile(r"add_argument\(\s*\"--(?:out|output|out-dir|json-out)\"[^)]*?default=\"([^\"]+)\"", re.S)
    defaults = {}
    for source in [*sorted((REPO / "scripts").glob("*.py")), *sorted((REPO / "yxanul_jax").glob("*.py"))]:
        for value in pattern.findall(source.read_text(encoding="utf-8")):
            defaults[value] = source.name
    assert {"runs.png", "bench", "predicted", "profile"} <= set(defaults), defaults  # the scan finds them
    cfg = load_config(TINY)
    defaults[default_run_dir(cfg, TINY)] = "train.py"
    defaults[default_run_dir(load_config(TINY, ["model.d_model=256"]), TINY)] = "train.py (a changed model)"
    defaults.update({"hf/tiny": "README (export)", "prepared": "README (prepare)"})
    not_ignored = [f"{path} ({source})" for path, source in defaults.items()
                   if not (git_ignored(path) or git_ignored(path + "/"))]
    assert not_ignored == []
    assert not git_ignored("yxanul_jax/train.py") and not git_ignored("docs/README.md")  # not everything


def _readme_numbers():
    spec = importlib.util.spec_from_file_location("readme_numbers", REPO / "scripts" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readmes_numbers_are_the_latest_measurement():
    """The README's demo loss and time and the suite's size and time are what scripts/readme_numbers.py last
    measured (docs/bench/readme_numbers.json), word for word: a number edited by hand, or a measurement not
    copied in (`--write-readme`), fails here."""
    import os

    numbers = _readme_numbers()
    record = __import__("json").loads(numbers.RECORD.read_text())
    measuring = set(filter(None, os.environ.get(numbers.MEASURING, "").split(",")))  # this very run's numbers
    assert set(numbers.PARTS) - measuring <= set(record)  # every part measured, each with its machine and date
    for part in set(record) & set(numbers.PARTS):
        assert record[part]["machine"] and re.fullmatch(r"\d{4}-\d\d-\d\d", record[part]["date"])
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert numbers.readme_mismatches(readme, record) == []
    if "demo" not in measuring:  # and the check bites: one changed digit is found
        demo = numbers.render("demo", record["demo"])
        altered = readme.replace(demo, demo.replace(f"{record['demo']['unigram']:.2f}", "9.99"))
        assert altered != readme and numbers.readme_mismatches(altered, record)


def test_the_dev_install_is_one_script_with_torchs_cpu_build():
    """The README's test command and CI install through the same script, and what it installed here is torch's
    CPU build (issue 28: `.[dev]` alone pulled a CUDA build of several GB onto CPU machines)."""
    torch = pytest.importorskip("torch", reason="the dev install brings torch; this environment lacks it")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "bash scripts/install_dev.sh && python -m pytest -q" in readme
    assert "bash scripts/install_dev.sh" in (REPO / ".ci" / "run").read_text()
    script = (REPO / "scripts" / "install_dev.sh").read_text()
    assert "download.pytorch.org/whl/cpu" in script and '-e ".[dev]"' in script
    assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
