"""Helpers of the multi-process tests (test_sharding, test_cluster): the tiny run, its environment, free ports."""
import json
import os
import socket
import subprocess
import sys

from conftest import REPO

# float32, no FP8, Muon's iterations in float32: the comparison across layouts is then a pure reduction-order
# question (tol 1e-5). BF16 iterations (the default) round the momentum to 8 bits, so a float32 summation-order
# difference between layouts (~1e-7) flips single roundings (~4e-3): the losses then part by ~1.4e-5 by step 20.
RUN = ["model.vocab_size=512", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
       "model.ffn_dim=128", "model.embed_rank=16", "model.dtype=float32", "fp8.enabled=false",
       "optim.muon_ns_dtype=float32",
       "curriculum.0.seq_len=32", "curriculum.0.batch_size=8", "curriculum.1.start_step=10",
       "curriculum.1.seq_len=64", "curriculum.1.batch_size=8", "train.steps=20", "train.log_every=1",
       "eval.interval=0", "eval.max_batches=2", "eval.batch_size=8", "checkpoint.interval=0",
       "checkpoint.async_save=false", "train.sample_tokens=0"]


def cpu_env(devices=1, **extra):
    """This environment on the CPU platform with `devices` virtual devices, plus `extra` variables."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **extra}
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return env


def losses(run_dir):
    """The training losses of `run_dir`'s metrics log, in order."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [r["loss"] for r in map(json.loads, fh) if "loss" in r]


def free_port(lo=0, hi=0):
    """A TCP port free on this machine now: any, or the first free one in [lo, hi)."""
    for port in (range(lo, hi) if hi else [0]):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in [{lo}, {hi})")


def train(env, *args):
    """`python -m yxanul_jax.train ARGS` to its end; it must succeed."""
    proc = subprocess.run([sys.executable, "-m", "yxanul_jax.train", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def start(env, *args):
    """`python -m yxanul_jax.train ARGS` in the background, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "yxanul_jax.train", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
