// The stream kernel's packed weights (stream_pack.cpp), for stream_linear.cpp's products and its module.

#pragma once

#include <torch/extension.h>

#include <cstdint>

#include "stream_api.h"

namespace specfamily::stream {

constexpr int64_t kPanel = 16;  // output rows (weight rows) per packed panel
constexpr const char* kPackedAttr = "_specfamily_packed";  // the weight's attribute that keeps its packing

// `numel` floats for a packed weight: huge-page-backed memory shared with other packed weights (stream_slab.cpp).
at::Tensor packed_storage(int64_t numel);

// The weight (n, d) as panels (ceil(n / kPanel), d, kPanel), zero-padded past n; `kept` (kept for later products): in
// the huge-page slabs, else ordinary memory.
at::Tensor pack(const at::Tensor& weight, bool kept = false);

// The packed weight kept on `owner` (kPackedAttr), remade when the weight changed.
at::Tensor packed_for(const py::handle& owner, const at::Tensor& weight);

// What a packing was checked against (stream_pack.cpp): the weight's key and sampled elements, as Weight keeps them.
using Key = decltype(Weight::key);
using Samples = decltype(Weight::samples);

// packed_for(w.owner, w.tensor), from w's record while the weight is as it was then (no Python), else recorded.
const at::Tensor& packed_of(Weight& w);

}  // namespace specfamily::stream
