"""The model runner: turns a scheduled batch into tensors, runs the model (eagerly or through a
captured CUDA graph) over the paged KV cache, and samples one token per finished row."""
