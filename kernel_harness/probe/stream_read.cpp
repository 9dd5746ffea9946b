// A streaming read for memory-bandwidth floors (kernel_harness.stream_reader).
//
// Built like peak_probe.cpp, plus -fopenmp: plain g++, no torch
// headers, no -march flags (the AVX2 loop carries its own target attribute and
// runs only where the CPU has AVX2), loaded with ctypes.
//
// Why not torch's sum alone? A floor must be the fastest way we know to read
// the bytes, or every ratio to it flatters the kernel. On a Zen 4 EPYC VM
// (2026-12-05, 2 threads, 32 MiB fp32 buffers in rotation from memory,
// shuffled rounds) torch's sum, one sequential stream per thread, read
// 0.71-0.92x what this read (four streams per thread in lockstep) did, in
// memory phases of 24-53 GB/s by the sum; decode GEMVs that read a few rows at once
// measured "faster than the floor" against it. So each thread here reads its
// part of every buffer as kStreams equal sub-ranges, a line of each per step.
//
// Threads are OpenMP's, unlike peak_probe.cpp's: loaded after torch (the
// Python side imports torch first), libgomp.so.1 resolves to the copy torch
// already loaded, so the floor runs on the very thread pool the kernels and
// torch's sum use. A pool of its own measured bimodal on 2 vCPUs: 0.6-0.8x
// or 1.2-1.35x torch's sum from round to round, as libgomp's threads, still
// spinning after the previous side's calls, took its worker's CPU. (A torch
// whose libgomp carries another soname leaves the reader a runtime of its
// own and that interaction back; the floor still keeps the faster reader.)
//
// The result is the sum, modulo 2^64, of the buffers' little-endian 64-bit
// words (a last partial word zero-padded), so a test can check that every byte
// was read exactly once.

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kStreams = 4;           // lockstep sub-ranges per thread
constexpr int64_t kLine = 64;         // bytes of each sub-range per step
constexpr int64_t kSplitAlign = 256;  // parts start on multiples of this (words stay aligned)

uint64_t words_scalar(const unsigned char* p, int64_t n) {
  uint64_t sum = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    sum += w;
  }
  if (i < n) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, static_cast<size_t>(n - i));
    sum += w;
  }
  return sum;
}

// kStreams sub-ranges of `len` bytes each (a multiple of kLine), starting `len` apart.
__attribute__((target("avx2"))) uint64_t lockstep_avx2(const unsigned char* p, int64_t len) {
  __m256i acc[kStreams][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_si256();
  for (int64_t i = 0; i < len; i += kLine) {
    for (int s = 0; s < kStreams; ++s) {
      const unsigned char* q = p + s * len + i;
      acc[s][0] = _mm256_add_epi64(acc[s][0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      acc[s][1] = _mm256_add_epi64(acc[s][1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)));
    }
  }
  alignas(32) uint64_t lanes[4];
  uint64_t sum = 0;
  for (auto& a : acc) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(a[0], a[1]));
    sum += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
  return sum;
}

uint64_t lockstep_sse2(const unsigned char* p, int64_t len) {
  __m128i acc[kStreams][4];
  for (auto& a : acc) a[0] = a[1] = a[2] = a[3] = _mm_setzero_si128();
  for (int64_t i = 0; i < len; i += kLine) {
    for (int s = 0; s < kStreams; ++s) {
      const __m128i* q = reinterpret_cast<const __m128i*>(p + s * len + i);
      for (int v = 0; v < 4; ++v) acc[s][v] = _mm_add_epi64(acc[s][v], _mm_loadu_si128(q + v));
    }
  }
  alignas(16) uint64_t lanes[2];
  uint64_t sum = 0;
  for (auto& a : acc) {
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                    _mm_add_epi64(_mm_add_epi64(a[0], a[1]), _mm_add_epi64(a[2], a[3])));
    sum += lanes[0] + lanes[1];
  }
  return sum;
}

// One thread's part [begin, end) of a buffer: the lockstep body, then the rest word by word.
uint64_t read_part(const unsigned char* base, int64_t begin, int64_t end, bool avx2) {
  const int64_t len = (end - begin) / (kStreams * kLine) * kLine;  // bytes per sub-range
  uint64_t sum = 0;
  if (len > 0) sum = avx2 ? lockstep_avx2(base + begin, len) : lockstep_sse2(base + begin, len);
  const int64_t done = begin + kStreams * len;
  return sum + words_scalar(base + done, end - done);
}

// Thread t of `threads`' share of buffer b: parts split on kSplitAlign boundaries.
uint64_t read_share(const unsigned char* base, int64_t n, int t, int threads, bool avx2) {
  const int64_t per = (n / threads + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  const int64_t begin = std::min<int64_t>(n, t * per);
  const int64_t end = t == threads - 1 ? n : std::min<int64_t>(n, begin + per);
  return begin < end ? read_part(base, begin, end, avx2) : 0;
}

}  // namespace

extern "C" {

// Reads `count` buffers (ptrs[i], sizes[i] bytes) once on `threads` OpenMP threads; returns the
// words' sum (see the top).
uint64_t kh_stream_read(const void* const* ptrs, const int64_t* sizes, int count, int threads) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  const auto* bufs = reinterpret_cast<const unsigned char* const*>(ptrs);
  threads = std::max(1, threads);
  uint64_t sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int b = 0; b < count; ++b) sum += read_share(bufs[b], sizes[b], t, nt, avx2);
  }
  return sum;
}

// Lockstep sub-ranges per thread (reported with the floor).
int kh_stream_read_streams() { return kStreams; }

}  // extern "C"
