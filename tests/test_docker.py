"""docker/: what can be checked without a Docker engine or network: the base image, the install line,
the default command, and that the pinned versions satisfy pyproject's ranges (docker/pins.py merges
them with the container's own versions, which always win)."""
import importlib.util
import re
import shlex
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO

DOCKER = REPO / "docker"


def _pins_module():
    spec = importlib.util.spec_from_file_location("pins", DOCKER / "pins.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pins = _pins_module()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined, comments dropped."""
    text = (DOCKER / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _project_requirements() -> dict[str, Requirement]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {pins.canonical(Requirement(r).name): Requirement(r) for r in data["project"]["dependencies"]}


def test_base_image_is_the_nvidia_jax_container():
    ins = _instructions()
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    assert args["BASE_IMAGE"].startswith("nvcr.io/nvidia/jax:")
    assert re.fullmatch(r"nvcr\.io/nvidia/jax:\d\d\.\d\d-py3", args["BASE_IMAGE"])
    froms = [a for w, a in ins if w == "FROM"]
    assert froms == ["${BASE_IMAGE}"]


def test_install_line_installs_the_project_under_the_merged_constraints_and_never_jax():
    runs = [a for w, a in _instructions() if w == "RUN"]
    commands = [shlex.split(c) for r in runs for c in r.split("&&")]
    installs = [c for c in commands if c[:4] == ["python", "-m", "pip", "install"]]
    assert len(installs) == 1
    install = installs[0]
    assert install[-1] == "."  # the project itself (from the COPY'd pyproject.toml)
    lock = install[install.index("--constraint") + 1]
    writes = [c for c in commands if c[:3] == ["python", "docker/pins.py", "write"]]
    assert writes and writes[0][writes[0].index("--out") + 1] == lock
    assert writes[0][writes[0].index("--tested") + 1] == "docker/constraints.txt"
    assert ["python", "docker/pins.py", "verify", lock] in commands  # fails the build if anything changed
    text = " ".join(" ".join(c) for c in commands)
    assert not re.search(r"\bjax(lib)?\b(\[|==|>=|\s|$)", text.replace("yxanul_jax", "")), \
        "the image must not install jax over the container's"
    assert "--upgrade" not in text and "-U" not in install
    copied = " ".join(a for w, a in _instructions() if w == "COPY")
    for needed in ("pyproject.toml", "docker/constraints.txt", "docker/pins.py", "yxanul_jax/"):
        assert needed in copied


def test_default_command_is_the_train_entry_point():
    cmds = [a for w, a in _instructions() if w == "CMD"]
    assert len(cmds) == 1
    import json

    cmd = json.loads(cmds[0])  # exec form
    assert cmd == ["python", "-m", "yxanul_jax.train"]
    import importlib.util

    from yxanul_jax.cli import COMMANDS

    assert "train" in COMMANDS and importlib.util.find_spec("yxanul_jax.train") is not None


def test_pins_satisfy_pyproject_and_cover_every_dependency_the_container_may_lack():
    tested = pins.parse_pins((DOCKER / "constraints.txt").read_text())
    reqs = _project_requirements()
    for name, version in tested.items():
        assert name in reqs, f"{name} is pinned but is not a dependency in pyproject.toml"
        assert Version(version) in reqs[name].specifier, f"{name}=={version} violates pyproject's '{reqs[name]}'"
    # jax and what requires it come from the container (or the resolver, against the container's jax).
    container_side = {"jax", "flax", "optax", "orbax-checkpoint"}
    assert not container_side & set(tested)
    assert set(reqs) - container_side <= set(tested), "a dependency is neither pinned nor container-provided"


def test_merge_keeps_container_versions_and_fills_gaps():
    container = {"jax": "0.5.3", "numpy": "1.26.4", "transformer-engine": "2.2.0+c3d2b4a",
                 "weird": "not a version!", "yxanul-jax": "0.1.0"}
    tested = {"numpy": "2.4.6", "tqdm": "4.70.1"}
    lines, skipped = pins.merge(container, tested)
    assert "jax==0.5.3" in lines and "transformer-engine==2.2.0+c3d2b4a" in lines
    assert "numpy==1.26.4" in lines and "numpy==2.4.6" not in lines  # the container wins
    assert "tqdm==4.70.1" in lines
    assert not any(ln.startswith(("weird", "yxanul-jax")) for ln in lines) and len(skipped) == 1
    assert pins.canonical("Transformer_Engine") == "transformer-engine"
    with pytest.raises(ValueError, match="line 2"):
        pins.parse_pins("tqdm==1\nnumpy>=1\n")


def test_pins_write_and_verify_round_trip_in_this_environment(tmp_path):
    lock = tmp_path / "constraints.lock"
    assert pins.main(["write", "--tested", str(DOCKER / "constraints.txt"), "--out", str(lock)]) == 0
    locked = pins.parse_pins(lock.read_text())
    assert locked["jax"] == pins.installed_versions()["jax"]
    assert pins.main(["verify", str(lock)]) == 0
    lock.write_text(lock.read_text().replace(f"jax=={locked['jax']}", "jax==0.0.1"))
    assert pins.main(["verify", str(lock)]) == 1  # a changed container package fails the build


def test_readme_shows_build_and_run_with_gpus_and_mounts():
    text = (DOCKER / "README.md").read_text()
    assert "docker build -f docker/Dockerfile" in text
    assert "--gpus all" in text
    for mount in ("/workspace/runs", "/data", "/cache"):
        assert mount in text
