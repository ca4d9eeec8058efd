"""Named scopes the train step puts into HLO `op_name` metadata, so tools can tell its parts apart.

`jax.named_scope(LOSS)` wraps the output head and the chunked cross-entropy, `OPTIMIZER` the gradient
scaling, clipping and the optimizer update, `FP8_SCALING` the amax reductions, scale updates and
quantizing casts, `ATTENTION` the attention kernel itself (cuDNN or XLA). The performance model
(`analysis.perf`) and the profile summary read them to put every kernel in a category.
"""
LOSS = "loss"
OPTIMIZER = "optimizer"
FP8_SCALING = "fp8_scaling"
ATTENTION = "attention_core"
BF16_WGRAD = "bf16_wgrad"
"""The weight gradient of an FP8 projection run in BF16 (`fp8.wgrad: bf16`): a GEMM of an FP8 target that is
meant not to be FP8 (`analyze --require fp8-expected` does not count it as lost)."""
