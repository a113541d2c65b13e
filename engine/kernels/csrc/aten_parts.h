// The parts of ATen the kernels use, in place of <torch/extension.h>: that header brings pybind11
// and torch's C++ frontend, and parsing it took ~50 s of each file's compile on 2 cores (4 variants
// x 8 files at every `make` on a new machine). Only cpu_kernels.cpp, the Python module, includes it.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
