"""Training: optimizer, pure train/eval steps, per-stage compiles, sharding, checkpoints, validation, monitoring."""
