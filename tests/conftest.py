"""Shared test setup: CPU only, deterministic, and the tiny configs the suite runs on."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite checks what the code computes, not how fast XLA:CPU's generated code runs: LLVM at -O0
# leaves every HLO pass as it is and compiles the tiny steps about a fifth faster (test_steps.py: 43 s
# -> 34 s, 2-core box, 2026-11-21). The sm_90 compiles run with XLA's flags as a user has them
# (`gpu_env`), and so do the benchmarks.
CPU_TEST_XLA_FLAG = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_TEST_XLA_FLAG}".strip()

import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import jax  # noqa: E402

from yxanul_jax.core.config import Config, FP8Config, ModelConfig  # noqa: E402

# nanodo's habit: implicit rank promotion (broadcasting a [D] against a [B, L, D] without saying so)
# is an error in every test, so shape mistakes cannot hide behind numpy's broadcasting rules.
jax.config.update("jax_numpy_rank_promotion", "raise")


def _session_dir(tmp_path_factory) -> Path:
    """A folder every xdist worker of this pytest session shares (the workers' common temp parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def shared_caches(tmp_path_factory):
    """One cache root (the demo corpora, built once under a lock) and one persistent XLA compilation
    cache for the whole session: both xdist workers and every subprocess they start (through the
    environment) reuse each other's corpora and compiled tiny-model steps, most of the suite's time on
    2 cores. `train()` keeps a compilation cache directory configured this way. Tests that need a cache
    of their own (corpus building, a faulty disk) set `YXANUL_CACHE` themselves."""
    shared = _session_dir(tmp_path_factory)
    (shared / "cache").mkdir(exist_ok=True)
    (shared / "xla-cache").mkdir(exist_ok=True)
    os.environ["YXANUL_CACHE"] = str(shared / "cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(shared / "xla-cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    jax.config.update("jax_compilation_cache_dir", str(shared / "xla-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield shared


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with the reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared (real data and tokenizers) sits beside the checkout only in CI "
                    "and developer workspaces")
    return path


GPU_PYTHON = Path(os.environ.get("YXANUL_GPU_CHECK_PYTHON", REPO / ".venv-gpu-check" / "bin" / "python"))


def gpu_python() -> str:
    """The gpu-check environment's Python (scripts/gpu_check_env.sh; CI builds it), or skip saying how to get it."""
    if not GPU_PYTHON.exists():
        pytest.skip(f"no gpu-check environment at {GPU_PYTHON}: build it with scripts/gpu_check_env.sh "
                    "(CI does) to compile for sm_90 here")
    return str(GPU_PYTHON)


def gpu_env() -> dict:
    """The environment of a compile for sm_90 in the gpu-check venv: JAX on the CPU platform (no driver
    here) and XLA's flags without the suite's CPU-only -O0."""
    flags = os.environ.get("XLA_FLAGS", "").replace(CPU_TEST_XLA_FLAG, "").strip()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", **({"XLA_FLAGS": flags} if flags else {})}


# configs/yxanul_197m.yaml compiles its 28 layers without a loop (model.scan_unroll: 28), about a minute per sm_90
# compile on CI's 2 cores; the sm_90 tests about other things compile it with its loop over the layers, and
# test_gpu_target checks the unrolled step on an 8-layer cut of it.
LAYER_LOOP = "model.scan_unroll=1"


def inspect_h100(*args: str, expect_rc: int = 0) -> dict:
    """`analyze --target h100 --json ARGS` in the gpu-check environment: its JSON report."""
    import json
    import subprocess

    proc = subprocess.run([gpu_python(), "-m", "yxanul_jax.analyze", "--target", "h100", "--json", *args],
                          capture_output=True, text=True, cwd=REPO, env=gpu_env(), timeout=600)
    assert proc.returncode == expect_rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def micro_model(**overrides) -> ModelConfig:
    """A very small float32 model for numerics tests (fast to compile, exact comparisons). Every GEMM
    is a multiple of 16 (FP8-capable, the head too), and the 97-entry vocabulary is padded to 112."""
    base = dict(name="micro", vocab_size=97, vocab_pad_to=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                ffn_dim=64, embed_rank=16, head="tied", dtype="float32", max_position=256)
    base.update(overrides)
    return ModelConfig(**base)


def no_fp8() -> FP8Config:
    return FP8Config(enabled=False)


def micro_config(**model_overrides) -> Config:
    return dataclasses.replace(Config(), model=micro_model(**model_overrides))


TRAINED_RUN = ["model.vocab_size=512", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
               "model.ffn_dim=128", "model.embed_rank=16", "curriculum=[{start_step: 0, seq_len: 32, batch_size: 8}]",
               "train.steps=6", "eval.interval=0", "eval.max_batches=1", "eval.batch_size=4",
               "checkpoint.interval=0", "checkpoint.async_save=false", "optim.warmup_steps=2",
               "train.sample_tokens=0"]  # the end-of-run sample compiles a decoder: tested once, in test_train


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, shared_caches):
    """A run directory with a tiny model trained for 6 steps (FP8 on, demo corpus) by `train()`, built
    once per session (the first worker to need it trains, under a lock). Tests copy it before writing."""
    import fcntl

    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.loop import fit

    run_dir = shared_caches / "trained-run"
    with open(shared_caches / "trained-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared_caches / "trained-run.done").exists():
            fit(load_config(None, TRAINED_RUN), str(run_dir))
            (shared_caches / "trained-run.done").touch()
    return run_dir


def load_script(name: str):
    """Import `scripts/<name>.py` as a module (scripts are not a package; their siblings import too)."""
    import importlib.util
    import sys

    scripts = str(REPO / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stop_after(n: int):
    """A train-loop hook that saves and stops after step `n`, as a signal would (a resume test's first half)."""
    from yxanul_jax.training.hooks import Hook

    class StopAfter(Hook):
        def stop_reason(self, loop, done: int):
            return "a test stop" if done == n else None

    return StopAfter()
