// The Python module of the CPU kernels (engine/kernels/cpu_build.py builds it from every source here).
// torch/csrc/utils/pybind.h: pybind11 with the Tensor conversions, without torch/extension.h (aten_parts.h)
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                           at::Tensor query_start, at::Tensor seq_lens, int64_t block_size, double scale, bool amx);
at::Tensor add_rms_norm(at::Tensor x, c10::optional<at::Tensor> delta, at::Tensor weight, double eps);
at::Tensor rotary_to_cache(at::Tensor qkv, at::Tensor cos, at::Tensor sin, at::Tensor positions,
                           at::Tensor slot_mapping, at::Tensor k_cache, at::Tensor v_cache, int64_t heads);
at::Tensor silu_mul(at::Tensor gate_up);
at::Tensor top_k_indices(at::Tensor values, int64_t k);
bool has_bf16_linear();
at::Tensor linear_bf16(at::Tensor x, at::Tensor blocked, c10::optional<at::Tensor> bias, bool amx);
bool amx_ready();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "varlen paged attention through block tables (prefill slices and decodes)",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("query_start"), py::arg("seq_lens"),
        py::arg("block_size"), py::arg("scale"), py::arg("amx") = true);
  m.def("add_rms_norm", &add_rms_norm, "x += delta (if given), then RMSNorm scaled by weight, in the weight's dtype");
  m.def("rotary_to_cache", &rotary_to_cache, "rotary on q and k, k and v written to the caches; returns q");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a stacked gate_up");
  m.def("top_k_indices", &top_k_indices, "indices of each row's k largest values, unordered");
  m.def("has_bf16_linear", &has_bf16_linear, "whether linear_bf16 was built (the CPU has AVX512-BF16 or AVX2)");
  m.def("linear_bf16", &linear_bf16, "x W^T (+ bias) in bfloat16 over a weight blocked [N/16, K/2, 16, 2]", py::arg("x"),
        py::arg("blocked"), py::arg("bias") = py::none(), py::arg("amx") = true);
  m.def("amx_ready", &amx_ready, "whether linear_bf16 can use AMX here (built with it, and Linux grants the tiles)");
}
