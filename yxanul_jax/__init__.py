"""yxanul-jax: a pure-JAX/Flax training stack for small language models with FP8 dense layers."""
__version__ = "0.1.0"
