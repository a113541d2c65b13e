"""Weight quantization per layer type (the spec's grammar is common/quant_spec.py): the
quantised weights' math, their kernels, and how a model's weights become them."""
