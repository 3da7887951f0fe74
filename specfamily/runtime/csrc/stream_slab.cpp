// Memory for the stream kernel's packed weights (stream_pack.cpp's pack): 2 MB-aligned slabs the kernel asks the OS to
// back with huge pages (madvise MADV_HUGEPAGE; Linux with transparent huge pages in "madvise" or "always" mode).
//
// A pass streams every packed weight once, in up to a few hundred products of 0.4-113 MB each. With 4 KB pages every
// product walks the page tables anew for each 4 KB it reads; with 2 MB pages one entry covers 512 times as much, and
// a pass of SmolLM2's 30 layers measured 2-3% faster (docs/pass-goals.md, "Huge pages for the packed weights"). Weights
// smaller than half a slab are carved out of a shared slab in the order they are packed (a pass's order: the warm-up
// pass packs them), so a layer's small products sit next to each other instead of each rounding up to 2 MB; larger
// ones get a slab of their own. A slab is freed with the last packed weight carved from it (the slab still open for
// carving is kept until a new one replaces it). Where the
// OS gives no huge pages the memory is ordinary memory and everything else is the same.

#include <torch/extension.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "stream_pack.h"

namespace specfamily::stream {

namespace {

constexpr int64_t kHuge = int64_t{2} << 20;     // bytes of a huge page: slabs start and end on one
constexpr int64_t kSlabBytes = int64_t{32} << 20;  // a shared slab; weights of half of it or more get their own
constexpr int64_t kAlign = 64;                  // bytes: each carved weight starts on a cache line

// 2 MB-aligned memory of at least `bytes` (rounded up to whole huge pages), huge pages asked for; freed with the last
// owner.
std::shared_ptr<void> slab(int64_t bytes) {
  const int64_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  void* memory = std::aligned_alloc(kHuge, static_cast<size_t>(size));
  TORCH_CHECK(memory != nullptr, "stream_linear: could not allocate ", size, " bytes for packed weights");
#ifdef __linux__
  madvise(memory, static_cast<size_t>(size), MADV_HUGEPAGE);  // a hint: without huge pages the memory still works
#endif
  return std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
}

// The slab weights are carved from now, its size and how many of its bytes are taken.
struct OpenSlab {
  std::mutex lock;
  std::shared_ptr<void> memory;
  int64_t size = 0, used = 0;
};

OpenSlab& open_slab() {
  static OpenSlab* open = new OpenSlab();  // never destroyed: freeing memory at exit would race the interpreter's end
  return *open;
}

// A float32 tensor of `numel` over `memory` + `offset` bytes that keeps the memory alive (each packed weight is a
// tensor of its own, not a view of a shared one: made in or out of inference mode, as its caller is).
at::Tensor over(const std::shared_ptr<void>& memory, int64_t offset, int64_t numel) {
  char* start = static_cast<char*>(memory.get()) + offset;
  return at::from_blob(start, {numel}, [memory](void*) {}, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

at::Tensor packed_storage(int64_t numel) {
  const int64_t bytes = numel * static_cast<int64_t>(sizeof(float));
  if (bytes * 2 >= kSlabBytes) return over(slab(bytes), 0, numel);
  const int64_t take = (bytes + kAlign - 1) / kAlign * kAlign;
  OpenSlab& open = open_slab();
  std::lock_guard<std::mutex> guard(open.lock);
  if (!open.memory || open.used + take > open.size) {
    open.memory = slab(kSlabBytes);
    open.size = kSlabBytes;
    open.used = 0;
  }
  at::Tensor out = over(open.memory, open.used, numel);
  open.used += take;
  return out;
}

}  // namespace specfamily::stream
