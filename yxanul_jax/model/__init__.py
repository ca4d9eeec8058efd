"""The Yxanul model: the Flax transformer, FP8 dense backends, Transformer Engine layers, the loss, the HF layout."""
