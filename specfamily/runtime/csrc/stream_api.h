// The stream kernel's products for another C++ extension (layers/native_layers.cpp), reached through a capsule of
// the module (PRODUCTS_CAPSULE) so that a layer loop multiplies without Python between its products.

#pragma once

#include <torch/extension.h>

#include <array>
#include <cstdint>
#include <vector>

namespace specfamily::stream {

// A product's weight as a caller keeps it across calls: its Python object (which keeps the packed copy: the
// module's PACKED_ATTR), the tensor and bias (taken from Python once), and what the kernel found for it last: the
// packed copy and the check it passed (the weight's key and sampled elements, stream_pack.cpp). While the weight is
// as it was then, a product reads `packed` without asking Python; when it changed, the kernel packs anew as
// `linear` would (the owner's attribute), and records it here.
struct Weight {
  py::object owner;
  at::Tensor tensor;
  c10::optional<at::Tensor> bias;
  // the kernel's record (callers leave it alone)
  at::Tensor packed;
  std::array<int64_t, 6> key{};
  std::array<float, 64> samples{};
};

// x @ w.tensor^T + w.bias for every w, bit for bit what `linear` gives for each, in one parallel region.
using ProductsFn = std::vector<at::Tensor> (*)(const at::Tensor& x, const std::vector<Weight*>& weights);
constexpr const char* kProductsCapsule = "specfamily.stream_products.v1";

}  // namespace specfamily::stream
