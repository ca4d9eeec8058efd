"""KV-cache decoding: equal to recomputing the whole prefix, batched prompts of different lengths equal to
one at a time, sampling filters, and the user errors."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import FP8Config
from yxanul_jax.core.errors import UserError
from yxanul_jax.inference.sampling import describe, filter_logits, generate, sample
from yxanul_jax.model.transformer import Yxanul, init_variables

from conftest import micro_model

OFF = FP8Config(enabled=False)


def _greedy_by_recomputing(m, variables, prompt, n):
    """Greedy tokens by running the whole sequence again for every new token (no cache). The buffer has
    one fixed length (one compile); the tail beyond the tokens so far cannot reach them (causality)."""
    forward = jax.jit(Yxanul(m, OFF).apply)
    buf = np.zeros((1, len(prompt) + n), np.int32)
    buf[0, :len(prompt)] = prompt
    for t in range(len(prompt), len(prompt) + n):
        buf[0, t] = int(jnp.argmax(forward(variables, jnp.asarray(buf))[0, t - 1]))
    return buf[0, len(prompt):].tolist()


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_cached_greedy_decoding_equals_recomputing_the_prefix(scan):
    m = micro_model(scan_layers=scan, remat="full" if scan else "none")
    variables = init_variables(m, OFF, jax.random.key(0))
    prompt = [5, 17, 3, 60, 2, 9, 41]
    want = _greedy_by_recomputing(m, variables, prompt, 12)
    got = generate(m, OFF, variables, [prompt], 12)["tokens"][0]
    assert got == want


def test_batched_prompts_of_different_lengths_equal_one_at_a_time():
    m = micro_model()
    variables = init_variables(m, OFF, jax.random.key(1))
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13, 14], [42]]
    together = generate(m, OFF, variables, prompts, 8)["tokens"]
    alone = [generate(m, OFF, variables, [p], 8)["tokens"][0] for p in prompts]
    assert together == alone
    # sampling again at shapes seen before compiles nothing: the executables are kept across calls
    from yxanul_jax.inference.sampling import _programs

    compiled = dict(_programs(m, OFF).executables)
    again, compiles, _ = _with_compiles(lambda: generate(m, OFF, variables, prompts, 8))
    assert again["tokens"] == together
    assert _programs(m, OFF).executables == compiled and compiles == [], compiles


def _with_compiles(fn):
    """(fn()'s result, the end times of the XLA compiles it ran (JAX's backend-compile events, time.time()), the
    time.time() it returned at)."""
    import time

    from jax._src.dispatch import BACKEND_COMPILE_EVENT  # no public name for the event in jax 0.10

    ends = []

    def listen(event, start, end, **_):
        if event == BACKEND_COMPILE_EVENT:
            ends.append(end)
    jax.monitoring.register_event_time_span_listener(listen)
    try:
        result = fn()
        return result, ends, time.time()
    finally:
        jax.monitoring.unregister_event_time_span_listener(listen)


def test_speeds_are_measured_after_compilation():
    # A model of shapes nothing else compiled: the first call compiles the prefill, the one-token step and the sampler
    # before its clocks start, and reports that time apart. Read from JAX's own compile events, not from how long
    # anything took: every compile of a call ends before its timed part (the last prefill_s + decode_s of the call)
    # begins, and a call at shapes compiled before compiles nothing.
    m = micro_model(n_layers=3, d_model=48, n_heads=3, n_kv_heads=1, ffn_dim=96)
    variables = init_variables(m, OFF, jax.random.key(3))
    prompts = [[4, 5, 6, 7], [8, 9]]

    def call(ps):
        return _with_compiles(lambda: generate(m, OFF, variables, ps, 12, temperature=0.7, top_k=5))

    first, compiles, returned = call(prompts)
    assert first["prompt_tokens"] == 6 and first["new_tokens"] == 24
    assert len(compiles) >= 3, compiles  # the prefill, the one-token step and the sampler at least
    assert max(compiles) <= returned - first["prefill_s"] - first["decode_s"], (first, compiles, returned)
    second, compiles, _ = call(prompts)
    assert second["tokens"] == first["tokens"]  # the same draws: the sampler's key is split as before
    assert compiles == [], compiles  # the executables are kept
    other_length, compiles, returned = call([[1, 2, 3]])
    assert compiles and max(compiles) <= returned - other_length["prefill_s"] - other_length["decode_s"]


def test_decoding_stops_at_eos_and_runs_with_fp8_state():
    m = micro_model()
    fp8 = FP8Config(amax_history_len=4, scaling="current")
    variables = init_variables(m, fp8, jax.random.key(2))
    first = generate(m, fp8, variables, [[3, 4, 5]], 6)["tokens"][0]
    eos = first[1]
    stopped = generate(m, fp8, variables, [[3, 4, 5]], 6, eos_id=eos)["tokens"][0]
    assert stopped == first[:first.index(eos) + 1]  # EOS is kept, nothing after it


def test_sampling_filters():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
    assert np.isneginf(np.asarray(filter_logits(logits, 1.0, 2, 1.0)))[0].tolist() == [False, False, True, True]
    assert np.isneginf(np.asarray(filter_logits(logits, 1.0, 0, 0.7)))[0].tolist() == [False, False, True, True]
    assert np.isneginf(np.asarray(filter_logits(logits, 1.0, 0, 0.1)))[0].tolist() == [False, True, True, True]
    key = jax.random.key(0)
    assert int(sample(logits, key, temperature=1.0, top_k=1)[0]) == 0  # top-1 is greedy
    draws = [int(sample(logits, k, temperature=1.0)[0]) for k in jax.random.split(key, 400)]
    assert 0.4 < draws.count(0) / 400 < 0.6 and set(draws) <= {0, 1, 2, 3}
    assert int(sample(logits, key, temperature=0.0)[0]) == 0
    # a temperature near 0 is near greedy: positive logits divided by 1e-39 overflowed to +inf, then index 0 won
    spread = jnp.asarray([[1.0, 3.0, 2.0, -5.0, 2.9]], jnp.float32)
    assert {int(sample(spread, k, temperature=1e-39)[0]) for k in jax.random.split(key, 8)} == {1}


def test_the_default_sampling_in_words():
    """`sampling.describe`: what the end-of-run sample prints beside its text (the `generate` command's defaults)."""
    assert describe() == "temperature 0.8, top-k 50, top-p 0.95"
    assert describe(0.0) == "greedy" and describe(1.0, 0, 1.0) == "temperature 1"


def test_an_end_of_run_sample_that_cannot_run_says_why(trained_run, capsys):
    """An empty train.sample_prompt, or one that with train.sample_tokens overruns the context: one note each, no
    sample (both used to return without a word). Neither reaches the model, so no state is passed."""
    from yxanul_jax.inference.run_sample import print_sample
    from yxanul_jax.inference.trained import load_trained

    cfg = load_trained(run_dir=str(trained_run)).cfg
    train = cfg.train
    for changed, needle in (({"sample_prompt": ""}, "train.sample_prompt is empty"),
                            ({"sample_tokens": cfg.model.max_position}, f"exceed model.max_position "
                                                                         f"{cfg.model.max_position}; lower")):
        print_sample(dataclasses.replace(cfg, train=dataclasses.replace(train, **changed)), state=None)
        out, err = capsys.readouterr()
        assert err.startswith("end-of-run sample skipped: ") and needle in err and err.count("\n") == 1, err
        assert not out


def test_user_errors():
    m = dataclasses.replace(micro_model(), max_position=16)
    variables = init_variables(m, OFF, jax.random.key(0))
    with pytest.raises(UserError, match="prompt is empty"):
        generate(m, OFF, variables, [[1, 2], []], 4)
    with pytest.raises(UserError, match="exceeds the model's max_position"):
        generate(m, OFF, variables, [list(range(10))], 8)
    with pytest.raises(UserError, match="top-p"):
        generate(m, OFF, variables, [[1]], 2, temperature=1.0, top_p=0.0)


def _cli(*args):
    """`generate`'s CLI in this process: (exit code, stdout, stderr)."""
    from data_fixtures import run_cli
    from yxanul_jax.generate import main

    return run_cli(main, list(args))


def tok_ids(run_dir, text: str) -> list[int]:
    from yxanul_jax.data.tokenizer import load_tokenizer

    return load_tokenizer(str(run_dir / "tokenizer.json")).tokenizer.encode(text).ids


def test_cli_samples_a_trained_run_and_refuses_bad_prompts(trained_run):
    import json
    import re

    rc, stdout, stderr = _cli("--run-dir", str(trained_run), "--prompt", "def ", "--prompt", "import os\nclass ",
                              "--max-new-tokens", "8", "--num-samples", "2", "--seed", "1", "--json")
    assert rc == 0, stderr[-2000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert len(out["samples"]) == 4 and out["step"] == 6 and out["tokens_per_sec"] > 0
    # prefill and decode speeds over running time only; compile time on its own
    prompt_tokens = len(tok_ids(trained_run, "def ")) + len(tok_ids(trained_run, "import os\nclass "))
    assert out["prompt_tokens"] == 2 * prompt_tokens  # --num-samples 2
    assert out["new_tokens"] == sum(s["tokens"] for s in out["samples"])
    assert out["prefill_tokens_per_sec"] == pytest.approx(out["prompt_tokens"] / out["prefill_s"])
    assert out["decode_tokens_per_sec"] == pytest.approx(out["new_tokens"] / out["decode_s"]) == out["tokens_per_sec"]
    assert out["compile_s"] >= 0
    speed = stdout.strip().splitlines()[-2]
    assert re.fullmatch(r"prefill \d+ prompt tokens in [\d.]+ s \([\d,]+ tokens/s\); decode \d+ tokens in [\d.]+ s "
                        r"\([\d,]+ tokens/s, batch 4\); compile [\d.]+ s before them, not counted", speed), speed
    assert all(1 <= s["tokens"] <= 8 for s in out["samples"]) and "--- sample 4" in stdout
    for args, needle in ((["--prompt", ""], "prompt is empty"),
                         (["--prompt", "x", "--max-new-tokens", "5000"], "exceeds the model's max_position"),
                         ([], "give a prompt")):
        rc, _, stderr = _cli("--run-dir", str(trained_run), *args)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], stderr


def test_a_run_samples_from_its_own_folder_when_its_dataset_is_gone(trained_run, tmp_path):
    # The run keeps a copy of its tokenizer: sampling needs neither the training data nor its path.
    import shutil

    import yaml

    from yxanul_jax.inference.trained import load_trained

    run = tmp_path / "moved-run"
    shutil.copytree(trained_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["train"] = str(tmp_path / "no-longer-here")  # the prepared data was deleted or moved
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    trained = load_trained(run_dir=str(run))
    assert trained.tokenizer_path == str(run / "tokenizer.json")
    rc, stdout, stderr = _cli("--run-dir", str(run), "--prompt", "def ", "--max-new-tokens", "4")
    assert rc == 0 and "--- sample 1" in stdout, stderr[-2000:]


def test_a_run_config_edited_after_its_checkpoints_and_a_run_without_one_are_refused(trained_run, tmp_path):
    # the run's config.yaml is the model the command builds: with fewer layers than the checkpoint's, the partial
    # restore read the first layers out of it without a word (a truncated model sampled and exported)
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns(".lock"))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["n_layers"] = 1
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rc, _, stderr = _cli("--run-dir", str(run), "--prompt", "x")
    assert rc == 2 and stderr.count("\n") == 1 and "was saved with model.n_layers=2, but" in stderr and \
        f"'{run / 'config.yaml'}' says model.n_layers=1 (edited since?); put back n_layers: 2 there" in stderr, stderr
    cfg["model"]["n_layers"], cfg["fp8"]["enabled"] = 2, False  # the FP8 settings shape the state it reads too
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rc, _, stderr = _cli("--run-dir", str(run), "--prompt", "x")
    assert rc == 2 and stderr.count("\n") == 1 and "was saved with fp8.enabled=True, but" in stderr and \
        "says fp8.enabled=False (edited since?); put back enabled: True there" in stderr, stderr
    shutil.rmtree(run / "checkpoints")  # a run that has not saved yet: waiting is the fix, not another flag
    rc, _, stderr = _cli("--run-dir", str(run), "--prompt", "x")
    assert rc == 2 and stderr == f"error: '{run}' has no checkpoint to read yet (a run saves one every " \
        "checkpoint.interval steps and at its end); train it, or wait for its first save, or pass --checkpoint PATH\n", stderr


def test_prompts_and_seeds_are_checked_before_the_restore(tmp_path):
    # --run-dir names no run: each mistake below must be found first (a bytes prompt and a 2**63 seed were
    # tracebacks after the restore, an empty prompt file "a prompt is empty" after it, naming no file)
    (tmp_path / "empty.txt").write_bytes(b"\xef\xbb\xbf")  # a byte-order mark alone is empty too
    bad = b"\xff\xfe abc".decode("utf-8", "surrogateescape")  # what Python makes of argv bytes that are not UTF-8
    for args, needle in ((["--prompt", bad], "--prompt holds bytes that are not UTF-8 text"),
                         (["--prompt", "a", "--prompt-file", str(tmp_path / "empty.txt")],
                          f"--prompt-file '{tmp_path / 'empty.txt'}' is empty"),
                         (["--prompt", "a", "--seed", str(2**63)], f"--seed {2**63} must be in [0, {2**63 - 1}]")):
        rc, _, stderr = _cli("--run-dir", str(tmp_path), *args)
        assert rc == 2 and stderr.count("\n") == 1 and needle in stderr, stderr


@pytest.mark.parametrize("content", [b"model: {d_model: [oops\n", b"\xff\xfe bad\n", b"- 1\n"],
                         ids=["bad-yaml", "not-utf8", "a-list"])
def test_a_damaged_run_config_is_one_line_naming_it(tmp_path, content):
    (tmp_path / "config.yaml").write_bytes(content)
    rc, _, stderr = _cli("--run-dir", str(tmp_path), "--prompt", "x")
    assert rc == 2 and stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert f"'{tmp_path / 'config.yaml'}'" in stderr and "Traceback" not in stderr, stderr
