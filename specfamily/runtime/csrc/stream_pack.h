// The stream kernel's packed weights (stream_pack.cpp), for stream_linear.cpp's products and its module.

#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace specfamily::stream {

constexpr int64_t kPanel = 16;  // output rows (weight rows) per packed panel
constexpr const char* kPackedAttr = "_specfamily_packed";  // the weight's attribute that keeps its packing

// The weight (n, d) as panels (ceil(n / kPanel), d, kPanel), zero-padded past n.
at::Tensor pack(const at::Tensor& weight);

// The packed weight kept on `owner` (kPackedAttr), remade when the weight changed.
at::Tensor packed_for(const py::handle& owner, const at::Tensor& weight);

}  // namespace specfamily::stream
