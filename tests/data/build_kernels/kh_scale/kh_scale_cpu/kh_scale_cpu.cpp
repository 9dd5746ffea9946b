// Dispatcher + generic ATen tier for the test kernel.
#include <ATen/ATen.h>

#include <cstdlib>
#include <string>

#include "kh_scale_cpu.hpp"

namespace {
// Below this many elements the SIMD tiers are not worth their call overhead.
constexpr int64_t kMinSimdElements = 64;

std::string requested_tier() {
  const char* env = std::getenv("KERNEL_CPU_ISA");
  if (env != nullptr && *env != '\0') return env;
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "generic";
}
}  // namespace

std::string active_tier() { return requested_tier(); }

at::Tensor scale(const at::Tensor& x, double alpha) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "scale: x must be float32, got ", x.scalar_type());
  at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input);
  const std::string tier = requested_tier();
  if (input.numel() < kMinSimdElements && std::getenv("KERNEL_CPU_ISA") == nullptr) {
    out.copy_(input * alpha);
  } else if (tier == "avx512") {
    kh_scale_cpu::scale_avx512(input.data_ptr<float>(), out.data_ptr<float>(), input.numel(),
                               static_cast<float>(alpha));
  } else if (tier == "avx2") {
    kh_scale_cpu::scale_avx2(input.data_ptr<float>(), out.data_ptr<float>(), input.numel(),
                             static_cast<float>(alpha));
  } else {
    out.copy_(input * alpha);
  }
  return out;
}

int64_t omp_threads_in_region() { return kh_scale_cpu::omp_threads_avx512(); }
