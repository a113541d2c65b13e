"""Triton kernels. On a CPU they run only under TRITON_INTERPRET=1 (set before importing them)."""
