"""`python -m yxanul_jax.evaluate`: downstream evaluation of a trained model with EleutherAI's lm-eval-harness.

    python -m yxanul_jax.evaluate --run-dir runs/tiny --heldout val.parquet --limit 64
    python -m yxanul_jax.evaluate --run-dir runs/tiny --tasks hellaswag,arc_easy --num-fewshot 0 --output eval.json
    python -m yxanul_jax.evaluate --checkpoint runs/tiny/checkpoints/300 --include-path my_tasks/ --tasks my_task

The run's latest checkpoint (or `--checkpoint`) is exported to a temporary Hugging Face Llama folder with
`inference.hf_export` (float32 by default) and handed to lm-eval's `simple_evaluate` (model "hf", on CUDA when
torch sees a GPU, else the CPU); the folder is deleted afterwards. Tasks are lm-eval's built-in ones (their
datasets must be in the Hugging Face cache when HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set, or when the Hub
cannot be reached: then they are looked for offline, not retried for a minute), YAML tasks
of `--include-path` folders, and `yxanul_heldout`: perplexity (word, byte, bits per byte) of your own held-out
text, `--heldout` (parquet / .jsonl[.gz] / .txt[.gz], read like `prepare`'s inputs: `--text-column`,
`--bad-utf8`, paragraphs of .txt). Prints lm-eval's table and a final JSON line; `--output F.json` keeps lm-eval's
results (with `--log-samples`, each document's scores too). Needs the `lm-eval` extra: pip install -e ".[lm-eval]".
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import yaml

from yxanul_jax.core import console
from yxanul_jax.core.args import ArgumentParser, Ranged, cli_entry, user_path
from yxanul_jax.core.coerce import yaml_problem
from yxanul_jax.core.environ import attributes
from yxanul_jax.core.errors import UserError, one_line
from yxanul_jax.core.rundir import atomic_write, cache_root, check_new_output
from yxanul_jax.data.sources import TEXT_COLUMN, DocumentSource
from yxanul_jax.inference.hf_export import DTYPES, export
from yxanul_jax.inference.trained import add_source_args, load_trained

HELDOUT_TASK = "yxanul_heldout"
INSTALL = 'pip install -e ".[lm-eval]"'


def heldout_task(jsonl: str, cache_dir: str) -> dict:
    """lm-eval's task config of `yxanul_heldout`: the rolling log-likelihood of each document of a JSON-lines
    file with a `text` field (each scored whole, its first token after the BOS/EOS token, in windows of the
    model's context), reported as word and byte perplexity and bits per byte. `datasets` keeps its copy of
    the file in `cache_dir`."""
    return {"task": HELDOUT_TASK, "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": jsonl}, "cache_dir": cache_dir},
            "output_type": "loglikelihood_rolling", "test_split": "test", "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": m, "aggregation": a, "higher_is_better": False} for m, a in (
                ("word_perplexity", "weighted_perplexity"), ("byte_perplexity", "weighted_perplexity"),
                ("bits_per_byte", "bits_per_byte"))],
            "metadata": {"version": 1.0}}


def write_heldout(path: str, text_column: str | None, limit: int | None, tasks_dir: str,
                  bad_utf8: str = "fail") -> int:
    """Write the `yxanul_heldout` task into `tasks_dir`: its YAML there, its documents (the first `limit`
    of `path`'s, their text in `text_column`; None: no --text-column given, the default one; text that is no UTF-8
    refused or, with `bad_utf8="replace"`, replaced with U+FFFD and counted) as JSON lines in
    the cache (`core.rundir.cache_root()`), at a path named by their hash, so that the `datasets` copy of an
    earlier evaluation of the same text is reused. Returns the number of documents."""
    source = DocumentSource([path], text_column=TEXT_COLUMN if text_column is None else text_column,
                            fix="pass --text-column naming the column that holds the held-out text",
                            bad_utf8=bad_utf8, flag="--heldout")
    source.refuse_text_option(None if text_column is None else "--text-column")
    docs: list[str] = []
    for batch in source.batches():
        docs.extend(batch)
        if limit is not None and len(docs) >= limit:
            break
    docs = docs[:limit] if limit is not None else docs
    if source.replaced_utf8:
        console.warn(f"replaced {source.replaced_utf8} invalid UTF-8 sequences of --heldout with U+FFFD "
                     "(--bad-utf8 replace)")
    if not docs:
        raise UserError(f"--heldout '{path}' holds no text; pass a file with documents")
    body = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)
    cache = cache_root() / "lm_eval"
    jsonl = cache / f"heldout-{hashlib.sha256(body.encode()).hexdigest()[:16]}.jsonl"
    if not jsonl.exists():
        atomic_write(str(jsonl), body)
    with open(os.path.join(tasks_dir, f"{HELDOUT_TASK}.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(heldout_task(str(jsonl), str(cache / "datasets")), fh, sort_keys=False)
    return len(docs)


def _import_lm_eval():
    """lm-eval and what its "hf" model needs (torch, transformers, accelerate), or one line naming the extra."""
    try:
        import accelerate  # noqa: F401
        import lm_eval
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise UserError(f"evaluation needs lm-eval, torch, transformers and accelerate ({one_line(e)}); "
                        f"install the lm-eval extra: {INSTALL}")
    return lm_eval


class _AnyTagLoader(yaml.SafeLoader):
    """YAML's own syntax, with lm-eval's tags (`!function utils.process_docs`) read as nothing."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def unparsed_task_files(folders: list[str]) -> list[str]:
    """`'FILE' (why)` of each task file under `folders` (lm-eval reads `**/*.yaml`) that is not valid YAML: lm-eval
    skips such a file, saying so only in its debug log, so its task is then only "unknown"."""
    bad = []
    for folder in folders:
        for path in sorted(Path(folder).glob("**/*.yaml")):
            try:
                with open(path, encoding="utf-8") as fh:
                    yaml.load(fh, Loader=_AnyTagLoader)
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
                bad.append(f"'{path}' ({yaml_problem(e)})")
    return bad


def own_tasks(manager, include_paths: list[str], tasks: list[str]) -> list[str]:
    """Those of `tasks` (tasks, groups or tags) that lm-eval's index has from a file under `include_paths`."""
    roots = [Path(p).resolve() for p in include_paths]
    own = []
    for name in tasks:
        entry = manager.task_index.get(name)
        where = getattr(entry, "yaml_path", None)
        if where is not None and any(Path(where).resolve().is_relative_to(root) for root in roots):
            own.append(name)
    return own


def _raised_building_a_task(e: BaseException) -> bool:
    """Whether `e` came through the code that builds a task's documents and prompts (lm-eval's task API, its
    templates, `datasets` loading the task's data), rather than through the model or our own code."""
    files = [frame.f_code.co_filename.replace(os.sep, "/") for frame, _ in traceback.walk_tb(e.__traceback__)]
    return any(part in f for f in files for part in ("/lm_eval/api/task.py", "/lm_eval/tasks/", "/jinja2/",
                                                      "/datasets/"))


def _failing_task(e: BaseException) -> str | None:
    """The name of the lm-eval task whose own code `e` came through last (a `Task` method's `self.config.task`),
    or None."""
    name = None
    for frame, _ in traceback.walk_tb(e.__traceback__):
        task = getattr(getattr(frame.f_locals.get("self"), "config", None), "task", None)
        if isinstance(task, str):
            name = task
    return name


def task_manager(include_paths: list[str], tasks: list[str]):
    """lm-eval's TaskManager over `include_paths` and, unless they hold every task asked for, its built-in
    tasks (indexing those takes seconds); UserError naming close names for a task it does not know."""
    from lm_eval.tasks import TaskManager

    manager = None
    if include_paths:
        manager = TaskManager(include_path=include_paths, include_defaults=False)
        if not all(t in manager.all_tasks for t in tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=include_paths or None)
    for name in tasks:
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
            hint = f" (close names: {', '.join(close)})" if close else ""
            unparsed = unparsed_task_files(include_paths)
            if unparsed:
                hint += f"; lm-eval skipped {unparsed[0]}, which is not valid YAML: fix it"
            raise UserError(f"unknown lm-eval task '{name}'{hint}; pass one of lm-eval's tasks (lm-eval ls tasks), "
                            f"a task of an --include-path folder, or --heldout FILE for {HELDOUT_TASK}")
    return manager


HUB_PROBE_S = 3.0  # how long the Hub's host may take to accept a connection before evaluate works offline


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be reached from here (its host unknown, refusing, or silent for
    `HUB_PROBE_S` at its first address), or None: it can, offline mode is on already (HF_HUB_OFFLINE,
    HF_DATASETS_OFFLINE), or a proxy for the Hub's scheme stands between (not probed)."""
    import urllib.parse
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES:
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    proxies = urllib.request.getproxies()
    if (proxies.get(url.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(url.hostname):
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            url.hostname, url.port or (443 if url.scheme == "https" else 80), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.settimeout(HUB_PROBE_S)
            probe.connect(address)
    except OSError as e:
        return f"{url.hostname} could not be reached ({type(e).__name__}: {one_line(e, 100)})"
    return None


@contextlib.contextmanager
def offline_when_unreachable(fetching: list[str]):
    """Inside: the Hugging Face libraries offline (cached datasets only) when some of the tasks `fetching` (the
    built-in ones: their datasets are on the Hub) are asked and the Hub cannot be reached, so a dataset that is not
    cached fails at once (online, huggingface_hub retried each request for ~40 s and logged two dozen warnings
    first). Yields why, or None (online as configured). A task of one's own may read a URL elsewhere, which
    offline mode would refuse: with one among the tasks, this stays online. Put back after, for a caller that
    goes on in this process."""
    why = hub_unreachable() if fetching else None
    if why is None:
        yield None
        return
    import datasets.config  # imported here, so that what it reads at import is what is put back
    from huggingface_hub import constants

    with attributes(constants, HF_HUB_OFFLINE=True), \
            attributes(datasets.config, HF_HUB_OFFLINE=True, HF_DATASETS_OFFLINE=True):
        yield why


@contextlib.contextmanager
def git_hash_quietly():
    """lm-eval records the working directory's commit by running `git describe` with its stderr open, so outside a
    git checkout the command printed "fatal: not a git repository" amid its output. Inside: the same lookup (and
    the same fallback) with git's stderr closed; lm-eval's own function put back after."""
    import lm_eval.evaluator as evaluator

    if not hasattr(evaluator, "get_git_commit_hash"):  # another lm-eval: nothing to quieten
        yield
        return
    from lm_eval.loggers.utils import get_commit_from_path

    def commit_hash():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError):  # not a checkout, or no git
            return get_commit_from_path(os.getcwd())

    with attributes(evaluator, get_git_commit_hash=commit_hash):
        yield


def context_length(cfg, asked: int | None, heldout: bool) -> int:
    """The context lm-eval gives the model (its `max_length`: the window of a rolling perplexity, the longest
    prompt and answer): `asked`, else model.max_position. UserError past model.max_position. With `heldout` and a
    window longer than any row the run trained on (its curriculum's largest seq_len) a note says so: a perplexity
    over windows the model never saw filled comes out worse than the run's own validation loss of that text."""
    trained = max(s.seq_len for s in cfg.curriculum)
    if asked is not None and asked > cfg.model.max_position:
        raise UserError(f"--max-length {asked} is longer than the model's model.max_position "
                        f"{cfg.model.max_position}; pass at most that (it trained on rows of up to {trained})")
    window = cfg.model.max_position if asked is None else asked
    if heldout and window > trained:
        rows = cfg.eval.seq_len or cfg.curriculum[-1].seq_len  # the rows its final validation read
        console.note(f"{HELDOUT_TASK} scores windows of {window} tokens, longer than any row the run trained on "
                     f"({trained}); --max-length {rows} scores it in the rows of the run's final validation (in "
                     "a call of its own: the length holds for every task)")
    return window


def _batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"--batch-size must be a positive integer or 'auto', got {text!r}")
    return value


def check_device(device: str, torch) -> str:
    """`device` when lm-eval's "hf" model runs on it as asked (cpu, cuda, cuda:N of a GPU torch sees, mps on a Mac
    that has it); UserError otherwise, where lm-eval would quietly run on another device."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = getattr(torch.backends, "mps", None)
    valid = ["cpu", *(["cuda", *(f"cuda:{i}" for i in range(gpus))] if gpus else []),
             *(["mps", "mps:0"] if mps is not None and mps.is_available() else [])]
    if device not in valid:
        seen = ("torch sees no CUDA GPU here" if device.startswith("cuda") and not gpus
                else f"'{device}' is not a device lm-eval can run on here")
        raise UserError(f"--device {device}: {seen}; pass one of {', '.join(valid)}")
    return device


def run(args) -> dict:
    """Evaluate as the command line says; returns lm-eval's results dict (plus "yxanul": what was evaluated)."""
    lm_eval = _import_lm_eval()
    import jinja2  # lm-eval's templates
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # nothing before a dataset's one-line error

    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if args.heldout and HELDOUT_TASK not in tasks:
        tasks.append(HELDOUT_TASK)
    if not tasks:
        raise UserError(f"no task to run; pass --tasks NAME[,NAME...] and/or --heldout FILE ({HELDOUT_TASK})")
    if HELDOUT_TASK in tasks and not args.heldout:
        raise UserError(f"task {HELDOUT_TASK} scores your own text: pass --heldout FILE (parquet, jsonl or txt)")
    for flag, given in (("--text-column", args.text_column is not None), ("--bad-utf8", args.bad_utf8 != "fail")):
        if given and not args.heldout:
            raise UserError(f"{flag} reads --heldout's text, and no --heldout is given; drop {flag}")
    if args.heldout and args.num_fewshot:
        raise UserError(f"--num-fewshot {args.num_fewshot} applies to every task, and {HELDOUT_TASK}'s perplexity "
                        "takes no examples; evaluate --heldout in a call of its own (or pass --num-fewshot 0)")
    batch_size = _batch_size(args.batch_size)
    device = check_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), torch)
    for folder in args.include_path:
        if not os.path.isdir(folder):
            raise UserError(f"--include-path '{folder}' is not a folder; pass a folder of lm-eval task YAML files")
    if args.output is not None:  # a file: an empty folder there is refused too, before the evaluation
        check_new_output(args.output, "results are never overwritten", file=True)
    with tempfile.TemporaryDirectory(prefix="yxanul-evaluate-") as tmp:
        include = [os.path.abspath(p) for p in args.include_path]
        docs = None
        if args.heldout:
            tasks_dir = os.path.join(tmp, "tasks")
            os.mkdir(tasks_dir)
            docs = write_heldout(args.heldout, args.text_column, args.limit, tasks_dir, args.bad_utf8)
            include.append(tasks_dir)
        manager = task_manager(include, tasks)  # unknown tasks end here, before the restore and the export
        trained = load_trained(args.run_dir, args.checkpoint)
        max_length = context_length(trained.cfg, args.max_length, bool(args.heldout))
        summary = export(trained, os.path.join(tmp, "hf"), args.dtype)
        own = own_tasks(manager, args.include_path, tasks)  # --include-path's: their data may be any URL
        fetching = [] if own else [t for t in tasks if t != HELDOUT_TASK]  # built-in tasks: datasets on the Hub
        with offline_when_unreachable(fetching) as offline, git_hash_quietly():
            try:
                results = lm_eval.simple_evaluate(
                    model="hf", model_args={"pretrained": summary["output"], "dtype": args.dtype,
                                            "max_length": max_length},
                    tasks=tasks, num_fewshot=args.num_fewshot, batch_size=batch_size, device=device,
                    limit=args.limit, task_manager=manager, log_samples=args.log_samples, random_seed=args.seed,
                    numpy_random_seed=args.seed, torch_random_seed=args.seed, fewshot_random_seed=args.seed)
            except AssertionError as e:  # lm-eval's checks of a task against the context: an answer or a
                if args.max_length is None:  # generation longer than --max-length
                    raise
                why = one_line(e, 200) or "an answer longer than that"
                print(file=sys.stderr)  # lm-eval's progress bar of that task's requests ends its line first
                raise UserError(f"lm-eval refused --max-length {args.max_length} for a task ({why}); pass a larger "
                                "--max-length, or evaluate --heldout in a call of its own") from None
            except ConnectionError as e:  # datasets' and huggingface_hub's offline / unreachable-hub errors
                why = f"; {offline}, so it was looked for in the cache alone" if offline else ""
                raise UserError(f"a task's dataset could not be fetched ({one_line(e, 300)}){why}; download it once "
                                "with network access (it is cached in $HF_HOME) or pass --include-path with local "
                                "task data") from None
            except (LookupError, ValueError, TypeError, FileNotFoundError, jinja2.TemplateError) as e:
                # a task of the user's own (--include-path) that lm-eval cannot build: a template naming a field
                # the documents lack, a split or output type that is not there, a data file that is missing
                if not own or not _raised_building_a_task(e):
                    raise
                asked = [t for t in tasks if t != HELDOUT_TASK]
                failing = _failing_task(e)
                if failing not in own:  # no task in lm-eval's frames: the one asked for, when it is the only one
                    failing = own[0] if own == asked and len(own) == 1 else None
                which = f"task {failing}" if failing else f"one of tasks {', '.join(asked)}"
                print(file=sys.stderr)  # a progress bar may be mid-line
                raise UserError(f"lm-eval could not build {which} ({type(e).__name__}: {one_line(e, 200)}); fix "
                                "that task's YAML (its templates' fields, split names, output type and data files)"
                                ) from None
    results["yxanul"] = {"run_dir": args.run_dir, "checkpoint": args.checkpoint, "step": trained.step,
                         "dtype": args.dtype, "device": device, "tasks": tasks, "limit": args.limit,
                         "num_fewshot": args.num_fewshot, "max_length": max_length, "heldout": args.heldout,
                         "heldout_documents": docs}
    return results


def scores(results: dict) -> dict:
    """{task: {metric: value}} of lm-eval's results (its "metric,filter" keys, standard errors left out)."""
    out = {}
    for task, metrics in results["results"].items():
        row = {}
        for key, value in metrics.items():
            name, _, _ = key.partition(",")
            if name != "alias" and not name.endswith("_stderr") and isinstance(value, (int, float)):
                row[name] = value if math.isfinite(value) else None
        out[task] = row
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m yxanul_jax.evaluate", description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--tasks", default=None, help="lm-eval task names, comma-separated (built-in or --include-path)")
    p.add_argument("--include-path", action="append", default=[], type=user_path, metavar="DIR",
                   help="a folder of lm-eval task YAML files (repeatable)")
    p.add_argument("--heldout", default=None, type=user_path, metavar="FILE",
                   help=f"text to score as task {HELDOUT_TASK}: parquet, .jsonl[.gz] or .txt[.gz] (paragraphs)")
    p.add_argument("--text-column", default=None,
                   help=f"--heldout's text column (parquet / jsonl; default {TEXT_COLUMN})")
    p.add_argument("--bad-utf8", choices=("fail", "replace"), default="fail",
                   help="--heldout's invalid UTF-8: fail (default) or replace with U+FFFD and report a count")
    p.add_argument("--limit", type=Ranged(int, 1), default=None, help="at most this many documents per task")
    p.add_argument("--num-fewshot", type=Ranged(int, 0), default=None,
                   help="few-shot examples (default: each task's own)")
    p.add_argument("--max-length", type=Ranged(int, 1), default=None,
                   help="context in tokens: the perplexity's window, the longest prompt (default model.max_position)")
    p.add_argument("--batch-size", default="8", help="a number, or 'auto' (lm-eval finds the largest that fits)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="the export's and the evaluation's dtype")
    p.add_argument("--seed", type=Ranged(int, 0, 2**32 - 1, why="lm-eval seeds numpy, whose seeds are 32-bit"),
                   default=1234, help="lm-eval's seeds (few-shot sampling)")
    p.add_argument("--output", default=None, type=user_path, metavar="F.json",
                   help="new JSON file for lm-eval's results")
    p.add_argument("--log-samples", action="store_true", help="keep each document's scores in --output")
    args = p.parse_args(argv)
    import jax

    # The GPU is torch's here: JAX only restores and exports host arrays, so it stays on the CPU rather than
    # taking 75% of the GPU's memory first (its default preallocation). No effect once JAX has started.
    jax.config.update("jax_platforms", "cpu")
    if args.log_samples and args.output is None:
        raise UserError("--log-samples keeps each document's scores in the --output file; pass --output F.json")
    results = run(args)
    from lm_eval.utils import handle_non_serializable, make_table

    if args.output is not None:
        atomic_write(args.output, json.dumps(results, indent=2, default=handle_non_serializable) + "\n")
    console.info(make_table(results))
    done = results["yxanul"]
    line = {"step": done["step"], "tasks": done["tasks"], "scores": scores(results), "limit": args.limit,
            "num_fewshot": args.num_fewshot, "max_length": done["max_length"], "device": done["device"],
            "dtype": args.dtype, "output": args.output}
    console.info(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
