"""The model: the Llama-family forward pass, its projections and fused layer steps, and the
loaders for GGUF files, Hugging Face folders and tiny random configs."""
