// Window attention (Swin's WindowAttention core), forward and backward, fused per (window, head)
// on the CPU in fp32. Built and loaded by fused_ops/native.py (ctypes; no PyTorch headers, so it
// compiles in seconds); fused_ops/attention.py calls it from its custom operators.
//
// Why it is faster than the batched ATen formulation: for one window and head every operand fits
// in the core's L1 cache (49 tokens x 32 channels: 6 KiB; the scores 49 x 64: 12 KiB), so the
// scale, the bias-and-mask add, the softmax and its gradient are done on the scores while they are
// in cache instead of as passes over the (B*nW, heads, N, N) tensor in memory, and the products run
// on register-blocked micro-kernels (4 rows x up to 64 columns of accumulators) sized for these
// shapes instead of a general small-matrix GEMM.
//
// Numerics: fp32 throughout (the bias gradient's sum over windows in fp64 across threads);
// denormals are flushed (MXCSR FTZ/DAZ, set and restored on every thread that runs a task): Swin's
// shift mask makes probabilities below fp32's smallest normal (exp(-87.3)), which x86 cores would
// otherwise handle in microcode, about 30x slower. Flushing moves a result by under 1.2e-38.
//
// Layouts: q, k, v (B*nW, heads, N, D) with any strides but a unit one for D, given as
// strides[9] = {window, head, token} for q, then k, then v (so that the views Swin takes of its qkv
// projection need no copies); out, dq, dk, dv (T, N, D) row-major with T = B*nW*heads and task
// t = (window w = t / heads, head h = t % heads); bias (heads, N, N); mask (windows, N, N) or
// null, window w taking mask[w % windows]; probs (T, N, N); dbias (heads, N, N). The bias plus the
// mask is formed per (window, head) in a tile of the task's own, never as a tensor in memory: a
// (windows, heads, N, N) temporary per call changed which memory the allocator handed out for the
// outputs, and writing into freshly mapped pages doubled the forward's time.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WA_X86 1
#endif

namespace {

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

// n floats from src to dst, times scale, n >= 0 (vectors, then the tail).
inline void copy_row(float* dst, const float* src, int n, float scale) {
  int j = 0;
  const vf f = splat(scale);
  for (; j + W <= n; j += W) store(dst + j, load(src + j) * f);
  for (; j < n; ++j) dst[j] = src[j] * scale;
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
};

struct Out {  // C = alpha * row_scale[r] * A @ B (+ add, of C's layout), where given
  float* c;
  int ldc;
  float alpha;
  const float* add = nullptr;
  const float* row_scale = nullptr;
  Out at(int r, int col) const {
    return {c + r * ldc + col, ldc, alpha, add ? add + r * ldc + col : nullptr, row_scale ? row_scale + r : nullptr};
  }
};

// C[r][0:16*NC] = alpha * sum_k A(r, k) * B[k*ldb + 0:16*NC] (+ add) for R rows: the accumulators
// (U x R x NC vectors) stay in registers over the whole contraction. With few rows (a block's
// last), U > 1 splits the contraction over independent accumulators, so that the FMAs do not
// wait on each other's latency.
template <int R, int NC, int U = 1>
inline void micro(Mat A, const float* B, int ldb, int K, Out C) {
  vf acc[U][R][NC];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NC; ++c) acc[u][r][c] = vf{};
  int k = 0;
  for (; k + U <= K; k += U)
    for (int u = 0; u < U; ++u) {
      vf b[NC];
      for (int c = 0; c < NC; ++c) b[c] = load(B + (k + u) * ldb + c * W);
      for (int r = 0; r < R; ++r) {
        vf x = splat(A.a[r * A.rs + (k + u) * A.ks]);
        for (int c = 0; c < NC; ++c) acc[u][r][c] += x * b[c];
      }
    }
  for (; k < K; ++k)
    for (int r = 0; r < R; ++r) {
      vf x = splat(A.a[r * A.rs + k * A.ks]);
      for (int c = 0; c < NC; ++c) acc[0][r][c] += x * load(B + k * ldb + c * W);
    }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      vf x = acc[0][r][c];
      for (int u = 1; u < U; ++u) x += acc[u][r][c];
      x *= C.row_scale ? C.alpha * C.row_scale[r] : C.alpha;
      if (C.add) x += load(C.add + r * C.ldc + c * W);
      store(C.c + r * C.ldc + c * W, x);
    }
}

template <int R, int NC>
inline void rows_of(Mat A, const float* B, int ldb, int K, Out C, int rows) {
  int r0 = 0;
  for (; r0 + R <= rows; r0 += R) micro<R, NC>({A.at(r0), A.rs, A.ks}, B, ldb, K, C.at(r0, 0));
  const Mat a{A.at(r0), A.rs, A.ks};
  const Out c = C.at(r0, 0);
  switch (rows - r0) {  // R is at most 8
    case 1: micro<1, NC, (NC > 2 ? 2 : 4)>(a, B, ldb, K, c); break;
    case 2: micro<2, NC, 2>(a, B, ldb, K, c); break;
    case 3: micro<3, NC, 2>(a, B, ldb, K, c); break;
    case 4: micro<4, NC>(a, B, ldb, K, c); break;
    case 5: micro<5, NC>(a, B, ldb, K, c); break;
    case 6: micro<6, NC>(a, B, ldb, K, c); break;
    case 7: micro<7, NC>(a, B, ldb, K, c); break;
    default: break;
  }
}

// C (rows x cols) = alpha * A (rows x K) @ B (K x cols, ldb) [+ add]; cols a multiple of 16.
// Column blocks of up to 4 vectors; rows in blocks that keep about 16 accumulators in registers
// (8 rows of 2 vectors, 4 of 4): enough independent FMAs to cover their latency.
void gemm(Mat A, const float* B, int ldb, int K, Out C, int rows, int cols) {
  for (int c0 = 0; c0 < cols; c0 += 4 * W) {
    const float* b = B + c0;
    const Out c = C.at(0, c0);
    switch (std::min(4, (cols - c0) / W)) {
      case 1: rows_of<8, 1>(A, b, ldb, K, c, rows); break;
      case 2: rows_of<8, 2>(A, b, ldb, K, c, rows); break;
      case 3: rows_of<5, 3>(A, b, ldb, K, c, rows); break;
      default: rows_of<4, 4>(A, b, ldb, K, c, rows); break;
    }
  }
}

#ifdef __AVX512F__
// dst[c * ld_dst + r] = src[r * ld_src + c] for a 16 x 16 block: unpacks and shuffles within
// 128-bit lanes leave r[4i + j], lane L holding rows 4i..4i+3 of column 4L + j; a 4 x 4 transpose
// of lanes then gathers each column.
inline void transpose16(const float* src, int ld_src, float* dst, int ld_dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld_src);
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

// dst (cols x ld_dst, zero from column `rows` on) = transpose of src (rows x cols, ld_src).
void transpose(const float* src, int ld_src, int rows, int cols, float* dst, int ld_dst) {
  int r0 = 0, c_done = 0;
#ifdef __AVX512F__
  c_done = cols / W * W;
  for (; r0 + W <= rows; r0 += W)
    for (int c0 = 0; c0 < c_done; c0 += W) transpose16(src + r0 * ld_src + c0, ld_src, dst + c0 * ld_dst + r0, ld_dst);
  for (int c = 0; c < c_done; ++c)
    for (int r = r0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
#endif
  for (int c = c_done; c < cols; ++c)
    for (int r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
  for (int c = 0; c < cols; ++c)
    for (int r = rows; r < ld_dst; ++r) dst[c * ld_dst + r] = 0.0f;
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

inline int padded(int n) { return (n + W - 1) / W * W; }

// What both entry points take (fused_ops/native.py checks the same before calling): whole
// vectors of head_dim up to 256, N up to 1024, T a whole number of (window, head) tasks for
// every head and window, token strides from 1 to 2^20 (the micro-kernels index rows as int:
// stride x N must stay below 2^31).
inline bool shapes_fit(int64_t T, int heads, int N, int D, int windows, const int64_t* s) {
  if (D % W || D > 256 || N < 1 || N > 1024 || heads < 1 || windows < 1 || T % (static_cast<int64_t>(heads) * windows))
    return false;
  for (int i = 2; i < 9; i += 3)
    if (s[i] < 1 || s[i] > (1 << 20)) return false;
  return true;
}

// Task t's (N, D) rows of a strided (B*nW, heads, N, D) tensor: s = {window, head, token} strides.
inline const float* rows(const float* base, const int64_t* s, int64_t t, int heads) {
  return base + (t / heads) * s[0] + (t % heads) * s[1];
}

}  // namespace

extern "C" {

// 0 on success; 1 for shapes or strides the kernel does not take (shapes_fit);
// 2 when its scratch memory could not be allocated (the outputs are then incomplete).
int wa_forward(const float* q, const float* k, const float* v, const int64_t* strides, const float* bias,
               const float* mask, int64_t T, int heads, int N, int D,
               int windows, float scale, float* out, float* probs, int threads) {
  if (!shapes_fit(T, heads, N, D, windows, strides)) return 1;
  const int ldq = static_cast<int>(strides[2]), ldk = static_cast<int>(strides[5]), ldv = static_cast<int>(strides[8]);
  const int NP = padded(N);
  const int64_t images = T / heads / windows;
  const bool ok = parallel(T, threads, [&](int, int64_t begin, int64_t end) {
    std::vector<float> kt(static_cast<size_t>(D) * NP), s(static_cast<size_t>(N) * NP), inv(N), bm(static_cast<size_t>(N) * NP);
    int64_t tile = -1;  // the (window, head) whose bias-plus-mask bm holds
    for (int64_t task = begin; task < end; ++task) {
      // Tasks in (window of the image, head, image) order, the image fastest: consecutive tasks
      // share one bias-plus-mask tile, formed once for all the images.
      const int64_t image = task % images, rest = task / images, window = rest / heads;
      const int h = static_cast<int>(rest % heads);
      const int64_t t = (image * windows + window) * heads + h;
      if (window * heads + h != tile) {  // rows padded to NP with -inf: their probabilities come out 0
        tile = window * heads + h;
        const float* b = bias + static_cast<int64_t>(h) * N * N;
        const float* m = mask ? mask + window * N * N : nullptr;
        for (int i = 0; i < N; ++i) {
          float* row = bm.data() + i * NP;
          for (int j = 0; j < N; ++j) row[j] = b[i * N + j] + (m ? m[i * N + j] : 0.0f);
          for (int j = N; j < NP; ++j) row[j] = -INFINITY;
        }
      }
      transpose(rows(k, strides + 3, t, heads), ldk, N, D, kt.data(), NP);
      // S = scale Q K^T + bias (+ mask); the padding columns come out -inf
      gemm({rows(q, strides, t, heads), ldq, 1}, kt.data(), NP, D, {s.data(), NP, scale, bm.data()}, N, NP);
      for (int i = 0; i < N; ++i) {
        float* row = s.data() + i * NP;
        vf m = load(row);
        for (int j = W; j < NP; j += W) { vf x = load(row + j); m = x > m ? x : m; }
        const float mx = hmax(m);
        vf sum = vf{};
        for (int j = 0; j < NP; j += W) {
          vf e = vexp(load(row + j) - mx);
          store(row + j, e);
          sum += e;
        }
        // Normalised where it is written: in the saved probabilities and in O's rows (row_scale).
        inv[i] = 1.0f / hsum(sum);
        copy_row(probs + (t * N + i) * N, row, N, inv[i]);
      }
      gemm({s.data(), NP, 1}, rows(v, strides + 6, t, heads), ldv, N,
           {out + t * N * D, D, 1.0f, nullptr, inv.data()}, N, D);  // O = P V
    }
  });
  return ok ? 0 : 2;
}

// dbias (heads, N, N) is overwritten with the sum over every window of the scores' gradient.
int wa_backward(const float* dout, const float* q, const float* k, const float* v, const int64_t* strides,
                const float* probs, int64_t T, int heads, int N, int D, float scale, float* dq, float* dk, float* dv, float* dbias, int threads) {
  if (!shapes_fit(T, heads, N, D, 1, strides)) return 1;
  const int ldq = static_cast<int>(strides[2]), ldk = static_cast<int>(strides[5]), ldv = static_cast<int>(strides[8]);
  const int NP = padded(N), NV = N / W * W;
  const size_t per_head = static_cast<size_t>(N) * NP;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, T)));
  // Each thread's own bias-gradient sums in fp32 (threads x heads x N x NP floats: the caller
  // bounds it, fused_ops/native.py), added in fp64 at the end. Tasks in memory order: going head
  // by head instead kept one head's sums in cache but measured 10% slower.
  std::vector<std::vector<float>> partial;
  try {
    partial.assign(threads, std::vector<float>(heads * per_head, 0.0f));
  } catch (...) {
    return 2;
  }
  const bool ok = parallel(T, threads, [&](int id, int64_t begin, int64_t end) {
    std::vector<float> vt(static_cast<size_t>(D) * NP), ds(static_cast<size_t>(N) * NP);
    std::vector<float>& acc = partial[id];
    for (int64_t t = begin; t < end; ++t) {
      const int h = static_cast<int>(t % heads);
      const float* go = dout + t * N * D;
      const float* pt = probs + t * N * N;
      transpose(rows(v, strides + 6, t, heads), ldv, N, D, vt.data(), NP);
      gemm({go, D, 1}, vt.data(), NP, D, {ds.data(), NP, 1.0f, nullptr}, N, NP);  // dP = dO V^T
      float* db = acc.data() + h * per_head;
      // The probabilities are read where the forward wrote them (rows of N): a padded copy would be
      // read back by vector loads across its scalar-written tail, which stalls store forwarding.
      for (int i = 0; i < N; ++i) {
        const float* prow = pt + i * N;
        float* row = ds.data() + i * NP;
        float* dbr = db + i * NP;
        vf dot = vf{};
        for (int j = 0; j < NV; j += W) dot += load(prow + j) * load(row + j);
        float sum = hsum(dot);
        for (int j = NV; j < N; ++j) sum += prow[j] * row[j];
        const vf d = splat(sum);
        for (int j = 0; j < NV; j += W) {  // dS = P * (dP - rowsum(P * dP)); the padding stays 0
          const vf x = load(prow + j) * (load(row + j) - d);
          store(row + j, x);
          store(dbr + j, load(dbr + j) + x);
        }
        for (int j = NV; j < N; ++j) {
          row[j] = prow[j] * (row[j] - sum);
          dbr[j] += row[j];
        }
      }
      gemm({ds.data(), NP, 1}, rows(k, strides + 3, t, heads), ldk, N, {dq + t * N * D, D, scale, nullptr}, N,
           D);  // dQ = scale dS K
      gemm({ds.data(), 1, NP}, rows(q, strides, t, heads), ldq, N, {dk + t * N * D, D, scale, nullptr}, N,
           D);  // dK = scale dS^T Q
      gemm({pt, 1, N}, go, D, N, {dv + t * N * D, D, 1.0f, nullptr}, N, D);  // dV = P^T dO
    }
  });
  if (!ok) return 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < N; ++j) {
        const size_t at = h * per_head + static_cast<size_t>(i) * NP + j;
        double total = 0.0;
        for (int id = 0; id < threads; ++id) total += partial[id][at];
        dbias[(static_cast<size_t>(h) * N + i) * N + j] = static_cast<float>(total);
      }
  return 0;
}

}  // extern "C"
