// The lean forward's layer loop in C++ (specfamily.runtime.native_layers builds this and decides when it runs).
//
// A plain pass of a small model runs a few thousand small ATen ops between its products; from Python each is a round
// trip through the interpreter and the binding layer on the main thread. This runs every decoder layer of one pass
// with the same ATen calls, in the same order and with the same arguments as specfamily.runtime.lean.LeanLayer, and
// the stream kernel's own product and norm (reached through the capsules its module exports: no Python in between),
// so the hidden state and every cache entry are bit-identical to the Python loop's. The cache is written in place
// into each layer's buffers (BufferedLayer.reserve) at the layer's kept length, as BufferedLayer.update writes it.

#include <ATen/record_function.h>
#include <torch/extension.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "../pass_marks.h"
#include "../stream_api.h"

namespace {

// The stream kernel's entry points (stream_linear.cpp exports them as capsules of these names).
using specfamily::stream::ProductsFn;
using specfamily::stream::Weight;
using NormFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, double);
constexpr const char* kNormCapsule = "specfamily.rms_norm.v1";
// The batch-invariant attention's entry point (csrc/attention/attention.cpp exports it as a capsule of this name).
using AttendFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const c10::optional<at::Tensor>&, double);
constexpr const char* kAttendCapsule = "specfamily.attention.v1";

template <typename Fn>
Fn from_capsule(const py::handle& module, const char* attr, const char* name) {
  const py::object capsule = module.attr(attr);
  TORCH_CHECK(PyCapsule_IsValid(capsule.ptr(), name), "native_layers: the stream kernel's ", attr, " is not a ",
              name, " capsule");
  return reinterpret_cast<Fn>(PyCapsule_GetPointer(capsule.ptr(), name));
}

// A product's weight as the stream kernel keeps it between passes (stream_api.h): the Python object, its tensor and
// bias taken once, here, and the kernel's record of its packed copy. Mutable: each product refreshes the record.
using Product = Weight;

// One decoder layer's parameters (LeanLayer's fields).
struct Layer {
  at::Tensor norm1;
  double eps1;
  mutable Product q, k, v, o;  // mutable: a product refreshes its record of the packed copy
  at::Tensor norm2;
  double eps2;
  mutable Product gate, up, down;
  int64_t head_dim;
  double scaling;
};

// How every layer of the pass calls sdpa (specfamily.runtime.lean.Attend).
struct Plan {
  c10::optional<at::Tensor> mask;
  bool causal, gqa, pack;
  int64_t groups;
  bool kernel;  // attend with the attention kernel (visible: each fed row's keys, None: all) instead of sdpa
  c10::optional<at::Tensor> visible;
};

// One (1, heads, q, D) float32 tensor's rows as the loops below read or write them: the last dimension contiguous.
struct Rows {
  float* data;
  int64_t heads, rows, dim, head_stride, row_stride;

  static bool fits(const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.device().is_cpu() && t.dim() == 4 && t.size(0) == 1 && t.stride(3) == 1;
  }
  static Rows of(const at::Tensor& t) {
    return {t.data_ptr<float>(), t.size(1), t.size(2), t.size(3), t.stride(1), t.stride(2)};
  }
  float* row(int64_t h, int64_t r) const { return data + h * head_stride + r * row_stride; }
};

// rotate_pair's (x * cos) + (roll(x, D / 2, -1) * sin) for every head and row of x into out, in float32 with each
// product and the sum rounded as ATen's three elementwise ops round them (no fused multiply-add: bit-identical).
// cos and sin: (q, D) contiguous. The roll's partner of element i is i + (D - D / 2) in the first half and i - D / 2
// in the second: two loops without a modulo per element, which the compiler vectorises (one division an element
// made this loop cost more than a row's norms).
__attribute__((optimize("fp-contract=off"))) void rotate_row(const float* __restrict in, const float* __restrict c,
                                                              const float* __restrict s, float* __restrict o,
                                                              int64_t dim) {
  const int64_t shift = dim / 2, back = dim - shift;
  for (int64_t i = 0; i < shift; ++i) {
    const float a = in[i] * c[i];
    const float b = in[i + back] * s[i];
    o[i] = a + b;
  }
  for (int64_t i = shift; i < dim; ++i) {
    const float a = in[i] * c[i];
    const float b = in[i - shift] * s[i];
    o[i] = a + b;
  }
}

void rotate_into(const Rows& x, const float* cos, const float* sin, const Rows& out) {
  const int64_t dim = x.dim;
  for (int64_t h = 0; h < x.heads; ++h)
    for (int64_t r = 0; r < x.rows; ++r) rotate_row(x.row(h, r), cos + r * dim, sin + r * dim, out.row(h, r), dim);
}

void copy_into(const Rows& x, const Rows& out) {
  for (int64_t h = 0; h < x.heads; ++h)
    for (int64_t r = 0; r < x.rows; ++r) std::memcpy(out.row(h, r), x.row(h, r), sizeof(float) * x.dim);
}

// a += b (multiply: a *= b) element by element, in place: a plain loop where both are contiguous float32 CPU tensors
// of one shape (the same IEEE sums and products ATen's add_ / mul_ give, without a dispatch and a TensorIterator per
// call: three a layer), else ATen's own.
at::Tensor combine_(at::Tensor a, const at::Tensor& b, bool multiply) {
  if (!(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.is_contiguous() && b.is_contiguous() &&
        a.sizes() == b.sizes() && a.device().is_cpu() && b.device().is_cpu()))
    return multiply ? a.mul_(b) : a.add_(b);
  float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  const int64_t n = a.numel();
  if (multiply)
    for (int64_t i = 0; i < n; ++i) x[i] *= y[i];
  else
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  return a;
}

Product product_of(const py::handle& pair) {
  const py::tuple t = pair.cast<py::tuple>();
  c10::optional<at::Tensor> bias;
  if (!t[1].is_none()) bias = t[1].cast<at::Tensor>();
  return Product{py::reinterpret_borrow<py::object>(t[0]), t[0].cast<at::Tensor>(), bias};
}

class NativeLayers {
 public:
  // `module`: the stream kernel's module; `layers`: one tuple per layer, LeanLayer's fields in this order:
  // (norm1 weight, eps1, q, k, v, o, norm2 weight, eps2, gate, up, down, head_dim, scaling), each product a
  // (weight, bias or None) pair.
  // `attention`: the attention kernel's module, or None (passes planned with the kernel are then refused).
  NativeLayers(const py::object& module, const py::list& layers, const py::object& attention)
      : products_(from_capsule<ProductsFn>(module, "_products_capsule", specfamily::stream::kProductsCapsule)),
        norm_(from_capsule<NormFn>(module, "_norm_capsule", kNormCapsule)),
        attend_(attention.is_none() ? nullptr : from_capsule<AttendFn>(attention, "_attend_capsule", kAttendCapsule)) {
    for (const py::handle item : layers) {
      const py::tuple f = item.cast<py::tuple>();
      TORCH_CHECK(f.size() == 13, "native_layers: a layer is 13 fields, got ", f.size());
      layers_.push_back(Layer{f[0].cast<at::Tensor>(), f[1].cast<double>(), product_of(f[2]),
                              product_of(f[3]), product_of(f[4]), product_of(f[5]),
                              f[6].cast<at::Tensor>(), f[7].cast<double>(), product_of(f[8]),
                              product_of(f[9]), product_of(f[10]), f[11].cast<int64_t>(), f[12].cast<double>()});
    }
  }

  // Every layer on hidden (1, q, H): keys and values written into keys[i] / values[i] (1, kv heads, capacity, D)
  // at starts[i] onwards; returns the last layer's output (1, q, H), before the final norm, and the inputs of the
  // layers named in `inputs` (ascending), as the Python loop keeps them for layer features (EAGLE-3's).
  std::tuple<at::Tensor, std::vector<at::Tensor>> forward(
      at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin, const c10::optional<at::Tensor>& mask,
      bool causal, bool gqa, bool pack, int64_t groups, const std::vector<at::Tensor>& keys,
      const std::vector<at::Tensor>& values, const std::vector<int64_t>& starts, const std::vector<int64_t>& inputs,
      bool kernel, const c10::optional<at::Tensor>& visible) {
    const size_t n = layers_.size();
    TORCH_CHECK(keys.size() == n && values.size() == n && starts.size() == n, "native_layers: ", n,
                " layers need as many key buffers, value buffers and starts, got ", keys.size(), ", ", values.size(),
                ", ", starts.size());
    TORCH_CHECK(!kernel || attend_ != nullptr, "native_layers: built without the attention kernel");
    const Plan plan{mask, causal, gqa, pack, groups, kernel, visible};
    std::vector<at::Tensor> kept;
    size_t next = 0;  // the next entry of `inputs` to keep
    for (size_t i = 0; i < n; ++i) {
      const Layer& layer = layers_[i];
      if (next < inputs.size() && inputs[next] == static_cast<int64_t>(i)) {
        kept.push_back(hidden);  // every layer makes a new tensor: the kept one is never written again
        ++next;
      }
      // hidden + attention(...), summed into the attention's fresh output (a + b == b + a, bit for bit): no new tensor
      SF_MARK("layer");
      const at::Tensor normed = norm(hidden, layer.norm1, layer.eps1);
      SF_MARK("norm1");
      hidden = combine_(attention(layer, normed, cos, sin, plan, keys[i], values[i], starts[i]), hidden, false);
      SF_MARK("residual1");
      hidden = mlp_block(layer, hidden);
    }
    SF_MARK("layers");
    TORCH_CHECK(next == inputs.size(), "native_layers: layer inputs must be ascending layer ids below ", n);
    ++calls_;
    return {hidden, kept};
  }

  // Every layer on the packed fed rows of several batch slots (a batched pass, specfamily.core.batch_target): hidden
  // (1, N, H), slot s's rows [first, first + counts[s]) in order; cos and sin (N, D) contiguous, by packed row;
  // keys[i] / values[i] layer i's slot buffers (slots, kv heads, capacity, D): slot s writes its keys and values at
  // lengths[s] onwards of buffer row slots[s] and attends (the attention kernel, one call a slot) over that row's
  // first lengths[s] + counts[s] entries, visible[s] (counts[s], lengths[s] + counts[s]) bool or None (every key).
  // Each row meets the products, norms, rope and attention of a batch-1 pass over its own slot (forward with the
  // kernel), so its bits are that pass's. Returns as forward does.
  std::tuple<at::Tensor, std::vector<at::Tensor>> forward_slots(
      at::Tensor hidden, const at::Tensor& cos, const at::Tensor& sin, const std::vector<at::Tensor>& keys,
      const std::vector<at::Tensor>& values, const std::vector<int64_t>& slots, const std::vector<int64_t>& lengths,
      const std::vector<int64_t>& counts, const std::vector<c10::optional<at::Tensor>>& visible,
      const std::vector<int64_t>& inputs) {
    const size_t n = layers_.size();
    TORCH_CHECK(attend_ != nullptr, "native_layers: built without the attention kernel");
    TORCH_CHECK(keys.size() == n && values.size() == n, "native_layers: ", n,
                " layers need as many key and value buffers, got ", keys.size(), ", ", values.size());
    const size_t b = slots.size();
    TORCH_CHECK(lengths.size() == b && counts.size() == b && visible.size() == b,
                "native_layers: every slot needs a length, a row count and a visibility");
    const int64_t rows = hidden.size(1);
    int64_t total = 0;
    for (size_t s = 0; s < b; ++s) {
      TORCH_CHECK(counts[s] >= 1 && lengths[s] >= 0, "native_layers: a slot feeds at least one row");
      total += counts[s];
    }
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && total == rows, "native_layers: hidden must be (1, ", total,
                ", H), got ", hidden.sizes());
    for (const at::Tensor* t : {&cos, &sin})
      TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == rows,
                  "native_layers: cos and sin must be contiguous float32 (", rows, ", D)");
    for (size_t i = 0; i < n; ++i)
      for (const at::Tensor* t : {&keys[i], &values[i]})
        TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->dim() == 4 && t->stride(3) == 1 &&
                        t->size(3) == layers_[i].head_dim && t->size(3) == cos.size(1),
                    "native_layers: a layer's slot buffers must be float32 CPU (slots, heads, capacity, D)");
    for (size_t s = 0; s < b; ++s)
      TORCH_CHECK(slots[s] >= 0 && slots[s] < keys[0].size(0) && lengths[s] + counts[s] <= keys[0].size(2),
                  "native_layers: slot ", slots[s], " does not fit its buffers");
    std::vector<at::Tensor> kept;
    size_t next = 0;
    for (size_t i = 0; i < n; ++i) {
      const Layer& layer = layers_[i];
      if (next < inputs.size() && inputs[next] == static_cast<int64_t>(i)) {
        kept.push_back(hidden);
        ++next;
      }
      hidden = combine_(slot_attention(layer, norm(hidden, layer.norm1, layer.eps1), cos, sin, keys[i], values[i],
                                       slots, lengths, counts, visible),
                        hidden, false);
      hidden = mlp_block(layer, hidden);
    }
    TORCH_CHECK(next == inputs.size(), "native_layers: layer inputs must be ascending layer ids below ", n);
    ++calls_;
    return {hidden, kept};
  }

  int64_t calls() const { return calls_; }
  int64_t fused_layers() const { return fused_; }
  size_t size() const { return layers_.size(); }

 private:
  // The stream kernel's products and norm, named to the profiler (no ATen op of their own; a flag test when off).
  at::Tensor linear(const at::Tensor& x, Product& p) const { return linears<1>(x, {&p})[0]; }

  // Products of one input in one parallel region (q, k and v; gate and up: the same bits as one call each).
  template <size_t N>
  std::array<at::Tensor, N> linears(const at::Tensor& x, const std::array<Product*, N>& products) const {
    RECORD_FUNCTION("specfamily::product", std::vector<c10::IValue>());
    std::vector<at::Tensor> made = products_(x, std::vector<Product*>(products.begin(), products.end()));
    std::array<at::Tensor, N> out;
    for (size_t i = 0; i < N; ++i) out[i] = std::move(made[i]);
    return out;
  }

  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) const {
    RECORD_FUNCTION("specfamily::norm", std::vector<c10::IValue>());
    return norm_(x, weight, eps);
  }

  // LeanLayer.mlp_block: hidden + down(silu(gate(x)) * up(x)), x = norm(hidden). The activation, the product and
  // the residual add run in place on the products' fresh outputs (the same kernels, the same bits; no allocation).
  at::Tensor mlp_block(const Layer& layer, const at::Tensor& hidden) const {
    const at::Tensor x = norm(hidden, layer.norm2, layer.eps2);
    SF_MARK("norm2");
    auto [gate, up] = linears<2>(x, {&layer.gate, &layer.up});
    SF_MARK("gate+up");
    at::silu_(gate);  // Python's order: gate, its activation, then up (each element's bits are the same either way)
    SF_MARK("silu");
    combine_(gate, up, true);
    SF_MARK("mul");
    at::Tensor down = linear(gate, layer.down);
    SF_MARK("down");
    return combine_(down, hidden, false);
  }

  // LeanLayer._attention with BufferedLayer.update's in-place write.
  at::Tensor attention(const Layer& layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const Plan& plan, const at::Tensor& key_buffer, const at::Tensor& value_buffer,
                       int64_t start) const {
    const int64_t batch = x.size(0), q_len = x.size(1), dim = layer.head_dim;
    const std::vector<int64_t> shape{batch, q_len, -1, dim};
    const auto [q_out, k_out, v_out] = linears<3>(x, {&layer.q, &layer.k, &layer.v});
    SF_MARK("qkv");
    at::Tensor query, key, value;
    if (const auto heads = direct(q_out, k_out, v_out, cos, sin, key_buffer, value_buffer, start, dim)) {
      // rotate_pair and BufferedLayer.update's writes in one pass, read and written through pointers (views and
      // narrows, nine ATen calls a layer, are what a cold main thread pays for): the products' rows as (heads, q,
      // D), the rotated queries in the strides the elementwise ops would give (B, heads, q, D) views of q_out, the
      // rotated keys and the values straight into their cache slots
      RECORD_FUNCTION("specfamily::rope_cache", std::vector<c10::IValue>());
      const auto [q_heads, kv_heads] = *heads;
      query = at::empty_strided({1, q_heads, q_len, dim}, {q_len * q_heads * dim, dim, q_heads * dim, 1},
                                q_out.options());
      const float *c = cos.data_ptr<float>(), *n = sin.data_ptr<float>();
      rotate_into(packed_rows(q_out, q_heads, dim), c, n, packed_rows(query, q_heads, dim));
      rotate_into(packed_rows(k_out, kv_heads, dim), c, n, slot_rows(key_buffer, start, q_len));
      copy_into(packed_rows(v_out, kv_heads, dim), slot_rows(value_buffer, start, q_len));
      ++fused_;
    } else {
      query = q_out.view(shape).transpose(1, 2);  // (B, heads, q, D)
      key = k_out.view(shape).transpose(1, 2);    // (B, kv heads, q, D)
      value = v_out.view(shape).transpose(1, 2);
      // rotate_pair: x * cos + roll(x, D / 2, -1) * signed sin, then the cache's writes
      query = (query * cos) + (query.roll({query.size(-1) / 2}, {-1}) * sin);
      key = (key * cos) + (key.roll({key.size(-1) / 2}, {-1}) * sin);
      key_buffer.narrow(2, start, q_len).copy_(key);
      value_buffer.narrow(2, start, q_len).copy_(value);
    }
    key = key_buffer.narrow(2, 0, start + q_len);
    value = value_buffer.narrow(2, 0, start + q_len);
    SF_MARK("rope+cache");
    if (plan.kernel) {
      const at::Tensor attended = attend_(query, key, value, plan.visible, layer.scaling);  // (1, q, H)
      SF_MARK("attention");
      at::Tensor projected = linear(attended, layer.o);
      SF_MARK("o");
      return projected;
    }
    if (plan.causal && key.size(2) > q_len) {
      key = key.narrow(2, 0, q_len);
      value = value.narrow(2, 0, q_len);
    }
    if (plan.pack) {  // (B, kv heads, groups * q, D): each key head's query heads as rows
      if (q_len != 1)
        query = query.reshape({batch, -1, plan.groups * q_len, dim});
      else if (query.size(1) != 1)  // transformers' pack_gqa
        query = query.reshape({batch, query.size(1) / plan.groups, plan.groups, query.size(3)});
    } else if (plan.groups > 1 && !plan.gqa) {
      key = repeat_kv(key, plan.groups);
      value = repeat_kv(value, plan.groups);
    }
    at::Tensor out = at::scaled_dot_product_attention(query, key, value, plan.mask, 0.0, plan.causal, layer.scaling,
                                                      plan.gqa);
    SF_MARK("attention");
    out = out.reshape({out.size(0), -1, q_len, value.size(-1)}).transpose(1, 2).contiguous();
    at::Tensor projected = linear(out.reshape({batch, q_len, -1}).contiguous(), layer.o);
    SF_MARK("o");
    return projected;
  }

  // forward_slots' attention: the products on every packed row, then per slot the rope, the cache writes into the
  // slot's buffer row and the attention kernel over that row; the slots' outputs in packed order, then o.
  at::Tensor slot_attention(const Layer& layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& key_buffer, const at::Tensor& value_buffer,
                            const std::vector<int64_t>& slots, const std::vector<int64_t>& lengths,
                            const std::vector<int64_t>& counts,
                            const std::vector<c10::optional<at::Tensor>>& visible) const {
    const int64_t rows = x.size(1), dim = layer.head_dim;
    const std::vector<int64_t> shape{1, rows, -1, dim};
    const auto [q_out, k_out, v_out] = linears<3>(x, {&layer.q, &layer.k, &layer.v});
    const at::Tensor query = q_out.view(shape).transpose(1, 2);  // (1, heads, N, D)
    const at::Tensor key = k_out.view(shape).transpose(1, 2);    // (1, kv heads, N, D)
    const at::Tensor value = v_out.view(shape).transpose(1, 2);
    TORCH_CHECK(Rows::fits(query) && Rows::fits(key) && Rows::fits(value),
                "native_layers: a batched pass's products must be float32 CPU rows");
    const at::Tensor rotated = at::empty_like(query);
    std::vector<at::Tensor> outs;
    outs.reserve(slots.size());
    int64_t first = 0;
    for (size_t s = 0; s < slots.size(); ++s) {
      const int64_t count = counts[s], length = lengths[s];
      const at::Tensor key_row = key_buffer.select(0, slots[s]).unsqueeze(0);  // (1, kv heads, capacity, D)
      const at::Tensor value_row = value_buffer.select(0, slots[s]).unsqueeze(0);
      const float* c = cos.data_ptr<float>() + first * dim;
      const float* n = sin.data_ptr<float>() + first * dim;
      const at::Tensor q = rotated.narrow(2, first, count);
      {
        RECORD_FUNCTION("specfamily::rope_cache", std::vector<c10::IValue>());
        rotate_into(Rows::of(query.narrow(2, first, count)), c, n, Rows::of(q));
        rotate_into(Rows::of(key.narrow(2, first, count)), c, n, Rows::of(key_row.narrow(2, length, count)));
        copy_into(Rows::of(value.narrow(2, first, count)), Rows::of(value_row.narrow(2, length, count)));
      }
      outs.push_back(attend_(q, key_row.narrow(2, 0, length + count), value_row.narrow(2, 0, length + count),
                             visible[s], layer.scaling));  // (1, count, heads * D)
      first += count;
    }
    ++fused_;
    return linear(outs.size() == 1 ? outs[0] : at::cat(outs, 1), layer.o);
  }

  // The rope and cache writes can run through pointers (attention's first path): the products' outputs (1, q, heads
  // * D) contiguous float32 CPU, cos and sin (q, D) elements contiguous, each buffer (1, kv heads, capacity, D) with
  // D contiguous and room for q entries at `start`. Returns (query heads, key/value heads), or nothing.
  static c10::optional<std::pair<int64_t, int64_t>> direct(const at::Tensor& q_out, const at::Tensor& k_out,
                                                          const at::Tensor& v_out, const at::Tensor& cos,
                                                          const at::Tensor& sin, const at::Tensor& key_buffer,
                                                          const at::Tensor& value_buffer, int64_t start, int64_t dim) {
    const int64_t q_len = q_out.size(1);
    for (const at::Tensor* t : {&q_out, &k_out, &v_out})
      if (!(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->dim() == 3 && t->size(0) == 1 &&
            t->size(1) == q_len && t->size(2) % dim == 0 && t->is_contiguous()))
        return c10::nullopt;
    for (const at::Tensor* t : {&cos, &sin})
      if (!(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == q_len * dim && t->size(-1) == dim))
        return c10::nullopt;
    const int64_t kv_heads = k_out.size(2) / dim;
    if (v_out.size(2) != k_out.size(2)) return c10::nullopt;
    for (const at::Tensor* t : {&key_buffer, &value_buffer})
      if (!(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->dim() == 4 && t->size(0) == 1 &&
            t->size(1) == kv_heads && t->size(3) == dim && t->stride(3) == 1 && start >= 0 &&
            start + q_len <= t->size(2)))
        return c10::nullopt;
    return std::make_pair(q_out.size(2) / dim, kv_heads);
  }

  // A contiguous (1, q, heads * D) tensor's rows as (heads, q, D).
  static Rows packed_rows(const at::Tensor& t, int64_t heads, int64_t dim) {
    return {t.data_ptr<float>(), heads, t.numel() / (heads * dim), dim, dim, heads * dim};
  }

  // A cache buffer's (1, kv heads, capacity, D) entries [start, start + rows).
  static Rows slot_rows(const at::Tensor& buffer, int64_t start, int64_t rows) {
    return {buffer.data_ptr<float>() + start * buffer.stride(2), buffer.size(1), rows, buffer.size(3),
            buffer.stride(1), buffer.stride(2)};
  }

  // transformers' repeat_kv: (B, kv heads, S, D) -> (B, kv heads * groups, S, D).
  static at::Tensor repeat_kv(const at::Tensor& x, int64_t groups) {
    const int64_t batch = x.size(0), heads = x.size(1), length = x.size(2), dim = x.size(3);
    return x.unsqueeze(2).expand({batch, heads, groups, length, dim}).reshape({batch, heads * groups, length, dim});
  }

  ProductsFn products_;
  NormFn norm_;
  AttendFn attend_;
  std::vector<Layer> layers_;
  int64_t calls_ = 0;
  mutable int64_t fused_ = 0;  // layers whose rope and cache writes ran as rotate_into / copy_into
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The lean forward's layer loop in C++, bit-identical to the Python loop (specfamily.runtime.native_layers)";
  py::class_<NativeLayers>(m, "NativeLayers")
      .def(py::init<const py::object&, const py::list&, const py::object&>(), py::arg("module"), py::arg("layers"),
           py::arg("attention") = py::none())
      .def("forward", &NativeLayers::forward, py::arg("hidden"), py::arg("cos"), py::arg("sin"), py::arg("mask"),
           py::arg("causal"), py::arg("gqa"), py::arg("pack"), py::arg("groups"), py::arg("keys"), py::arg("values"),
           py::arg("starts"), py::arg("inputs") = std::vector<int64_t>{}, py::arg("kernel") = false,
           py::arg("visible") = py::none())
      .def("forward_slots", &NativeLayers::forward_slots, py::arg("hidden"), py::arg("cos"), py::arg("sin"),
           py::arg("keys"), py::arg("values"), py::arg("slots"), py::arg("lengths"), py::arg("counts"),
           py::arg("visible"), py::arg("inputs") = std::vector<int64_t>{})
      .def_property_readonly("calls", &NativeLayers::calls)
      .def_property_readonly("fused_layers", &NativeLayers::fused_layers)
      .def("__len__", &NativeLayers::size);
  SF_EXPORT_MARKS(m);
}
