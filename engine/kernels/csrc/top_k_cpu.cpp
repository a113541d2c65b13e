// The indices of each row's k largest values, in no particular order: what the logits'
// refinement needs (engine/model/llama.py). torch.topk sorts and runs one row per thread in a general
// selection; here each row is one pass that skips every block of values whose maximum does not
// beat the row's k-th best so far, which after the first blocks is nearly all of them.
// Rows are expected finite: the kernels are built with -ffinite-math-only, so where a row holds
// NaN or infinity the k picked are unspecified, but still k distinct indices of the row.
#include "aten_parts.h"

#include "cpu_math.h"

#include <algorithm>
#include <limits>

namespace {

using k25::to_float;

constexpr int64_t kBlock = 64;
constexpr int64_t kMaxK = 64;  // engine/model/top_k.py's MAX_K

template <typename T>
void top_k_row(const T* row, int64_t width, int64_t k, int64_t* out) {
  float best[kMaxK];  // k <= kMaxK, checked by the caller
  for (int64_t j = 0; j < k; ++j) {
    best[j] = to_float(row[j]);
    out[j] = j;
  }
  int64_t worst = std::min_element(best, best + k) - best;
  for (int64_t start = k; start < width; start += kBlock) {
    const int64_t end = std::min(width, start + kBlock);
    float block_max = std::numeric_limits<float>::lowest();
#pragma omp simd reduction(max : block_max)
    for (int64_t i = start; i < end; ++i) block_max = std::max(block_max, to_float(row[i]));
    if (!(block_max > best[worst])) continue;
    for (int64_t i = start; i < end; ++i) {
      const float v = to_float(row[i]);
      if (v > best[worst]) {
        best[worst] = v;
        out[worst] = i;
        worst = std::min_element(best, best + k) - best;
      }
    }
  }
}

}  // namespace

at::Tensor top_k_indices(at::Tensor values, int64_t k) {
  TORCH_CHECK(values.dim() == 2 && values.is_contiguous(), "values: contiguous [rows, width]");
  TORCH_CHECK(k >= 1 && k <= kMaxK && k <= values.size(1), "k must be in [1, min(64, width)], got ", k);
  const int64_t rows = values.size(0), width = values.size(1);
  auto out = at::empty({rows, k}, values.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  auto run = [&](auto* data) {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) top_k_row(data + r * width, width, k, o + r * k);
    });
  };
  switch (values.scalar_type()) {
    case at::kFloat: run(values.data_ptr<float>()); break;
    case at::kBFloat16: run(values.data_ptr<c10::BFloat16>()); break;
    case at::kHalf: run(values.data_ptr<c10::Half>()); break;
    default: TORCH_CHECK(false, "unsupported dtype ", values.scalar_type());
  }
  return out;
}
