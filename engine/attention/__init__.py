"""Paged attention: one interface (backend.py) over the torch path, the C++ CPU kernel and the
Triton kernel, with a plain-torch reference every implementation is tested against."""
