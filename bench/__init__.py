"""Benchmarks, load generators, baselines and simulations. They may import the runtime parts;
the parts never import them, so nothing here ships in a part's image dependencies."""
