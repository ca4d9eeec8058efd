"""Checkpoint integrity: checksums of everything a resume reads, and the checks a restore must pass.

A checkpoint stores `tree_checksums(state)` in its meta under `CHECKSUMS`: per array (parameters,
optimizer state, FP8 state, the step), two wrap-around sums (mod 2**32) of its raw bits, one plain
and one position-weighted, computed on device. `verify` recomputes them for the restored state and
also refuses NaN/inf in the parameters or optimizer state.

The JSON beside the arrays (the data cursor and its seed, the stage, the tokens, the resolved config,
the training loss, and the array checksums themselves) is covered by `meta_checksums` under
`META_CHECKSUMS`: the SHA-256 of each top-level key's canonical JSON, and the step the checkpoint was
saved as (its directory name is what Orbax restores by). `verify_meta` names the key that was edited
or damaged, or the step a renamed directory claims. A checkpoint written before these existed has no
`META_CHECKSUMS`: `verify_meta` answers `LEGACY` for it (its arrays are still verified).

The meta also holds the checkpoint format's version under `FORMAT` (`FORMAT_VERSION` when saved; a meta
without it is version 1, every checkpoint written before the field existed). `format_refusal` refuses a
version newer than this code reads; every older one is read. `tests/golden/` holds a checkpoint of
today's format that every later version must restore and train on (tests/test_golden_checkpoint.py).

`leaf_specs` and `mismatch` compare a checkpoint's array shapes and dtypes with the template it is
restored into (Orbax would otherwise cast silently).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CHECKSUMS = "checksums"
"""The meta key holding `tree_checksums` of the saved state."""
META_CHECKSUMS = "meta_checksums"
"""The meta key holding `meta_checksums` of the rest of the meta: {"step": int, "sha256": {key: hex}}."""
FORMAT = "format_version"
"""The meta key holding the checkpoint format's version."""
FORMAT_VERSION = 1
"""The checkpoint format this code writes, and the newest it reads. Raise it when what a checkpoint holds or
how it is laid out changes in a way older code would misread (and teach the restore to read the older ones);
regenerate tests/golden/ with scripts/make_golden_checkpoint.py only then, keeping the old one as a test too.
1: `state` (params, opt_state, fp8, step: StandardSave) + `meta` JSON (data cursor, stage, tokens, config,
checksums; meta_checksums optional)."""
LEGACY = "legacy"
"""`verify_meta`'s answer for a checkpoint saved before metadata checksums (nothing to compare with)."""


def _key_name(key) -> str:
    # DictKey.key / GetAttrKey.name / SequenceKey.idx: a namedtuple field saved by Orbax comes
    # back as a dict key, so paths are compared by name only.
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def leaf_specs(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """Dotted path -> (shape, dtype name) for every array leaf; typed PRNG keys as their key data."""
    specs = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            continue
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.eval_shape(jax.random.key_data, leaf)
        specs[".".join(_key_name(k) for k in path)] = (tuple(leaf.shape), np.dtype(leaf.dtype).name)
    return specs


def mismatch(saved_specs: dict, wanted_specs: dict, partial: bool = False) -> str | None:
    """First difference between a checkpoint's arrays and the template's (both `leaf_specs`), or None
    (`partial`: the checkpoint may hold more than the template)."""
    for path, want in wanted_specs.items():
        if path not in saved_specs:
            return f"'{path}' is missing from the checkpoint"
        have = saved_specs[path]
        if have != want:
            return (f"'{path}' is {have[1]}{list(have[0])} in the checkpoint "
                    f"but {want[1]}{list(want[0])} in the state being restored")
    extra = sorted(set(saved_specs) - set(wanted_specs))
    if extra and not partial:
        return f"the checkpoint has '{extra[0]}' which the state being restored lacks"
    return None


def _bits_u32(x) -> jax.Array:
    """The raw bits of an array as uint32 words (1-, 2-, 4- and 8-byte element types)."""
    size = jnp.dtype(x.dtype).itemsize
    if size == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
    return jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)


@jax.jit
def _sums(leaves: list) -> list:
    out = []
    for x in leaves:
        w = _bits_u32(x)
        weights = (jnp.arange(w.size, dtype=jnp.uint32) % jnp.uint32(65521)) + jnp.uint32(1)
        out.append(jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * weights, dtype=jnp.uint32)]))
    return out


def tree_checksums(tree: Any) -> dict[str, list[int]]:
    """Dotted path -> [sum, position-weighted sum] (mod 2**32) of every array's bits (a typed PRNG key's:
    its key data). Integer sums are order-independent, so the same values give the same checksums on any
    device or sharding."""
    leaves = [(".".join(_key_name(k) for k in path),
               jax.random.key_data(leaf) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf)
              for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(leaf, "dtype")]
    named = [(name, leaf) for name, leaf in leaves if jnp.dtype(leaf.dtype).itemsize in (1, 2, 4, 8)]
    sums = jax.device_get(_sums([leaf for _, leaf in named]))
    return {name: [int(v) for v in s] for (name, _), s in zip(named, sums)}


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def tree_is_finite(tree: Any) -> bool:
    """True if no floating-point leaf of `tree` holds NaN or inf: one compiled program and one device sync in all.
    (One small eager reduction per leaf, as this was, put a cross-device collective per sharded leaf in flight; on
    CPU devices some fifty of them deadlocked, so an FSDP run could not resume.)"""
    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    return bool(_all_finite(leaves)) if leaves else True


def _trained_parts(state: Any) -> list:
    """The parameters and optimizer state of a train state (a TrainState or a dict holding them)."""
    get = state.get if isinstance(state, dict) else lambda k: getattr(state, k, None)
    return [part for part in (get("params"), get("opt_state")) if part is not None]


def verify(state: Any, meta: dict) -> str | None:
    """Why a restored `state` cannot be trusted, or None: an array whose checksum differs from the
    saved one (`meta[CHECKSUMS]`), or a NaN/inf in the parameters or optimizer state (the FP8 state
    and others may hold any value). A meta saved before `META_CHECKSUMS` existed has no checksums for
    typed PRNG keys: those are not compared."""
    saved = meta.get(CHECKSUMS)
    if saved is not None:
        got = tree_checksums(state)  # every restored array: all of the saved ones, or a part of them
        legacy = META_CHECKSUMS not in meta
        bad = sorted(k for k in got if saved.get(k) != got[k] and not (legacy and k not in saved))
        if bad:
            return f"array '{bad[0]}' does not match its checksum ({len(bad)} array(s) damaged)"
    if not tree_is_finite(_trained_parts(state)):
        return "its parameters or optimizer state hold NaN or inf"
    return None


def _canonical(value: Any) -> bytes:
    """One byte string per JSON value, whatever the key order or the spacing it was written with."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def meta_checksums(meta: dict, step: int) -> dict:
    """`META_CHECKSUMS` of a checkpoint's meta (JSON-safe: what the file will read back as) saved as `step`."""
    meta = json.loads(json.dumps(meta, allow_nan=False))  # tuples -> lists, int keys -> str: as read back
    return {"step": int(step), "sha256": {k: hashlib.sha256(_canonical(v)).hexdigest()
                                          for k, v in sorted(meta.items()) if k != META_CHECKSUMS}}


def format_refusal(meta: dict) -> str | None:
    """Why this code cannot read a checkpoint of this meta's format, or None: a version newer than
    `FORMAT_VERSION` (written by a later yxanul-jax) or not a version at all. No `FORMAT`: version 1."""
    version = meta.get(FORMAT, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"has checkpoint format version {version!r}, which no yxanul-jax writes (its metadata is damaged)"
    if version > FORMAT_VERSION:
        return (f"has checkpoint format version {version}, newer than the {FORMAT_VERSION} this yxanul-jax reads; "
                "upgrade yxanul-jax (pip install -U yxanul-jax) to resume it")
    return None


def verify_meta(meta: dict, step: int) -> str | None:
    """Why a checkpoint's meta (as read back, saved under the directory of `step`) cannot be trusted, or
    None; `LEGACY` when it predates `META_CHECKSUMS` and cannot be checked."""
    record = meta.get(META_CHECKSUMS)
    if record is None:
        return LEGACY
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), dict):
        return f"its metadata checksums ('{META_CHECKSUMS}') are damaged"
    if record.get("step") != step:
        return f"it was saved as step {record.get('step')}, not {step} (its directory was renamed or copied)"
    want, got = record["sha256"], meta_checksums(meta, step)["sha256"]
    missing = sorted(set(want) - set(got))
    if missing:
        return f"its metadata '{missing[0]}' is missing"
    added = sorted(set(got) - set(want))
    if added:
        return f"its metadata has '{added[0]}', which was not saved with it"
    bad = sorted(k for k in want if want[k] != got[k])
    if bad:
        return f"its metadata '{bad[0]}' does not match its checksum (edited or damaged)"
    return None
