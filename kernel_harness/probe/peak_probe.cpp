// Peak arithmetic throughput probe for the machine profile (kernel_harness.machine).
//
// Built by machine.py with plain `g++ -O2 -shared -fPIC -pthread` (no torch
// headers, no -march flags) and loaded with ctypes.  Every SIMD function carries
// its own `target` attribute, so the library loads on any x86-64 CPU; the Python
// side only calls a kernel after checking /proc/cpuinfo, because calling an
// AVX512 function on a CPU without it raises SIGILL.
//
// Each kernel runs many INDEPENDENT accumulator chains: an FMA has a latency of
// ~4 cycles and up to two issue ports, so fewer than ~8 chains would measure
// latency, not throughput.  The loop bodies touch no memory, so the result is
// the compute ceiling of the roofline, not what a real kernel reaches.
//
// Threads are std::thread rather than OpenMP on purpose: torch ships its own
// libgomp and loading a second OpenMP runtime into the same process is a
// known source of oversubscription and crashes.

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int kChains = 12;

// ---- fp32 FMA, 512-bit: 12 chains x 16 lanes x 2 flops per iteration ----
__attribute__((target("avx512f"))) float fma512_loop(long iters) {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(1.0f + 0.001f * k);
  const __m512 mul = _mm512_set1_ps(0.999999f);
  const __m512 add = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_fmadd_ps(acc[k], mul, add);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < kChains; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}
constexpr double kFma512Flops = kChains * 16.0 * 2.0;

// ---- fp32 FMA, 256-bit (AVX2 + FMA) ----
__attribute__((target("avx2,fma"))) float fma256_loop(long iters) {
  __m256 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm256_set1_ps(1.0f + 0.001f * k);
  const __m256 mul = _mm256_set1_ps(0.999999f);
  const __m256 add = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) acc[k] = _mm256_fmadd_ps(acc[k], mul, add);
  }
  __m256 sum = acc[0];
  for (int k = 1; k < kChains; ++k) sum = _mm256_add_ps(sum, acc[k]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  float total = 0.0f;
  for (float v : out) total += v;
  return total;
}
constexpr double kFma256Flops = kChains * 8.0 * 2.0;

// ---- AVX512-BF16 dot product: vdpbf16ps does 16 lanes x 2 bf16 pairs x 2 flops ----
// More chains than the FMA loops: VDPBF16PS's latency is longer. On a Zen 5 EPYC
// (one thread) 12 chains reached 486 GFLOP/s, 16 to 24 chains 524, which a
// 12 x 32 GEMM tile with 24 accumulators then exceeded the 12-chain figure by.
constexpr int kDotChains = 24;
__attribute__((target("avx512f,avx512bf16"))) float bf16dot_loop(long iters) {
  __m512 acc[kDotChains];
  for (int k = 0; k < kDotChains; ++k) acc[k] = _mm512_setzero_ps();
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int k = 0; k < kDotChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < kDotChains; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}
constexpr double kBf16DotFlops = kDotChains * 16.0 * 2.0 * 2.0;

// ---- AMX bf16: four 16x16 fp32 accumulator tiles fed by two A and two B tiles ----
// One tdpbf16ps computes C[16x16] += A[16x32] * B[32x16] = 16*16*32*2 flops.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(long iters) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3c00;  // bf16 ~ 0.0078
  alignas(64) float result[16 * 16];
  std::memset(result, 0, sizeof(result));
  _tile_loadd(0, result, 64);
  _tile_loadd(1, result, 64);
  _tile_loadd(2, result, 64);
  _tile_loadd(3, result, 64);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, result, 64);
  _tile_release();
  return result[0];
}
constexpr double kAmxFlops = 4.0 * 16 * 16 * 32 * 2;

enum Kind { kFma512 = 0, kFma256 = 1, kBf16Dot = 2, kAmx = 3 };

float run_kind(int kind, long iters) {
  switch (kind) {
    case kFma512: return fma512_loop(iters);
    case kFma256: return fma256_loop(iters);
    case kBf16Dot: return bf16dot_loop(iters);
    case kAmx: return amx_loop(iters);
  }
  return 0.0f;
}

double flops_per_iter(int kind) {
  switch (kind) {
    case kFma512: return kFma512Flops;
    case kFma256: return kFma256Flops;
    case kBf16Dot: return kBf16DotFlops;
    case kAmx: return kAmxFlops;
  }
  return 0.0;
}

volatile float g_sink = 0.0f;  // keeps the loops from being optimised away

double seconds_now() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Runs `iters` iterations on each of `threads` threads started together; returns wall seconds.
double timed_run(int kind, int threads, long iters) {
  if (threads <= 1) {
    const double t0 = seconds_now();
    g_sink = g_sink + run_kind(kind, iters);
    return seconds_now() - t0;
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<float> sinks(threads, 0.0f);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      sinks[t] = run_kind(kind, iters);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const double t0 = seconds_now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const double elapsed = seconds_now() - t0;
  for (float s : sinks) g_sink = g_sink + s;
  return elapsed;
}

}  // namespace

extern "C" {

// Asks Linux for permission to use the AMX tile data state (required since 5.16;
// without it the first tile instruction raises SIGILL).  Returns 0 on success.
int kh_request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return static_cast<int>(syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata));
#else
  return -1;
#endif
}

// Peak GFLOP/s of `kind` on `threads` threads, each running for about
// `target_seconds`; best of `repeats` timed runs after a calibration run.
// Returns a negative value for an unknown kind.
double kh_peak_gflops(int kind, int threads, double target_seconds, int repeats) {
  if (kind < kFma512 || kind > kAmx) return -1.0;
  if (threads < 1) threads = 1;
  if (repeats < 1) repeats = 1;
  // Calibrate on one thread: grow the iteration count until a run takes >= 5 ms.
  long iters = 1000;
  double elapsed = timed_run(kind, 1, iters);
  while (elapsed < 0.005 && iters < (1L << 40)) {
    iters *= 4;
    elapsed = timed_run(kind, 1, iters);
  }
  const double per_iter = elapsed / static_cast<double>(iters);
  long target_iters = static_cast<long>(target_seconds / (per_iter > 0 ? per_iter : 1e-9));
  if (target_iters < 1000) target_iters = 1000;
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const double secs = timed_run(kind, threads, target_iters);
    const double gflops = flops_per_iter(kind) * static_cast<double>(target_iters) * threads / secs / 1e9;
    if (gflops > best) best = gflops;
  }
  return best;
}

}  // extern "C"
