// A plain C++ rms_norm (fp32, rows threaded with at::parallel_for) with an optional
// busy spin in its body: after computing, the call spins until it has taken
// (1 + spin_fraction) times the compute's own time.  The spin keeps the CPU, as a
// slower kernel would, and is proportional to the call's own time, so the slowdown
// is the same fraction on a quiet and on a slower machine.  Used by
// scripts/bench_harness_precision.py --mode slower (bk_native_spin vs bk_native).
#include <torch/extension.h>

#include <chrono>
#include <cmath>

namespace {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double spin_fraction) {
  const auto start = std::chrono::steady_clock::now();
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "bk_native.rms_norm: fp32 only");
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  const int64_t cols = xc.size(-1);
  const int64_t rows = cols ? xc.numel() / cols : 0;
  auto out = torch::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * cols;
      // eight partial sums: the compiler vectorises this loop at -O3
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8)
        for (int j = 0; j < 8; ++j) part[j] += row[c + j] * row[c + j];
      double ss = 0.0;
      for (int j = 0; j < 8; ++j) ss += part[j];
      for (; c < cols; ++c) ss += static_cast<double>(row[c]) * row[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / cols + eps));
      float* dst = op + r * cols;
      for (int64_t c = 0; c < cols; ++c) dst[c] = row[c] * inv * wp[c];
    }
  });
  if (spin_fraction > 0.0) {
    const auto took = std::chrono::steady_clock::now() - start;
    const auto until = start + took + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          took * spin_fraction);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "rms_norm with an optional spin (fraction of its own time)");
}
