// Building blocks of the window attention kernel (window_attention.cpp): fp32 vectors of 16
// lanes in GCC's vector extensions, bf16 conversions, a vectorised exp, register-blocked matrix
// micro-kernels sized for a window's small products, a 16 x 16 in-register transpose, and the
// task split over PyTorch's OpenMP threads. Header-only: everything here is inlined into the
// two entry points' loops.

#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WA_X86 1
#endif

namespace wa {

constexpr int W = 16;  // floats per vector
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

inline vf load(const float* p) { vf r; std::memcpy(&r, p, sizeof r); return r; }
inline void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }
// Not vf{} + x: without -ffast-math that is an add of +0.0 (not an identity for -0.0) before the broadcast.
inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// Horizontal reductions: four halving shuffles with constant lane orders.
constexpr vi kFold[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
                         {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
                         {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
                         {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}};
inline float hmax(vf x) {
  for (const vi& idx : kFold) { vf y = __builtin_shuffle(x, idx); x = x > y ? x : y; }
  return x[0];
}
inline float hsum(vf x) {
  for (const vi& idx : kFold) x += __builtin_shuffle(x, idx);
  return x[0];
}

// bf16 is kept as its 16 bits, the upper half of an fp32 of the same value: widening is a shift,
// narrowing rounds to nearest even (as PyTorch's own conversion does) and keeps NaNs quiet NaNs.
using bf16 = uint16_t;
typedef uint16_t vh __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(64)));

inline float widen(bf16 x) {
  const uint32_t b = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline bf16 narrow(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return static_cast<bf16>(x != x ? (b >> 16) | 0x40 : (b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}
inline vf widen(const bf16* p) {
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vu b = __builtin_convertvector(h, vu) << 16;
  vf f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline void narrow(bf16* p, vf x) {
#ifdef __AVX512BF16__
  // the instruction rounds to nearest even and keeps NaNs NaN; it flushes subnormals to zero, as
  // the kernel's arithmetic does anyway (FlushDenormals)
  __m512 y;
  std::memcpy(&y, &x, sizeof y);
  const __m256bh h = _mm512_cvtneps_pbh(y);
  std::memcpy(p, &h, sizeof h);
#else
  vu b;
  std::memcpy(&b, &x, sizeof b);
  const vu nan = reinterpret_cast<vu>(x != x);
  const vu r = nan ? (b >> 16) | 0x40 : (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
  const vh h = __builtin_convertvector(r, vh);
  std::memcpy(p, &h, sizeof h);
#endif
}

// n values from src to dst, times scale, n >= 0 (vectors, then the tail); dst fp32 or bf16.
template <class E>
inline void copy_row(E* dst, const float* src, int n, float scale) {
  int j = 0;
  const vf f = splat(scale);
  if constexpr (std::is_same_v<E, float>) {
    for (; j + W <= n; j += W) store(dst + j, load(src + j) * f);
    for (; j < n; ++j) dst[j] = src[j] * scale;
  } else {
    for (; j + W <= n; j += W) narrow(dst + j, load(src + j) * f);
    for (; j < n; ++j) dst[j] = narrow(src[j] * scale);
  }
}

// rows x cols of src (row stride ld) as fp32 rows: src itself for fp32; for bf16 the rows widened
// into tile (row stride cols), which is returned with its stride.
template <class E>
inline std::pair<const float*, int> as_fp32(const E* src, int ld, int rows, int cols, float* tile) {
  if constexpr (std::is_same_v<E, float>) {
    return {src, ld};
  } else {
    for (int r = 0; r < rows; ++r) {
      const bf16* from = src + static_cast<int64_t>(r) * ld;
      float* to = tile + r * cols;
      int c = 0;
      for (; c + W <= cols; c += W) store(to + c, widen(from + c));
      for (; c < cols; ++c) to[c] = widen(from[c]);
    }
    return {tile, cols};
  }
}

// exp(x) for x <= 0 (scores minus their row's maximum), Cephes' single-precision polynomial after
// the reduction x = n ln2 + r; below -87.3 (a subnormal result) it is 0.
inline vf vexp(vf x) {
  const vf lo = splat(-87.3f);
  vi under = x < lo;
  x = under ? lo : x;
  vf n = x * 1.44269504088896341f;
  n = __builtin_convertvector(__builtin_convertvector(n + (n < 0 ? -0.5f : 0.5f), vi), vf);  // round
  vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  vf y = p * r * r + r + 1.0f;
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  vf e = y * two_n;
  return under ? splat(0.0f) : e;
}

// A matrix read element by element: A(r, k) = a[r * rs + k * ks]. The strides let a product
// read an operand transposed at no cost (each element is broadcast to a vector anyway).
struct Mat {
  const float* a;
  int rs, ks;
  const float* at(int r) const { return a + static_cast<int64_t>(r) * rs; }
  Mat from(int r) const { return {at(r), rs, ks}; }
};

struct Out {  // C = alpha * row_scale[r] * A @ B (+ add, of C's layout), where given; into c, or
             // rounded to bf16 into c16 (then c is unused)
  float* c;
  int ldc;
  float alpha;
  const float* add = nullptr;
  const float* row_scale = nullptr;
  bf16* c16 = nullptr;
  Out at(int r, int col) const {
    return {c ? c + r * ldc + col : nullptr, ldc, alpha, add ? add + r * ldc + col : nullptr,
            row_scale ? row_scale + r : nullptr, c16 ? c16 + r * ldc + col : nullptr};
  }
  // Row r's NC accumulator vectors, reduced over the U split contractions, scaled and stored.
  template <int U, int NC>
  void put(int r, const vf (&acc)[U][NC]) const {
    for (int col = 0; col < NC; ++col) {
      vf x = acc[0][col];
      for (int u = 1; u < U; ++u) x += acc[u][col];
      x *= row_scale ? alpha * row_scale[r] : alpha;
      if (add) x += load(add + r * ldc + col * W);
      if (c16) narrow(c16 + r * ldc + col * W, x); else store(c + r * ldc + col * W, x);
    }
  }
};

// C[r][0:16*NC] = alpha * sum_k A(r, k) * B[k*ldb + 0:16*NC] (+ add) for R rows: the accumulators
// (U x R x NC vectors) stay in registers over the whole contraction. With few rows (a block's
// last), U > 1 splits the contraction over independent accumulators, so that the FMAs do not
// wait on each other's latency.
template <int R, int NC, int U = 1>
struct Fma {
  static void run(Mat A, const float* B, int ldb, int K, Out C) {
    vf acc[R][U][NC];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u)
        for (int c = 0; c < NC; ++c) acc[r][u][c] = vf{};
    int k = 0;
    for (; k + U <= K; k += U)
      for (int u = 0; u < U; ++u) {
        vf b[NC];
        for (int c = 0; c < NC; ++c) b[c] = load(B + (k + u) * ldb + c * W);
        for (int r = 0; r < R; ++r) {
          vf x = splat(A.a[r * A.rs + (k + u) * A.ks]);
          for (int c = 0; c < NC; ++c) acc[r][u][c] += x * b[c];
        }
      }
    for (; k < K; ++k)
      for (int r = 0; r < R; ++r) {
        vf x = splat(A.a[r * A.rs + k * A.ks]);
        for (int c = 0; c < NC; ++c) acc[r][0][c] += x * load(B + k * ldb + c * W);
      }
    for (int r = 0; r < R; ++r) C.put(r, acc[r]);
  }
};

// Rows of C in blocks of R by the micro-kernel M (Fma, or Pairs in pairs.h); A is Mat or its
// bf16 counterpart (anything with from(r)).
template <template <int, int, int> class M, int R, int NC, class A, class B>
inline void rows_of(A a, const B* b, int ldb, int K, Out C, int rows) {
  int r0 = 0;
  for (; r0 + R <= rows; r0 += R) M<R, NC, 1>::run(a.from(r0), b, ldb, K, C.at(r0, 0));
  const A rest = a.from(r0);
  const Out c = C.at(r0, 0);
  switch (rows - r0) {  // R is at most 8
    case 1: M<1, NC, (NC > 2 ? 2 : 4)>::run(rest, b, ldb, K, c); break;
    case 2: M<2, NC, 2>::run(rest, b, ldb, K, c); break;
    case 3: M<3, NC, 2>::run(rest, b, ldb, K, c); break;
    case 4: M<4, NC, 1>::run(rest, b, ldb, K, c); break;
    case 5: M<5, NC, 1>::run(rest, b, ldb, K, c); break;
    case 6: M<6, NC, 1>::run(rest, b, ldb, K, c); break;
    case 7: M<7, NC, 1>::run(rest, b, ldb, K, c); break;
    default: break;
  }
}

// C (rows x cols) = alpha * A (rows x K) @ B (K x cols, ldb) [+ add]; cols a multiple of 16.
// Column blocks of up to 4 vectors; rows in blocks that keep about 16 accumulators in registers
// (8 rows of 2 vectors, 4 of 4): enough independent FMAs to cover their latency.
template <template <int, int, int> class M, class A, class B>
void gemm_by(A a, const B* b, int ldb, int K, Out C, int rows, int cols) {
  for (int c0 = 0; c0 < cols; c0 += 4 * W) {
    const Out c = C.at(0, c0);
    switch (std::min(4, (cols - c0) / W)) {
      case 1: rows_of<M, 8, 1>(a, b + c0, ldb, K, c, rows); break;
      case 2: rows_of<M, 8, 2>(a, b + c0, ldb, K, c, rows); break;
      case 3: rows_of<M, 5, 3>(a, b + c0, ldb, K, c, rows); break;
      default: rows_of<M, 4, 4>(a, b + c0, ldb, K, c, rows); break;
    }
  }
}

inline void gemm(Mat A, const float* B, int ldb, int K, Out C, int rows, int cols) {
  gemm_by<Fma>(A, B, ldb, K, C, rows, cols);
}

#ifdef __AVX512F__
// dst[c * ld_dst + r] = src row r's 32-bit value c, for a 16 x 16 block whose rows are ld bytes
// apart: unpacks and shuffles within 128-bit lanes leave r[4i + j], lane L holding rows 4i..4i+3
// of column 4L + j; a 4 x 4 transpose of lanes then gathers each column.
inline void transpose16(const char* src, int64_t ld, float* dst, int ld_dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44), u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    _mm512_storeu_ps(dst + j * ld_dst, _mm512_shuffle_f32x4(u0, u2, 0x88));
    _mm512_storeu_ps(dst + (4 + j) * ld_dst, _mm512_shuffle_f32x4(u0, u2, 0xDD));
    _mm512_storeu_ps(dst + (8 + j) * ld_dst, _mm512_shuffle_f32x4(u1, u3, 0x88));
    _mm512_storeu_ps(dst + (12 + j) * ld_dst, _mm512_shuffle_f32x4(u1, u3, 0xDD));
  }
}
#endif

// dst (cols x ld_dst, zero from column `rows` on) = transpose of the rows x cols 32-bit values at
// src, rows ld bytes apart (bytes: a bf16 matrix read as pairs may have rows at odd elements).
// The values are moved as bits, never as floats.
inline void transpose_bits(const char* src, int64_t ld, int rows, int cols, float* dst, int ld_dst) {
  int r0 = 0, c_done = 0;
#ifdef __AVX512F__
  c_done = cols / W * W;
  for (; r0 + W <= rows; r0 += W)
    for (int c0 = 0; c0 < c_done; c0 += W) transpose16(src + r0 * ld + 4 * c0, ld, dst + c0 * ld_dst + r0, ld_dst);
  for (int c = 0; c < c_done; ++c)
    for (int r = r0; r < rows; ++r) std::memcpy(dst + c * ld_dst + r, src + r * ld + 4 * c, 4);
#endif
  for (int c = c_done; c < cols; ++c)
    for (int r = 0; r < rows; ++r) std::memcpy(dst + c * ld_dst + r, src + r * ld + 4 * c, 4);
  for (int c = 0; c < cols; ++c)
    for (int r = rows; r < ld_dst; ++r) dst[c * ld_dst + r] = 0.0f;
}

// dst (cols x ld_dst, zero from column `rows` on) = transpose of src (rows x cols, ld_src).
inline void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  transpose_bits(reinterpret_cast<const char*>(src), 4 * static_cast<int64_t>(ld_src), rows, cols, dst, ld_dst);
}

// Asks for rows x bytes at p (rows ld bytes apart) to be brought into the cache: the next task's
// operands, loaded while this one computes (a task's first loads otherwise wait on memory).
inline void prefetch(const void* p, int64_t ld, int rows, int64_t bytes) {
  const char* base = static_cast<const char*>(p);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(base + r * ld + b);
}

struct FlushDenormals {  // FTZ and DAZ on this thread for the lifetime of the object
#ifdef WA_X86
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// Tasks [0, tasks) split into one contiguous range per thread: body(thread id, begin, end).
// With OpenMP the threads are the OpenMP runtime's: loaded into PyTorch's process this library
// binds to the libgomp.so.1 PyTorch already loaded (the same soname), so it runs on PyTorch's own
// intra-op threads. Threads of its own would compete for the cores with that pool's workers,
// which spin for a while after each ATen operator: in a Swin model that doubled the kernel's time.
// Returns false when a thread's body threw (its scratch could not be allocated): an exception may
// not leave an OpenMP region, nor this library's C functions.
template <class F>
bool parallel(int64_t tasks, int threads, F&& body) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tasks)));
  std::atomic<bool> ok{true};
  auto run = [&](int id, int n) {
    FlushDenormals flush;
    try {
      body(id, tasks * id / n, tasks * (id + 1) / n);
    } catch (...) {
      ok = false;
    }
  };
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  run(omp_get_thread_num(), omp_get_num_threads());
#else
  std::vector<std::thread> pool;
  for (int id = 1; id < threads; ++id) pool.emplace_back(run, id, threads);
  run(0, threads);
  for (auto& t : pool) t.join();
#endif
  return ok;
}


}  // namespace wa
