"""Downstream evaluation with lm-eval-harness (`yxanul_jax.evaluate`): the real harness scores the real export of
a trained run on tasks built from the shared data, offline, and its numbers are what our own model computes on
the same text; mistakes end in one error line."""
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import FP8Config
from yxanul_jax.evaluate import HELDOUT_TASK
from yxanul_jax.evaluate import main as evaluate_main
from yxanul_jax.inference.trained import load_trained
from yxanul_jax.model.transformer import Yxanul

from conftest import REPO, shared_path
from data_fixtures import run_cli, write_jsonl

pytest.importorskip("lm_eval", reason="evaluation needs the lm-eval extra (in dev): pip install -e '.[lm-eval]'")
pytest.importorskip("accelerate", reason="lm-eval's hf model needs accelerate: the lm-eval extra")

REL = 1e-4  # float32 on both sides (JAX here, torch in lm-eval), different summation orders


def _next_line_docs(text: str) -> list[dict]:
    """A multiple-choice task from real text: which of four lines follows this one (the others drawn at random)."""
    lines = [x for x in text.splitlines() if len(x) > 20]
    rng = np.random.default_rng(0)
    docs = []
    for i in range(0, 80, 8):
        choices = [lines[i + 1], *(lines[j] for j in rng.choice(np.arange(100, len(lines)), 3, replace=False))]
        order = rng.permutation(4)
        docs.append({"context": lines[i], "choices": [choices[k] for k in order], "gold": int(np.argsort(order)[0])})
    return docs


@pytest.fixture(scope="module")
def evaluated(trained_run, tmp_path_factory):
    """One offline `python -m yxanul_jax.evaluate` of the trained run on two tasks built from the shared text:
    yxanul_heldout over its first 12 paragraphs (--heldout) and a next-line multiple-choice task
    (--include-path, the recipe of docs/EVALUATION.md). A fresh process with the Hugging Face hub and
    datasets offline and an empty HF_HOME. Returns (the --output results, the final JSON line, the MC docs)."""
    text = shared_path("data", "heldout", "tinyshakespeare.txt")
    tmp = tmp_path_factory.mktemp("lm-eval")
    tasks = tmp / "tasks"
    tasks.mkdir()
    docs = _next_line_docs(text.read_text(encoding="utf-8"))
    write_jsonl(tasks / "next_line.jsonl", docs)
    (tasks / "next_line.yaml").write_text(
        "task: next_line\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tasks / 'next_line.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n")
    out = tmp / "results.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp / "hf-home")}
    args = ["--run-dir", str(trained_run), "--heldout", str(text), "--limit", "12", "--include-path", str(tasks),
            "--tasks", "next_line", "--num-fewshot", "0", "--output", str(out), "--log-samples"]
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.evaluate", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), json.loads(proc.stdout.strip().splitlines()[-1]), docs


def _our_logprobs(trained, sequences: list[list[int]]) -> list[np.ndarray]:
    """log p(token t | tokens < t) for t >= 1 of each sequence, by our float32 forward (one right-padded batch:
    causal attention leaves the real positions alone)."""
    m = dataclasses.replace(trained.cfg.model, dtype="float32")
    length = max(len(s) for s in sequences)
    ids_BxL = np.zeros((len(sequences), length), np.int32)
    for i, s in enumerate(sequences):
        ids_BxL[i, :len(s)] = s
    logits_BxLxV = Yxanul(m, FP8Config(enabled=False)).apply({"params": trained.params}, jnp.asarray(ids_BxL))
    logp_BxLxV = np.asarray(jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1))
    return [logp_BxLxV[i, np.arange(len(s) - 1), s[1:]] for i, s in enumerate(sequences)]


def _our_rolling(trained, texts: list[str], window: int) -> list[float]:
    """lm-eval's rolling log-likelihood of each text by our model: every token, the first after the BOS (= our EOS)
    token, in windows of `window` tokens, each window's new tokens scored after what precedes them in it."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tok, out = trained.tokenizer(), []
    for text in texts:
        pairs = [make_disjoint_window(w) for w in get_rolling_token_windows(
            tok.encode(text), prefix_token=tok.eos_id, max_seq_len=window, context_len=1)]
        logprobs = _our_logprobs(trained, [[*context, *scored] for context, scored in pairs])
        out.append(sum(float(lp[-len(scored):].sum()) for lp, (_, scored) in zip(logprobs, pairs)))
    return out


@pytest.mark.slow
def test_a_window_as_long_as_the_trained_rows_scores_in_windows_of_it(trained_run, tmp_path, monkeypatch, capfd):
    """--max-length 32, the run's rows (model.max_position is 4,096, and the default window names that in a note):
    the longer paragraphs are scored in several windows, each as our model scores it. Run outside a git checkout,
    where lm-eval's `git describe` printed "fatal: not a git repository" into the output."""
    text = shared_path("data", "heldout", "tinyshakespeare.txt")
    out = tmp_path / "results.json"
    args = ["--run-dir", str(trained_run), "--heldout", str(text), "--limit", "10", "--output", str(out),
            "--log-samples"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above it either
    rc, _, err = run_cli(evaluate_main, args + ["--max-length", "32"])
    assert rc == 0 and "longer than any row" not in err, err[-2000:]
    assert "not a git repository" not in capfd.readouterr().err  # git's own stderr, a child process's
    results = json.loads(out.read_text())
    samples = results["samples"][HELDOUT_TASK]
    trained = load_trained(run_dir=str(trained_run))
    assert max(len(trained.tokenizer().encode(s["target"])) for s in samples) > 2 * 32  # several windows
    theirs = [s["resps"][0][0] for s in samples]
    np.testing.assert_allclose(theirs, _our_rolling(trained, [s["target"] for s in samples], 32), rtol=REL, atol=1e-3)


@pytest.mark.slow
def test_heldout_perplexity_is_our_models(evaluated, trained_run):
    results, line, _ = evaluated
    text = shared_path("data", "heldout", "tinyshakespeare.txt")
    samples = results["samples"][HELDOUT_TASK]
    paragraphs = text.read_text(encoding="utf-8").split("\n\n")[:12]
    assert [s["target"].strip() for s in samples] == paragraphs  # lm-eval scored the file's first 12 paragraphs
    trained = load_trained(run_dir=str(trained_run))
    assert results["yxanul"]["max_length"] == line["max_length"] == trained.cfg.model.max_position  # the default
    ours = _our_rolling(trained, [s["target"] for s in samples], line["max_length"])
    theirs = [s["resps"][0][0] for s in samples]
    np.testing.assert_allclose(theirs, ours, rtol=REL, atol=1e-3)
    nats, nbytes = -sum(ours), sum(len(s["target"].encode()) for s in samples)
    nwords = sum(len(re.split(r"\s+", s["target"])) for s in samples)
    got = results["results"][HELDOUT_TASK]
    assert got["bits_per_byte,none"] == pytest.approx(nats / nbytes / math.log(2), rel=REL)
    assert got["byte_perplexity,none"] == pytest.approx(math.exp(nats / nbytes), rel=REL)
    assert got["word_perplexity,none"] == pytest.approx(math.exp(nats / nwords), rel=REL * 10)
    assert 1 < got["bits_per_byte,none"] < 8  # a 6-step model: far from uniform over 512 tokens, far from good
    assert line["scores"][HELDOUT_TASK]["bits_per_byte"] == got["bits_per_byte,none"] and line["step"] == 6
    assert results["yxanul"]["heldout_documents"] == 12 and results["n-samples"][HELDOUT_TASK]["effective"] == 12


@pytest.mark.slow
def test_a_local_multiple_choice_task_scores_each_choice_as_our_model(evaluated, trained_run):
    """--include-path: each choice's log-likelihood is ours, and so is the accuracy."""
    results, line, docs = evaluated
    samples = results["samples"]["next_line"]
    assert [s["doc"] for s in samples] == docs
    trained = load_trained(run_dir=str(trained_run))
    tok = trained.tokenizer().tokenizer
    # lm-eval's pair: the continuation " choice" is what encoding context + " choice" adds to the context's tokens
    contexts = [len(tok.encode(d["context"]).ids) for d in docs]
    wholes = [tok.encode(d["context"] + " " + c).ids for d in docs for c in d["choices"]]
    logprobs = iter(_our_logprobs(trained, wholes))
    correct = 0
    for doc, n, sample in zip(docs, contexts, samples):
        ours = [float(next(logprobs)[n - 1:].sum()) for _ in doc["choices"]]
        theirs = [r[0] for r in sample["filtered_resps"]]
        np.testing.assert_allclose(theirs, ours, rtol=REL, atol=1e-4)
        correct += int(np.argmax(ours) == doc["gold"])
    assert results["results"]["next_line"]["acc,none"] == pytest.approx(correct / len(docs))
    assert line["scores"]["next_line"]["acc"] == pytest.approx(correct / len(docs))


def test_mistakes_end_in_one_line(trained_run, tmp_path, monkeypatch):
    text = shared_path("data", "heldout", "tinyshakespeare.txt")
    no_ckpt = tmp_path / "no-checkpoint"
    no_ckpt.mkdir()
    shutil.copy(trained_run / "config.yaml", no_ckpt / "config.yaml")
    taken = tmp_path / "taken.json"
    taken.write_text("keep me")
    run = ["--run-dir", str(trained_run)]
    cases = [
        (run + ["--tasks", "wikitxt"], "unknown lm-eval task 'wikitxt' (close names: wikitext"),
        (run + ["--tasks", HELDOUT_TASK], "pass --heldout FILE"),
        (run + ["--heldout", str(tmp_path / "nowhere.parquet")], f"--heldout '{tmp_path / 'nowhere.parquet'}' does "
                                                                 "not exist"),
        (run, "no task to run"),
        (["--run-dir", str(no_ckpt), "--heldout", str(text)], "has no checkpoint to read yet"),
        (run + ["--heldout", str(text), "--output", str(taken)], "already exists"),
        (run + ["--heldout", str(shared_path("data", "validation", "gsm8k_validation.parquet"))], "no column 'text'"),
        (run + ["--heldout", str(text), "--include-path", str(tmp_path / "nope")], "not a folder"),
        (run + ["--heldout", str(text), "--limit", "0"], "--limit 0 must be >= 1"),
        (run + ["--heldout", str(text), "--log-samples"], "pass --output"),
        (run + ["--tasks", "next_line", "--text-column", "body"], "no --heldout is given; drop --text-column"),
        (run + ["--tasks", "next_line", "--bad-utf8", "replace"], "no --heldout is given; drop --bad-utf8"),
        (run + ["--heldout", str(text), "--num-fewshot", "3"], "evaluate --heldout in a call of its own"),
        (run + ["--heldout", str(text), "--max-length", "5000"], "--max-length 5000 is longer than the model's "
                                                                  "model.max_position 4096"),
    ]
    for args, needle in cases:
        rc, _, err = run_cli(evaluate_main, args)
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (args, err[-2000:])
    assert taken.read_text() == "keep me" and not (tmp_path / "nope").exists()
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as where the extra is not installed
    rc, _, err = run_cli(evaluate_main, run + ["--heldout", str(text)])
    assert rc == 2 and err.count("error:") == 1 and 'pip install -e ".[lm-eval]"' in err, err


def test_a_device_output_or_column_it_cannot_use_is_refused_before_the_evaluation(tmp_path):
    """Checked before the model is read: the --run-dir here is no run at all, so a later check would say so.
    lm-eval runs an unknown --device quietly on another one; a .txt has no column; an empty --output wrote nothing."""
    text = tmp_path / "held.txt"
    text.write_text("a paragraph of held-out text\n\nanother one\n", encoding="utf-8")
    broken = tmp_path / "broken.txt"  # replaced, it is read and the run is the next thing refused
    broken.write_bytes(b"a paragraph\n\nbad \xff\xfe bytes\n")
    folder = tmp_path / "results"
    folder.mkdir()
    run = ["--run-dir", str(tmp_path / "no-run"), "--heldout", str(text)]
    cases = [
        (run + ["--device", "quantum"], "--device quantum: 'quantum' is not a device lm-eval can run on here"),
        (run + ["--device", "cuda:99"], "--device cuda:99"),
        (run + ["--output", ""], "--output is empty (an unset shell variable?)"),
        (run + ["--output", str(folder)], "already exists"),
        (run + ["--output", "/proc/yxanul-eval.json"], "'/proc/yxanul-eval.json'"),
        (run + ["--text-column", "foo"], "--text-column applies to .jsonl / .parquet inputs only"),
        (["--run-dir", str(tmp_path / "no-run"), "--heldout", str(broken)],
         "broken.txt' line 3 holds invalid UTF-8 at byte 4 (b'\\xff\\xfe b'); fix the file or pass --bad-utf8 replace"),
        (["--run-dir", str(tmp_path / "no-run"), "--heldout", str(broken), "--bad-utf8", "replace"], "no-run"),
    ]
    for args, needle in cases:
        rc, _, err = run_cli(evaluate_main, args)
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert rc == 2 and len(lines) == 1 and needle in lines[0] and ".tmp-" not in err, (args, err[-2000:])
    assert os.listdir(folder) == [] and not [p for p in os.listdir("/proc") if p.startswith(".yxanul")]


def test_the_default_window_names_the_trained_length_in_a_note(capsys):
    from yxanul_jax.core.config import load_config
    from yxanul_jax.evaluate import context_length

    cfg = load_config(None, ["curriculum=[{start_step: 0, seq_len: 32, batch_size: 8}]"])
    assert context_length(cfg, None, heldout=True) == cfg.model.max_position
    assert "scores windows of 4096 tokens, longer than any row the run trained on (32); --max-length 32" in \
        capsys.readouterr().err
    assert context_length(cfg, 32, heldout=True) == 32 and not capsys.readouterr().err
    assert context_length(cfg, None, heldout=False) == cfg.model.max_position and not capsys.readouterr().err


def test_a_max_length_a_task_cannot_take_is_one_line(trained_run, tmp_path):
    """lm-eval asserts that every answer fits the context: with a --max-length shorter, one error line naming it."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_jsonl(tasks / "long.jsonl", [{"context": "Once", "choices": ["upon a time there was a king " * 4, "no"],
                                        "gold": 0}])
    (tasks / "long.yaml").write_text(
        "task: long\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tasks / 'long.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n")
    rc, _, err = run_cli(evaluate_main, ["--run-dir", str(trained_run), "--include-path", str(tasks), "--tasks", "long",
                                         "--max-length", "4"])
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert rc == 2 and len(lines) == 1 and "lm-eval refused --max-length 4 for a task" in lines[0], err[-2000:]
    assert "Traceback" not in err


def test_a_task_of_ones_own_that_lm_eval_cannot_build_is_one_line_naming_it(trained_run, tmp_path):
    """Mistakes in an --include-path task's YAML: a template field the documents lack and a data file that is not
    there were tracebacks (and the file's absence got the advice to free disk space); a file that is not YAML at all,
    which lm-eval skips with a logged warning, left only "unknown task"."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_jsonl(tasks / "t.jsonl", [{"context": "Once", "choices": ["upon", "no"], "gold": 0}])

    def task(name, data, text="{{context}}"):
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{text}'\ndoc_to_choice: '{{{{choices}}}}'\n"
            "doc_to_target: '{{gold}}'\nmetric_list:\n  - metric: acc\n")

    task("typo", tasks / "t.jsonl", text="{{contxt}}")
    task("gone", tasks / "missing.jsonl")
    task("fine", tasks / "t.jsonl")
    (tasks / "broken.yaml").write_text("task: [broken\n")
    run = ["--run-dir", str(trained_run), "--include-path", str(tasks), "--tasks"]
    for name, needle in (("typo", "UndefinedError: 'contxt' is undefined"), ("gone", "missing.jsonl"),
                         ("typo", "UndefinedError")):  # the last beside a task that builds: only the failing one named
        rc, _, err = run_cli(evaluate_main, [*run, name if needle != "UndefinedError" else "fine,typo"])
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert rc == 2 and len(lines) == 1 and f"lm-eval could not build task {name} (" in lines[0] \
            and needle in lines[0] and "fix that task's YAML" in lines[0] and "Traceback" not in err, err[-3000:]
    rc, _, err = run_cli(evaluate_main, [*run, "broken"])
    assert rc == 2 and f"lm-eval skipped '{tasks / 'broken.yaml'}' (expected ',' or ']', but got '<stream end>' (line " \
        "2, column 1)), which is not valid YAML: fix it" in err, err


def test_heldout_text_that_is_no_utf8_is_replaced_and_counted_when_asked(tmp_path, monkeypatch, capsys):
    from yxanul_jax.evaluate import write_heldout

    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"a paragraph\n\nbad \xff\xfe\xfd bytes\n")  # 3: a warning another test has not given
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    assert write_heldout(str(broken), None, None, str(tasks), bad_utf8="replace") == 2
    assert "replaced 3 invalid UTF-8 sequences of --heldout with U+FFFD" in capsys.readouterr().err
    (task,) = tasks.iterdir()
    import yaml

    jsonl = yaml.safe_load(task.read_text())["dataset_kwargs"]["data_files"]["test"]
    with open(jsonl, encoding="utf-8") as fh:
        assert [json.loads(line)["text"] for line in fh] == ["a paragraph\n", "bad \ufffd\ufffd\ufffd bytes\n"]


UNREACHABLE_HUB = "https://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def test_a_built_in_task_with_no_hub_is_one_line_at_once(trained_run, tmp_path):
    # a dataset not in the cache, no network: huggingface_hub retried each request for ~40 s and logged two dozen
    # warning lines before the error; the Hub is now probed first and the datasets looked for offline
    kept = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    env = {**kept, "HF_HOME": str(tmp_path / "hf-home"), "HF_ENDPOINT": UNREACHABLE_HUB}
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.evaluate", "--run-dir", str(trained_run), "--tasks",
                           "arc_easy", "--limit", "2"], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: a task's dataset could not be fetched (") and (
        "127.0.0.1 could not be reached (ConnectionRefusedError: " in proc.stderr), proc.stderr


def test_the_offline_switch_is_put_back_for_a_caller_that_goes_on(monkeypatch):
    import datasets.config
    from huggingface_hub import constants

    from yxanul_jax.evaluate import offline_when_unreachable

    for k in [k for k in os.environ if k.upper() in ("HF_DATASETS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                                     "NO_PROXY")]:
        monkeypatch.delenv(k)  # no proxy to skip the probe for, no offline mode set
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)  # what HF_ENDPOINT set before the import does
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    with offline_when_unreachable([]) as why:  # no built-in task (one's own text or tasks): no probe, online
        assert why is None and not constants.HF_HUB_OFFLINE
    with offline_when_unreachable(["arc_easy"]) as why:
        assert why.startswith("127.0.0.1 could not be reached (ConnectionRefusedError")
        assert constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE and datasets.config.HF_DATASETS_OFFLINE
    assert not (constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the Hub is https: a proxy of http alone is no reason
    monkeypatch.setenv("NO_PROXY", "localhost")  # nor is a list of hosts to reach without one
    with offline_when_unreachable(["arc_easy"]) as why:
        assert why is not None
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # behind a proxy: not probed, online as configured
    with offline_when_unreachable(["arc_easy"]) as why:
        assert why is None and not constants.HF_HUB_OFFLINE
