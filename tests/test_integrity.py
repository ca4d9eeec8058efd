"""Tests for yxanul_jax.training.integrity: checksums of raw bits, finiteness, template comparison."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from yxanul_jax.training.integrity import CHECKSUMS, leaf_specs, mismatch, tree_checksums, tree_is_finite, verify


def test_tree_is_finite():
    good = {"a": jnp.ones(3, jnp.bfloat16), "b": (np.zeros(2, np.float32), jnp.arange(3))}
    assert tree_is_finite(good)
    assert tree_is_finite({"only_ints": jnp.arange(4), "key": jax.random.key(0)})
    assert not tree_is_finite({**good, "c": {"d": jnp.array([1.0, jnp.inf], jnp.bfloat16)}})
    assert not tree_is_finite({**good, "e": np.array([np.nan], np.float32)})


def test_checksums_see_every_bit_and_the_order():
    w = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    tree = {"params": {"w": w, "b": jnp.zeros(2, jnp.bfloat16)}, "step": jnp.int32(3), "key": jax.random.key(0)}
    sums = tree_checksums(tree)
    assert set(sums) == {"params.w", "params.b", "step", "key"}  # a typed key: its key data
    assert tree_checksums({**tree, "key": jax.random.key(1)})["key"] != sums["key"]
    assert tree_checksums(jax.tree.map(lambda x: x, tree)) == sums
    flipped = w.at[1, 2].set(jnp.nextafter(w[1, 2], jnp.float32(100)))  # the lowest bit of one value
    assert tree_checksums({**tree, "params": {**tree["params"], "w": flipped}})["params.w"] != sums["params.w"]
    swapped = w.at[0, 0].set(w[0, 1]).at[0, 1].set(w[0, 0])  # same values, another order
    assert tree_checksums({"w": swapped})["w"][0] == tree_checksums({"w": w})["w"][0]
    assert tree_checksums({"w": swapped})["w"][1] != tree_checksums({"w": w})["w"][1]


def test_verify_names_the_damaged_array_or_the_nan():
    state = {"params": {"w": jnp.ones((2, 2))}, "opt_state": {"mu": jnp.zeros((2, 2))}, "fp8": {"s": jnp.full(2, jnp.inf)}}
    meta = {CHECKSUMS: tree_checksums(state)}
    assert verify(state, meta) is None  # the FP8 state may hold inf
    damaged = {**state, "params": {"w": jnp.full((2, 2), 2.0)}}
    assert verify(damaged, meta) == "array 'params.w' does not match its checksum (1 array(s) damaged)"
    diverged = {**state, "opt_state": {"mu": jnp.full((2, 2), jnp.nan)}}
    assert verify(diverged, {}) == "its parameters or optimizer state hold NaN or inf"


def test_mismatch_compares_shapes_dtypes_and_names():
    saved = leaf_specs({"w": jnp.zeros((2, 3)), "k": jax.random.key(1)})
    assert saved == {"w": ((2, 3), "float32"), "k": ((2,), "uint32")}
    assert mismatch(saved, dict(saved)) is None
    assert mismatch(saved, {"w": ((2, 3), "bfloat16")}) == \
        "'w' is float32[2, 3] in the checkpoint but bfloat16[2, 3] in the state being restored"
    assert mismatch(saved, {"w": ((2, 3), "float32")}) == "the checkpoint has 'k' which the state being restored lacks"
    assert mismatch(saved, {"w": ((2, 3), "float32")}, partial=True) is None
    assert mismatch(saved, {**saved, "x": ((1,), "float32")}) == "'x' is missing from the checkpoint"


def test_meta_checksums_name_the_edited_key_a_renamed_step_and_a_legacy_meta():
    import json

    from yxanul_jax.training.integrity import LEGACY, META_CHECKSUMS, meta_checksums, verify_meta

    meta = {"data": {"cursor": 1536, "seed": 0}, "stage": 0, "tokens": 1536, "config": {"model": {"n_layers": 2}},
            "train_loss": 6.06, "targets": ("q", "k"), CHECKSUMS: {"params.w": [1, 2]}}
    meta[META_CHECKSUMS] = meta_checksums(meta, 6)
    back = json.loads(json.dumps(meta))  # as the JSON file reads back (the tuple is a list now)
    assert verify_meta(back, 6) is None
    edited = json.loads(json.dumps(meta))
    edited["data"]["cursor"] = 0  # the data cursor moved by hand
    assert verify_meta(edited, 6) == "its metadata 'data' does not match its checksum (edited or damaged)"
    edited = {**back, CHECKSUMS: {"params.w": [1, 3]}}  # the array checksums made to fit edited arrays
    assert verify_meta(edited, 6) == "its metadata 'checksums' does not match its checksum (edited or damaged)"
    assert verify_meta(back, 9) == "it was saved as step 6, not 9 (its directory was renamed or copied)"
    assert verify_meta({k: v for k, v in back.items() if k != "tokens"}, 6) == "its metadata 'tokens' is missing"
    assert verify_meta({**back, "x": 1}, 6) == "its metadata has 'x', which was not saved with it"
    assert verify_meta({k: v for k, v in back.items() if k != META_CHECKSUMS}, 6) == LEGACY
