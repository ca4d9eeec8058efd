"""Text to training batches: input readers, tokenizers, corpus preparation, the demo corpus, the shard loader."""
