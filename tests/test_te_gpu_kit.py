"""Transformer Engine on the GPU, as far as a CPU can take it: the kit's parts travel in separate calls and are
put back together and checked (scripts/te_gpu_install.sh), and the FP8 check script runs its BF16 and XLA arms."""
from __future__ import annotations

import pytest

import hashlib
import json
import os
import shutil
import subprocess

from conftest import REPO, load_script
from data_fixtures import run_cli

pytestmark = pytest.mark.slow  # runs a script end to end: `pytest -m "not slow"` skips it

INSTALL = str(REPO / "scripts" / "te_gpu_install.sh")
WHEEL = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"


def _kit(tmp_path):
    """A kit laid out as scripts/te_gpu_kit.sh lays it out, around a 300 kB file cut into 4 parts."""
    payload = os.urandom(300_000)
    kit = tmp_path / "kit"
    (kit / "base").mkdir(parents=True)
    parts = [payload[i:i + 80_000] for i in range(0, len(payload), 80_000)]
    for i, chunk in enumerate(parts):
        (kit / f"part-{i:02d}").write_bytes(chunk)
    sdist = b"sdist bytes"
    (kit / "base" / "transformer_engine_jax-2.20.2.tar.gz").write_bytes(sdist)
    (kit / "base" / "SHA256SUMS").write_text(f"{hashlib.sha256(payload).hexdigest()}  {WHEEL}\n"
                                             f"{hashlib.sha256(sdist).hexdigest()}  transformer_engine_jax-2.20.2.tar.gz\n")
    (kit / "base" / "PARTS").write_text("".join(f"part-{i:02d}\n" for i in range(len(parts))))
    return kit, payload, len(parts)


def _call(tmp_path, kit, carried: list[str], verb: str, parts_dir):
    """One device call: a fresh working tree holding only what that call carries, then the script."""
    tree = tmp_path / f"call-{verb}-{'-'.join(carried)}"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / ".te").mkdir(parents=True)
    for name in carried:
        src = kit / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tree / ".te" / name)
    env = {**os.environ, "TE_PARTS": str(parts_dir), "TE_BUILD": str(tmp_path / "build")}
    return subprocess.run(["bash", INSTALL, verb], cwd=tree, env=env, capture_output=True, text=True, timeout=60)


def test_parts_stashed_in_separate_calls_are_put_back_together_and_checked(tmp_path):
    kit, payload, n = _kit(tmp_path)
    parts = tmp_path / "stash"
    for i in range(n):
        proc = _call(tmp_path, kit, [f"part-{i:02d}"], "stash", parts)
        assert proc.returncode == 0, proc.stderr
    proc = _call(tmp_path, kit, ["base"], "assemble", parts)
    assert proc.returncode == 0 and "sha256 ok" in proc.stdout, proc.stderr
    assert (tmp_path / "build" / WHEEL).read_bytes() == payload


def test_a_missing_or_damaged_part_is_one_line_naming_it(tmp_path):
    kit, _, n = _kit(tmp_path)
    parts = tmp_path / "stash"
    for i in (0, 2):  # the machine went back after part 1's call: parts 1 and 3 are not there
        _call(tmp_path, kit, [f"part-{i:02d}"], "stash", parts)
    proc = _call(tmp_path, kit, ["base"], "install", parts)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "part-01 part-03 not in" in proc.stderr and "stash every part again" in proc.stderr
    for i in (1, 3):
        _call(tmp_path, kit, [f"part-{i:02d}"], "stash", parts)
    damaged = bytearray((parts / "part-02").read_bytes())
    damaged[7] ^= 1
    (parts / "part-02").write_bytes(bytes(damaged))
    proc = _call(tmp_path, kit, ["base"], "assemble", parts)
    assert proc.returncode == 2 and "does not match its sha256" in proc.stderr
    proc = _call(tmp_path, kit, [], "stash", parts)
    assert proc.returncode == 2 and "carries no .te/part-NN" in proc.stderr


def test_fp8_check_runs_the_arms_this_machine_has_and_checks_them(tmp_path):
    # On a CPU: BF16 and XLA FP8 run and pass the stated bounds; TE is reported as skipped, with its reason.
    check = load_script("te_gpu_check")
    out = tmp_path / "check.json"
    rc, stdout, _ = run_cli(check.main, ["--steps", "3", "--json-out", out, "model.n_layers=1"])
    record = json.loads(out.read_text())
    assert rc == 0 and record == json.loads(stdout.strip().splitlines()[-1]) and record["ok"]
    xla = record["arms"]["xla"]
    assert set(xla["checks"]) == {"forward", "gradient", "state", "training"} and all(xla["checks"].values())
    assert xla["forward_rel"] < check.FORWARD_REL and xla["scales"] > 0
    assert "Transformer Engine" in record["arms"]["te"]["skipped"]
    assert record["arms"]["bf16"]["last_loss"] < record["arms"]["bf16"]["first_loss"]
    rc, _, stderr = run_cli(check.main, ["--steps", "1"])
    assert rc == 2 and "--steps must be >= 2" in stderr
