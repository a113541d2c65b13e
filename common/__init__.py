"""The shared base every part imports: tokenizer and model sources, the Redis contracts,
padding, tracing, metrics and ZMQ helpers. It imports none of the parts."""
