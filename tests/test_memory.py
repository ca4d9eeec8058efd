"""Compiled (AOT, CPU) memory of the real yxanul-197m train step: the chunked loss keeps it far below
the 26 GB that the full 65,536 x 200,005 BF16 logits of stage 0 would need on their own."""
from yxanul_jax.core.config import load_config
from yxanul_jax.training.stages import compile_stage

from conftest import LAYER_LOOP, REPO


def test_yxanul_197m_stage0_step_needs_far_less_than_naive_logits():
    # with its loop over the layers: unrolled (the config's scan_unroll), XLA CPU hoists every recomputation
    cfg = load_config(str(REPO / "configs/yxanul_197m.yaml"), [LAYER_LOOP])
    stage = cfg.curriculum[0]
    assert (stage.seq_len, stage.batch_size) == (8, 8192)
    mem = compile_stage(cfg, stage).memory_analysis()
    peak = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    naive_logits = stage.seq_len * stage.batch_size * cfg.model.vocab_size * 2
    assert naive_logits > 26e9
    assert peak < 0.6 * naive_logits, f"compiled peak {peak / 1e9:.1f} GB"
    assert mem.alias_size_in_bytes > 0.9 * mem.argument_size_in_bytes - 1e6  # the state is donated, not copied
