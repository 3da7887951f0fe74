// Timestamps at the steps of a pass, for benchmarks/pass_marks.py: compiled out (SF_MARK does nothing, no function
// is exported) unless SF_PASS_MARKS is defined, which the benchmark does in a copy of these sources it builds apart.
// Each extension that includes this keeps its own log of (step name, seconds); `_pass_marks()` hands it over and
// empties it.

#pragma once

#ifdef SF_PASS_MARKS

#include <torch/extension.h>

#include <chrono>
#include <utility>
#include <vector>

namespace specfamily::marks {

inline std::vector<std::pair<const char*, double>>& log() {
  static std::vector<std::pair<const char*, double>> entries;
  return entries;
}

inline void mark(const char* step) {
  log().emplace_back(step, std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

inline py::list take() {
  py::list out;
  for (const auto& [step, seconds] : log()) out.append(py::make_tuple(step, seconds));
  log().clear();
  return out;
}

}  // namespace specfamily::marks

#define SF_MARK(step) ::specfamily::marks::mark(step)
#define SF_EXPORT_MARKS(m) (m).def("_pass_marks", &::specfamily::marks::take, "the marks since the last call")

#else

#define SF_MARK(step) ((void)0)
#define SF_EXPORT_MARKS(m) ((void)0)

#endif
