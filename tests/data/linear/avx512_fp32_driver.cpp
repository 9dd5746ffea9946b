// Runs the generated AVX512 unit's linear on fp32 and fp16 data without torch, on a
// CPU with AVX512F/BW/VL/DQ: those dtypes' paths use no AVX512-BF16 instruction, so
// a CPU whose dispatcher refuses the avx512 tier (no AVX512-BF16) still checks
// the 16-lane code (tails, panels, M below MR). Exact inputs (small integers
// times powers of two): every result must equal the double sum rounded once.
// Built by tests/test_gemm_linear.py with the unit's own flags.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "harness_gemm_tiers.hpp"

using namespace harness_gemm_cpu;

static uint16_t to_half(float f) {  // exact for the small values used here
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

template <typename T>
static int run(const char* what, DType dt, T (*conv)(float), float (*back)(T)) {
  const int shapes[][3] = {{1, 1, 1},  {1, 37, 7},   {2, 33, 4109}, {4, 64, 256},  {7, 97, 129}, {9, 31, 17},
                           {13, 65, 100}, {33, 130, 47}, {100, 96, 300}, {12, 32, 16}, {25, 70, 33}};
  int bad = 0;
  std::srand(1);
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    std::vector<float> xf(m * k), wf(n * k), bf(n);
    for (auto& v : xf) v = (std::rand() % 17 - 8) / 8.0f;
    for (auto& v : wf) v = (std::rand() % 17 - 8) / 64.0f;
    for (auto& v : bf) v = (std::rand() % 17 - 8) / 8.0f;
    std::vector<T> x(m * k), w(n * k), b(n), out(m * n), pk(n * k);
    for (int i = 0; i < m * k; ++i) x[i] = conv(xf[i]);
    for (int i = 0; i < n * k; ++i) w[i] = conv(wf[i]);
    for (int i = 0; i < n; ++i) b[i] = conv(bf[i]);
    for (int j0 = 0; j0 < n; j0 += 32) {  // prepack's layout: 32-column panels, k-major
      const int wp = std::min(32, n - j0);
      for (int kk = 0; kk < k; ++kk)
        for (int j = 0; j < wp; ++j) pk[j0 * k + kk * wp + j] = w[(j0 + j) * k + kk];
    }
    for (int packed = 0; packed < 2; ++packed) {
      for (int hb = 0; hb < 2; ++hb) {
        avx512::linear(dt, out.data(), x.data(), packed ? pk.data() : w.data(), hb ? b.data() : nullptr, packed, m, n, k);
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            double r = hb ? bf[j] : 0.0;
            for (int kk = 0; kk < k; ++kk) r += static_cast<double>(xf[i * k + kk]) * wf[j * k + kk];
            const float want = back(conv(static_cast<float>(r)));
            if (back(out[i * n + j]) != want) {
              if (bad < 5)
                std::printf("%s M=%d N=%d K=%d packed=%d bias=%d at [%d, %d]: %g, expected %g\n", what, m, n, k,
                            packed, hb, i, j, back(out[i * n + j]), want);
              ++bad;
            }
          }
        }
      }
    }
  }
  std::printf("%s: %d wrong elements\n", what, bad);
  return bad;
}

static float f_id(float v) { return v; }
static fp16_t f_half(float v) { return fp16_t{to_half(v)}; }
static float half_back(fp16_t v) {
  _Float16 h;
  std::memcpy(&h, &v.bits, 2);
  return static_cast<float>(h);
}

int main() {
  const int bad = run<float>("fp32", DType::F32, f_id, f_id) + run<fp16_t>("fp16", DType::F16, f_half, half_back);
  return bad == 0 ? 0 : 1;
}
