// The stream kernel's packed weights (stream_linear.cpp's header says why they are packed): the weight (n, d) as
// panels (ceil(n / kPanel), d, kPanel), made once per weight on first use and kept on the weight object, remade when
// the weight changed (its key or its sampled elements).

#include "stream_pack.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

namespace specfamily::stream {

namespace {

constexpr int64_t kLines = 4;  // runs of the weight's elements compared on each product (samples_of)
constexpr int64_t kLine = 16;  // elements per run: one 64-byte line

// What a cached packing was made from: the weight's storage, shape, strides and version counter.
Key key_of(const at::Tensor& weight) {
  return {reinterpret_cast<intptr_t>(weight.data_ptr()), weight.size(0), weight.size(1), weight.stride(0),
          weight.stride(1), static_cast<int64_t>(weight._version())};
}

py::tuple pack_key(const Key& key) { return py::make_tuple(key[0], key[1], key[2], key[3], key[4], key[5]); }

// Sampled elements of the weight (n, d): kLines runs of kLine inputs (or all d when fewer; one 64-byte line each
// when contiguous), in rows first to last, the first and the last element among them; this is run s's first. A write
// through `.data` moves a version counter of its own, not the weight's, so the key alone would miss it; the samples,
// taken when the weight is packed and compared on every product (a few cache misses), see any such write that
// changes one of them (a new set of weights, a scaled or shifted one), not one that leaves them all as they were.
const float* sample_run(const at::Tensor& weight, int64_t s) {
  const int64_t n = weight.size(0), d = weight.size(1), width = std::min(kLine, d);
  const int64_t col = s == kLines - 1 ? d - width : s * (d - width) / (kLines - 1) / kLine * kLine;
  return weight.data_ptr<float>() + s * (n - 1) / (kLines - 1) * weight.stride(0) + col * weight.stride(1);
}

static_assert(std::tuple_size_v<Samples> == kLines * kLine, "Weight::samples holds one run of kLine per kLines");

// The sampled elements (zero past a run narrower than kLine).
Samples samples_of(const at::Tensor& weight) {
  Samples values{};
  const int64_t width = std::min(kLine, weight.size(1)), step = weight.stride(1);
  for (int64_t s = 0; s < kLines; ++s) {
    const float* run = sample_run(weight, s);
    for (int64_t u = 0; u < width; ++u) values[s * kLine + u] = run[u * step];
  }
  return values;
}

// Whether `kept` (the bytes of samples_of when the weight was packed) still holds, bit for bit, what it samples.
bool same_samples(const py::handle& kept, const at::Tensor& weight) {
  if (!PyBytes_Check(kept.ptr()) || PyBytes_GET_SIZE(kept.ptr()) != static_cast<Py_ssize_t>(sizeof(Samples)))
    return false;
  const Samples values = samples_of(weight);
  return std::memcmp(PyBytes_AS_STRING(kept.ptr()), values.data(), sizeof(Samples)) == 0;
}

}  // namespace

// The weight (n, d) as panels (ceil(n / kPanel), d, kPanel), zero-padded past n; a copy that is `kept` (on its weight,
// for every later product) goes in the huge-page slabs (packed_storage), a passing one in ordinary memory (the slabs
// never reuse a freed copy's place).
at::Tensor pack(const at::Tensor& weight, bool kept) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "stream_linear.pack: weight must be a 2-D float32 CPU tensor, got ", weight.scalar_type(), " of shape ",
              weight.sizes(), " on ", weight.device());
  at::NoGradGuard no_grad;
  const int64_t n = weight.size(0), d = weight.size(1), panels = (n + kPanel - 1) / kPanel;
  const at::Tensor padded = at::constant_pad_nd(weight, {0, 0, 0, panels * kPanel - n}).contiguous();
  const at::Tensor order = padded.view({panels, kPanel, d}).transpose(1, 2);
  if (!kept) return order.contiguous();
  at::Tensor packed = packed_storage(panels * d * kPanel).view({panels, d, kPanel});
  packed.copy_(order);
  return packed;
}

// The packed weight kept on the weight object (PACKED_ATTR) as (key, packed, samples), remade when either changed.
// An inference tensor counts no versions (a write in place would go unseen): packed anew each product, slower.
at::Tensor packed_for(const py::handle& owner, const at::Tensor& weight) {
  if (weight.is_inference()) return pack(weight, false);
  // The kernel reads the packed copy, so the weight is out of the caches: the samples' loads start now, under way
  // while the key is built and the cached entry looked up.
  for (int64_t s = 0; s < kLines; ++s) __builtin_prefetch(sample_run(weight, s));
  const py::tuple key = pack_key(key_of(weight));
  const py::object cached = py::getattr(owner, kPackedAttr, py::none());
  if (py::isinstance<py::tuple>(cached) && py::len(cached) == 3) {
    const auto entry = cached.cast<py::tuple>();
    if (py::object(entry[0]).equal(key) && same_samples(entry[2], weight)) return entry[1].cast<at::Tensor>();
  }
  at::Tensor packed = pack(weight, true);
  const Samples samples = samples_of(weight);
  const py::bytes kept(reinterpret_cast<const char*>(samples.data()), sizeof(Samples));
  py::setattr(owner, kPackedAttr, py::make_tuple(key, packed, kept));
  return packed;
}

// packed_for(w.owner, w.tensor) without Python while the weight is as w's record says (the same key and samples:
// the check packed_for makes on the owner's attribute, made on the record); else packed_for's, recorded.
const at::Tensor& packed_of(Weight& w) {
  const at::Tensor& weight = w.tensor;
  if (weight.is_inference()) return w.packed = pack(weight, false);
  for (int64_t s = 0; s < kLines; ++s) __builtin_prefetch(sample_run(weight, s));
  const Key key = key_of(weight);
  if (w.packed.defined() && key == w.key) {
    const Samples now = samples_of(weight);
    if (std::memcmp(now.data(), w.samples.data(), sizeof(Samples)) == 0) return w.packed;
  }
  w.packed = packed_for(w.owner, weight);
  w.key = key;
  w.samples = samples_of(weight);
  return w.packed;
}

}  // namespace specfamily::stream
