"""The C++ CPU kernels (csrc/) and their build into one Python module."""
