// Dispatcher of masked_softmax_kernel: picks the tier for each call and holds the generic
// ATen-only tier (correct for every dtype; the fallback and the reference).
#include "masked_softmax_kernel_dispatch.hpp"

#include <c10/util/Exception.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "cpu_features.hpp"

namespace masked_softmax_kernel_cpu {

namespace {

// Below this many elements (rows * last dim) the generic tier is used when no
// tier is forced. Measured on the development machine (Xeon with AVX512, one
// thread, out= given): rms_norm 1x1 generic 13 us vs avx512 2.7 us, 1x512
// 14 vs 2.8, 4x4096 22 vs 5; softmax 1x8 5.6 vs 2.4, 4x4096 16 vs 9. The ATen
// tier pays for several temporaries, so the SIMD tiers win from the smallest
// size and the thresholds only send empty problems to it. Raise an op's value
// if benchmark_cpu.py shows the kernel slower than the baseline on small inputs.
int64_t generic_threshold(const std::string& op) {
  if (op == "masked_softmax") return 1;

  return 1;
}

std::string lower(const char* text) {
  std::string s(text);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool parse_tier(const std::string& s, Tier* out) {
  if (s == "generic") { *out = Tier::Generic; return true; }
  if (s == "avx2") { *out = Tier::AVX2; return true; }
  if (s == "avx512") { *out = Tier::AVX512; return true; }
  return false;
}

// KERNEL_CPU_MASK=avx512 (or avx2, comma separated) hides CPU features so a
// machine can test how the package behaves on an older CPU. Hiding avx2 also
// hides avx512 (no CPU has AVX512 without AVX2).
bool masked(Tier tier) {
  const char* env = std::getenv("KERNEL_CPU_MASK");
  if (env == nullptr || *env == '\0') return false;
  const std::string mask = "," + lower(env) + ",";
  const bool hide_avx512 = mask.find(",avx512,") != std::string::npos;
  const bool hide_avx2 = mask.find(",avx2,") != std::string::npos;
  if (tier == Tier::AVX512) return hide_avx512 || hide_avx2;
  if (tier == Tier::AVX2) return hide_avx2;
  return false;
}

// Why `tier` cannot run here, or "" when it can.
std::string unavailable_reason(Tier tier) {
  const CpuFeatures& f = cpu_features();
  switch (tier) {
    case Tier::Generic:
      return "";
    case Tier::AVX2:
      if (!KERNEL_HAVE_AVX2) return "this package was generated without the avx2 tier";
      if (masked(tier)) return "KERNEL_CPU_MASK hides it";
      if (!f.avx2_tier()) return "this CPU (or its OS) lacks AVX2/FMA/F16C";
      return "";
    case Tier::AVX512:
      if (!KERNEL_HAVE_AVX512) return "this package was generated without the avx512 tier";
      if (masked(tier)) return "KERNEL_CPU_MASK hides it";
      if (!f.avx512_tier()) return "this CPU (or its OS) lacks AVX512 F/BW/VL/DQ/BF16";
      return "";
  }
  return "unknown tier";
}

std::string joined_tiers() {
  std::ostringstream out;
  bool first = true;
  for (Tier t : available_tiers()) {
    out << (first ? "" : ", ") << tier_name(t);
    first = false;
  }
  return out.str();
}

}  // namespace

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::Generic: return "generic";
    case Tier::AVX2: return "avx2";
    case Tier::AVX512: return "avx512";
  }
  return "unknown";
}

std::vector<Tier> available_tiers() {
  std::vector<Tier> tiers;
  for (Tier t : {Tier::Generic, Tier::AVX2, Tier::AVX512}) {
    if (unavailable_reason(t).empty()) tiers.push_back(t);
  }
  return tiers;
}

Tier pick_tier(const std::string& op, int64_t rows, int64_t cols) {
  const char* forced = std::getenv("KERNEL_CPU_ISA");  // read per call on purpose
  if (forced != nullptr && *forced != '\0') {
    Tier tier;
    TORCH_CHECK(parse_tier(lower(forced), &tier), "KERNEL_CPU_ISA='", forced,
                "' is not a tier of masked_softmax_kernel. Use generic, avx2 or avx512, or unset it to let "
                "the dispatcher choose.");
    const std::string reason = unavailable_reason(tier);
    TORCH_CHECK(reason.empty(), "KERNEL_CPU_ISA=", tier_name(tier), " asks for the ",
                tier_name(tier), " tier of masked_softmax_kernel, but ", reason,
                ". Tiers available here: ", joined_tiers(),
                ". Set KERNEL_CPU_ISA to one of them or unset it.");
    return tier;
  }
  if (rows * cols < generic_threshold(op)) return Tier::Generic;
  return available_tiers().back();
}

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default: TORCH_CHECK(false, "masked_softmax_kernel: dtype ", t.scalar_type(), " has no SIMD kernel");
  }
  return DType::F32;
}

namespace generic {
// masked_softmax: the generic tier is the package's correctness reference and the fallback for
// small inputs: write it with ATen ops in fp32 and copy_ the result into the output(s)
// (one rounding to their dtype), e.g. out.copy_(f(x.to(at::kFloat))).
void masked_softmax(at::Tensor& out, const at::Tensor& x, const at::Tensor& mask, double scale) {
  // In float64, as the baseline's reference; a row with no kept element is 0.
  const at::Tensor s = (x.to(at::kDouble) * scale).masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  out.copy_(at::softmax(s, -1).nan_to_num(0.0).to(at::kFloat));
}

}  // namespace generic

}  // namespace masked_softmax_kernel_cpu
