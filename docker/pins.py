"""Write the pip constraints the image installs yxanul-jax under, and check afterwards that they held.

Run inside the base container, before and after `pip install`:

    python docker/pins.py write --tested docker/constraints.txt --out /opt/yxanul-jax/constraints.lock
    python -m pip install --constraint /opt/yxanul-jax/constraints.lock .
    python docker/pins.py verify /opt/yxanul-jax/constraints.lock

`write` pins every distribution the container already has to its installed version (CUDA JAX,
jaxlib plugins, Transformer Engine, numpy, ...: these always win), then adds the tested pins of
docker/constraints.txt for packages the container lacks. pip may therefore add packages but never
replace one of the container's, and fails loudly when the project's ranges exclude a container
version. `verify` re-reads the installed versions and exits 1 naming any that changed.
Standard library only (plus `packaging` when present), so it runs in any base image.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys

SELF = "yxanul-jax"


def canonical(name: str) -> str:
    """PEP 503 normalized project name: `Transformer_Engine` -> `transformer-engine`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def valid_version(version: str) -> bool:
    """True if pip can use `name==version` as a constraint (PEP 440)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # conservative fallback: digits and dots, optional pre/post/dev/local parts
        return re.fullmatch(r"\d+(\.\d+)*([a-zA-Z0-9.+!_-]*)", version) is not None
    try:
        Version(version)
        return True
    except InvalidVersion:
        return False


def parse_pins(text: str) -> dict[str, str]:
    """`name==version` lines (comments and blank lines ignored) -> {canonical name: version}."""
    pins = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"line {n}: {raw!r} is not of the form name==version")
        pins[canonical(name.strip())] = version.strip()
    return pins


def installed_versions() -> dict[str, str]:
    """{canonical name: version} of every distribution importable in this interpreter."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), dist.version)
    return out


def merge(container: dict[str, str], tested: dict[str, str]) -> tuple[list[str], list[str]]:
    """(constraint lines, skipped notes). The container's versions win; tested pins fill the gaps."""
    lines, skipped = [], []
    for name in sorted(container):
        if name == SELF:
            continue  # a rebuild on top of an image that already has the project
        if valid_version(container[name]):
            lines.append(f"{name}=={container[name]}")
        else:
            skipped.append(f"{name} {container[name]!r} (not a PEP 440 version; left unconstrained)")
    lines += [f"{name}=={version}" for name, version in sorted(tested.items()) if name not in container]
    return lines, skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the merged constraints file")
    w.add_argument("--tested", required=True, help="docker/constraints.txt")
    w.add_argument("--out", required=True)
    v = sub.add_parser("verify", help="exit 1 if an installed version differs from the constraints file")
    v.add_argument("lock")
    args = p.parse_args(argv)
    now = installed_versions()
    if args.cmd == "write":
        with open(args.tested, encoding="utf-8") as fh:
            tested = parse_pins(fh.read())
        lines, skipped = merge(now, tested)
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        added = sorted(set(tested) - set(now))
        print(f"pins: {len(now)} container packages kept at their versions, {len(added)} tested pins added "
              f"({', '.join(added) or 'none'}); jax {now.get('jax', 'absent')}, "
              f"transformer-engine {now.get('transformer-engine', 'absent')}")
        for note in skipped:
            print(f"pins: skipped {note}")
        return 0
    with open(args.lock, encoding="utf-8") as fh:
        locked = parse_pins(fh.read())
    changed = [f"{n} {locked[n]} -> {now[n]}" for n in sorted(locked) if n in now and now[n] != locked[n]]
    if changed:
        print("pins: the install changed container packages: " + "; ".join(changed), file=sys.stderr)
        return 1
    print(f"pins: all {len(locked)} constrained packages are at their pinned versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
