"""BatchSpec: the [A, B, L] batch a train step takes, from a stage, the loader's rows, or random tokens."""
import jax.numpy as jnp
import numpy as np

from yxanul_jax.core.config import StageConfig, load_config
from yxanul_jax.training.batch import BatchSpec


def test_abstract_batch_is_accum_x_rows_x_tokens():
    b = BatchSpec.of(load_config(None, ["curriculum.0.grad_accum_steps=3"]).curriculum[0]).abstract()
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == {
        "inputs": ((3, 32, 64), jnp.int32), "targets": ((3, 32, 64), jnp.int32), "mask": ((3, 32, 64), jnp.float32)}


def test_from_rows_folds_the_loaders_rows_in_order_into_micro_batches():
    spec = BatchSpec.of(StageConfig(seq_len=4, batch_size=2, grad_accum_steps=3))
    rows = {"inputs": np.arange(6 * 4).reshape(6, 4), "mask": np.ones((6, 4), np.float32)}
    out = spec.from_rows(rows)
    assert out["inputs"].shape == spec.shape == (3, 2, 4) and spec.rows_per_step == 6
    assert out["inputs"][1, 0].tolist() == rows["inputs"][2].tolist()  # micro-batch 1 starts at row 2


def test_synthetic_targets_are_the_inputs_shifted_by_one():
    b = BatchSpec(2, 3, 5).synthetic(vocab_size=11, seed=4)
    assert b["inputs"].shape == b["targets"].shape == b["mask"].shape == (2, 3, 5)
    assert (b["inputs"][..., 1:] == b["targets"][..., :-1]).all() and int(b["inputs"].max()) < 11
    assert not (b["inputs"] == BatchSpec(2, 3, 5).synthetic(vocab_size=11, seed=5)["inputs"]).all()
