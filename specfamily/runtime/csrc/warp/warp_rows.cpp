// Temperature, top-k, softmax, top-p of a few rows of logits in one call (specfamily.runtime.warp_rows builds this).
//
// The same probabilities, bit for bit, as specfamily.core.sampling.warp's torch path: the dense steps are the same
// ATen ops (the division by the temperature, the softmax, the kept row's sum and the division by it), called from
// here without Python between them; what the torch path does in many small ops is one loop over a row:
//
// - top-k's k-th largest value (torch.topk's values[k - 1], ties counted) from the maxima of 64-token blocks: the
//   k-th largest block maximum b bounds it from below, so only the tokens >= b of the blocks whose maximum reaches b
//   are ranked (std::nth_element); then every token below it is set to -inf, as masked_fill(scores < kth, -inf).
// - top-p's threshold head (specfamily.core.top_p_head.threshold_head): the tokens with p >= c, c = 2^-10 times the
//   row's largest p, found from the blocks' maxima, sorted descending (ties in token order, a stable sort), their
//   cumulative sum accumulated in double and stored in float as torch's CPU cumsum does; a row is settled when that
//   mass reaches top_p + 16 float eps; a token is kept when the mass before it (cumulative - value, in float) is
//   below top_p rounded to float, as torch compares a float tensor with a Python float.
//
// A row this does not settle (a NaN or +inf among its scores, a head over 4,096 tokens, a head whose mass does not
// reach top_p, a vocabulary not a multiple of 64) is reported so, and the caller warps it the torch way.
//
// greedy_rows: each row's argmax as max(-1).indices gives it (the first of tied maxima; the first NaN where there is
// one), in two vectorised passes over the row (its maximum and whether it holds a NaN, then the first index equal to
// it) instead of ATen's scalar compare-and-keep loop: the greedy verification of a drafted pass's rows.

#include <torch/extension.h>

#include "../cpu_isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;         // top_p_head.BLOCK
constexpr double kRatio = 1.0 / 1024;  // top_p_head.RATIOS[0]
constexpr int64_t kMost = 4096;        // top_p_head.MOST
constexpr float kInf = std::numeric_limits<float>::infinity();

// The maxima of each row's 64-token blocks, (B, V / 64), NaN propagated (ATen's amax: vectorised).
torch::Tensor block_maxima(const torch::Tensor& x) { return x.view({x.size(0), -1, kBlock}).amax(-1); }

// The k-th largest of x (n values, none NaN), ties counted: torch.topk(x, k).values[k - 1]. tops: the maxima of
// x's blocks, or null when n is not a multiple of kBlock (then every value is ranked).
float kth_largest(const float* x, int64_t n, int64_t k, const float* tops, std::vector<float>& pool) {
  pool.clear();
  const int64_t blocks = n / kBlock;
  if (tops != nullptr && blocks > k) {
    std::vector<float> ranked(tops, tops + blocks);
    std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), std::greater<float>());
    const float bound = ranked[k - 1];  // k blocks hold a value >= bound: the k-th largest value is >= it
    for (int64_t b = 0; b < blocks; ++b) {
      if (!(tops[b] >= bound)) continue;
      for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
        if (x[i] >= bound) pool.push_back(x[i]);
      }
    }
  } else {
    pool.assign(x, x + n);
  }
  std::nth_element(pool.begin(), pool.begin() + (k - 1), pool.end(), std::greater<float>());
  return pool[k - 1];
}

// Whether a row may be ranked: no NaN (nth_element needs an order) and no +inf (its softmax is NaN).
bool rankable(const float* x, int64_t n, const float* tops) {
  const float* seen = tops != nullptr ? tops : x;  // a NaN or +inf anywhere is in its block's maximum
  const int64_t count = tops != nullptr ? n / kBlock : n;
  for (int64_t i = 0; i < count; ++i) {
    if (!(seen[i] < kInf)) return false;
  }
  return true;
}

// top-k in place on the rows of s (B, V) that are rankable; the others are marked not done.
void top_k_rows(torch::Tensor& scaled, int64_t top_k, bool* done) {
  const int64_t rows = scaled.size(0), vocab = scaled.size(1);
  torch::Tensor maxima = vocab % kBlock == 0 ? block_maxima(scaled).contiguous() : torch::Tensor();
  float* s = scaled.data_ptr<float>();
  std::vector<float> pool;
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * vocab;
    const float* tops = maxima.defined() ? maxima.data_ptr<float>() + r * (vocab / kBlock) : nullptr;
    done[r] = rankable(x, vocab, tops);
    if (!done[r]) continue;
    const float kth = kth_largest(x, vocab, top_k, tops, pool);
    for (int64_t i = 0; i < vocab; ++i) x[i] = x[i] < kth ? -kInf : x[i];  // masked_fill(scores < kth, -inf)
  }
}

struct Entry {
  float value;
  int64_t token;
};

// top_p_head.threshold_head on one row of probabilities p (tops: its blocks' maxima): the head's kept entries
// (descending, ties in token order) when it settles the row; false when it does not.
bool threshold_head(const float* p, int64_t n, const float* tops, double top_p, std::vector<Entry>& head) {
  const int64_t blocks = n / kBlock;
  float largest = tops[0];
  bool nan = false;  // amax would propagate it (an all -inf row's softmax): left to the torch path
  for (int64_t b = 0; b < blocks; ++b) {
    largest = std::max(largest, tops[b]);
    nan |= tops[b] != tops[b];
  }
  const float c = static_cast<float>(static_cast<double>(largest) * kRatio);  // exact: a power-of-two scaling
  if (nan || !(c > 0)) return false;
  head.clear();
  int64_t chosen = 0;
  for (int64_t b = 0; b < blocks; ++b) chosen += tops[b] >= c;
  if (chosen * kBlock > 16 * kMost) return false;
  for (int64_t b = 0; b < blocks; ++b) {
    if (!(tops[b] >= c)) continue;
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
      if (p[i] >= c) head.push_back({p[i], i});
    }
  }
  if (static_cast<int64_t>(head.size()) > kMost) return false;
  std::stable_sort(head.begin(), head.end(), [](const Entry& a, const Entry& b) { return a.value > b.value; });
  double running = 0;  // torch's CPU cumsum: accumulated in double, each prefix stored in float
  const float bound = static_cast<float>(top_p);  // a float tensor compared with a Python float: in float
  size_t kept = 0;
  float last = 0;
  for (const Entry& entry : head) {
    running += entry.value;
    last = static_cast<float>(running);
    if (last - entry.value < bound) head[kept++] = entry;  // (cumulative - value) < top_p: the mass before it
  }
  const double margin = 16 * static_cast<double>(std::numeric_limits<float>::epsilon());
  if (!(static_cast<double>(last) >= top_p + margin)) return false;
  head.resize(kept);
  return true;
}

// top-p on the rows of probs (B, V) still done: their kept values written into a zero row, divided by its sum.
torch::Tensor top_p_rows(const torch::Tensor& probs, double top_p, bool* done) {
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  torch::Tensor maxima = block_maxima(probs).contiguous();
  torch::Tensor kept = torch::zeros_like(probs);
  const float* p = probs.data_ptr<float>();
  float* out = kept.data_ptr<float>();
  std::vector<std::vector<Entry>> heads(rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (!done[r]) continue;
    const float* tops = maxima.data_ptr<float>() + r * (vocab / kBlock);
    done[r] = threshold_head(p + r * vocab, vocab, tops, top_p, heads[r]);
    for (const Entry& entry : done[r] ? heads[r] : std::vector<Entry>()) out[r * vocab + entry.token] = entry.value;
  }
  const torch::Tensor sums = kept.sum(-1, true).contiguous();  // the whole row's sum, in ATen's order
  for (int64_t r = 0; r < rows; ++r) {
    const float total = sums.data_ptr<float>()[r];
    for (const Entry& entry : done[r] ? heads[r] : std::vector<Entry>()) {
      out[r * vocab + entry.token] = entry.value / total;  // div_ by the sum: zeros stay zero
    }
  }
  return kept;
}

// (B, V) float32 logits -> ((B, V) probabilities, (B,) bool settled); the rows not settled hold no result.
std::tuple<torch::Tensor, torch::Tensor> warp_rows(const torch::Tensor& logits, double temperature, int64_t top_k,
                                                   double top_p) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat32 && logits.device().is_cpu(),
              "warp_rows takes (B, V) float32 CPU logits");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  torch::Tensor scaled = logits.div(temperature).contiguous();
  torch::Tensor settled = torch::ones({rows}, torch::kBool);
  bool* done = settled.data_ptr<bool>();
  if (top_k > 0 && top_k < vocab) top_k_rows(scaled, top_k, done);
  torch::Tensor probs = torch::softmax(scaled, -1);
  if (top_p >= 1.0) return {probs, settled};
  if (vocab % kBlock) {
    std::fill(done, done + rows, false);
    return {probs, settled};
  }
  return {top_p_rows(probs, top_p, done), settled};
}

// The first index of row (n floats) holding its maximum, or its first NaN: max(-1).indices of one row.
int64_t first_max_scalar(const float* row, int64_t n) {
  float best = row[0];
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) return i;
    if (row[i] > best) {
      best = row[i];
      at = i;
    }
  }
  return at;
}

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx512f")
// first_max_scalar's index: the maximum and a NaN's presence over 16-float vectors, then the first vector holding
// the maximum (or a NaN), its first such lane. Vectors compare -0 and +0 equal, as the scalar loop keeps the first.
int64_t first_max_avx512(const float* row, int64_t n) {
  const int64_t whole = n - n % 16;
  if (whole == 0) return first_max_scalar(row, n);
  __m512 top = _mm512_loadu_ps(row);
  __mmask16 nan = 0;
  for (int64_t i = 0; i < whole; i += 16) {
    const __m512 v = _mm512_loadu_ps(row + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    top = _mm512_max_ps(top, v);
  }
  float best = _mm512_reduce_max_ps(top);
  for (int64_t i = whole; i < n; ++i) {
    if (std::isnan(row[i])) nan = 1;
    best = row[i] > best ? row[i] : best;
  }
  if (nan) return first_max_scalar(row, n);  // the first NaN
  const __m512 wanted = _mm512_set1_ps(best);
  for (int64_t i = 0; i < whole; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), wanted, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (int64_t i = whole; i < n; ++i)
    if (row[i] == best) return i;
  return 0;  // not reached: best is one of the row's values
}
#pragma GCC pop_options
#endif

// (B, V) float32 CPU logits -> (B,) int64: each row's max(-1).indices.
torch::Tensor greedy_rows(const torch::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat32 && logits.device().is_cpu() &&
                  logits.size(1) > 0,
              "greedy_rows takes (B, V) float32 CPU logits, V > 0");
  const torch::Tensor rows = logits.contiguous();
  const int64_t count = rows.size(0), vocab = rows.size(1);
  torch::Tensor out = torch::empty({count}, torch::kInt64);
  const float* x = rows.data_ptr<float>();
  int64_t* at = out.data_ptr<int64_t>();
#ifdef SF_X86_SIMD
  static const bool wide = specfamily::cpu_sets().avx512f;
#else
  static const bool wide = false;
#endif
  for (int64_t r = 0; r < count; ++r) {
#ifdef SF_X86_SIMD
    if (wide) {
      at[r] = first_max_avx512(x + r * vocab, vocab);
      continue;
    }
#endif
    at[r] = first_max_scalar(x + r * vocab, vocab);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Temperature, top-k, softmax and top-p's threshold head of a few rows (specfamily.runtime.warp_rows)";
  m.def("warp_rows", &warp_rows, "(B, V) float32 logits -> (probabilities (B, V), settled (B,) bool)",
        py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"));
  m.def("greedy_rows", &greedy_rows, "(B, V) float32 logits -> (B,) int64: each row's max(-1).indices",
        py::arg("logits"));
}
