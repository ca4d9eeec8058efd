"""Using a trained model: loading a run or checkpoint, and sampling with a KV cache."""
