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
#include "tiles.h"

namespace {

using namespace wa;

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
template <class E>
inline const E* rows(const E* base, const int64_t* s, int64_t t, int heads) {
  return base + (t / heads) * s[0] + (t % heads) * s[1];
}

// Where a task's fp32 result rows are written: into the output itself for fp32; for bf16 into a
// tile, narrowed into the output by put() once complete.
template <class E>
inline float* result(E* dst, float* tile) {
  if constexpr (std::is_same_v<E, float>) return dst; else return tile;
}
template <class E>
inline void put(E* dst, const float* tile, int n) {
  if constexpr (!std::is_same_v<E, float>) copy_row(dst, tile, n, 1.0f);
}


// E: the storage type of q, k, v, out and probs (float or bf16); the arithmetic is fp32.
template <class E>
int forward(const E* q, const E* k, const E* v, const int64_t* strides, const float* bias, const float* mask,
            int64_t T, int heads, int N, int D, int windows, float scale, E* out, E* probs, int threads) {
  if (!shapes_fit(T, heads, N, D, windows, strides)) return 1;
  const int ldq_in = static_cast<int>(strides[2]), ldk_in = static_cast<int>(strides[5]),
            ldv_in = static_cast<int>(strides[8]);
  const int NP = padded(N);
  const int64_t images = T / heads / windows;
  const bool ok = parallel(T, threads, [&](int, int64_t begin, int64_t end) {
    std::vector<float> kt(static_cast<size_t>(D) * NP), s(static_cast<size_t>(N) * NP), bm(static_cast<size_t>(N) * NP);
    // bf16 only: q, k, v of the task widened, and O before it is narrowed
    std::vector<float> wide(std::is_same_v<E, float> ? 0 : static_cast<size_t>(4) * N * D);
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
      const auto [qt, ldq] = as_fp32(rows(q, strides, t, heads), ldq_in, N, D, wide.data());
      const auto [kr, ldk] = as_fp32(rows(k, strides + 3, t, heads), ldk_in, N, D, wide.data() + N * D);
      const auto [vr, ldv] = as_fp32(rows(v, strides + 6, t, heads), ldv_in, N, D, wide.data() + 2 * N * D);
      transpose(kr, ldk, N, D, kt.data(), NP);
      // S = scale Q K^T + bias (+ mask); the padding columns come out -inf
      gemm({qt, ldq, 1}, kt.data(), NP, D, {s.data(), NP, scale, bm.data()}, N, NP);
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
        // Normalised before P V, not on O's rows after it: with |v| near fp32's largest value,
        // the unnormalised sum over up to N tokens overflows to inf where P V does not.
        const vf r = vf{} + 1.0f / hsum(sum);
        for (int j = 0; j < NP; j += W) store(row + j, load(row + j) * r);
        copy_row(probs + (t * N + i) * N, row, N, 1.0f);
      }
      float* o = result(out + t * N * D, wide.data() + 3 * N * D);
      gemm({s.data(), NP, 1}, vr, ldv, N, {o, D, 1.0f, nullptr, nullptr}, N, D);  // O = P V
      put(out + t * N * D, o, N * D);
    }
  });
  return ok ? 0 : 2;
}

// dbias (heads, N, N), fp32, is overwritten with the sum over every window of the scores' gradient.
template <class E>
int backward(const E* dout, const E* q, const E* k, const E* v, const int64_t* strides, const E* probs, int64_t T,
             int heads, int N, int D, float scale, E* dq, E* dk, E* dv, float* dbias, int threads) {
  if (!shapes_fit(T, heads, N, D, 1, strides)) return 1;
  const int ldq_in = static_cast<int>(strides[2]), ldk_in = static_cast<int>(strides[5]),
            ldv_in = static_cast<int>(strides[8]);
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
    // bf16 only: dO, q, k, v and the probabilities widened; dQ, dK, dV before they are narrowed
    std::vector<float> wide(std::is_same_v<E, float> ? 0 : static_cast<size_t>(7) * N * D + static_cast<size_t>(N) * N);
    float* const res = wide.data() + 4 * N * D;
    std::vector<float>& acc = partial[id];
    for (int64_t t = begin; t < end; ++t) {
      const int h = static_cast<int>(t % heads);
      const float* go = as_fp32(dout + t * N * D, D, N, D, wide.data()).first;
      const auto [qr, ldq] = as_fp32(rows(q, strides, t, heads), ldq_in, N, D, wide.data() + N * D);
      const auto [kr, ldk] = as_fp32(rows(k, strides + 3, t, heads), ldk_in, N, D, wide.data() + 2 * N * D);
      const auto [vr, ldv] = as_fp32(rows(v, strides + 6, t, heads), ldv_in, N, D, wide.data() + 3 * N * D);
      const float* pt = as_fp32(probs + t * N * N, N, N, N, wide.data() + 7 * N * D).first;
      transpose(vr, ldv, N, D, vt.data(), NP);
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
      float* const g[3] = {result(dq + t * N * D, res), result(dk + t * N * D, res + N * D),
                           result(dv + t * N * D, res + 2 * N * D)};
      gemm({ds.data(), NP, 1}, kr, ldk, N, {g[0], D, scale, nullptr}, N, D);  // dQ = scale dS K
      gemm({ds.data(), 1, NP}, qr, ldq, N, {g[1], D, scale, nullptr}, N, D);  // dK = scale dS^T Q
      gemm({pt, 1, N}, go, D, N, {g[2], D, 1.0f, nullptr}, N, D);             // dV = P^T dO
      put(dq + t * N * D, g[0], N * D);
      put(dk + t * N * D, g[1], N * D);
      put(dv + t * N * D, g[2], N * D);
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

}  // namespace

extern "C" {

// 0 on success; 1 for shapes or strides the kernel does not take (shapes_fit);
// 2 when its scratch memory could not be allocated (the outputs are then incomplete).
int wa_forward(const float* q, const float* k, const float* v, const int64_t* strides, const float* bias,
               const float* mask, int64_t T, int heads, int N, int D, int windows, float scale, float* out,
               float* probs, int threads) {
  return forward(q, k, v, strides, bias, mask, T, heads, N, D, windows, scale, out, probs, threads);
}
int wa_backward(const float* dout, const float* q, const float* k, const float* v, const int64_t* strides,
                const float* probs, int64_t T, int heads, int N, int D, float scale, float* dq, float* dk,
                float* dv, float* dbias, int threads) {
  return backward(dout, q, k, v, strides, probs, T, heads, N, D, scale, dq, dk, dv, dbias, threads);
}
// The same for bf16 q, k, v, dO and probabilities (their 16 bits); bias, mask and dbias stay fp32.
int wa_forward_bf16(const bf16* q, const bf16* k, const bf16* v, const int64_t* strides, const float* bias,
                    const float* mask, int64_t T, int heads, int N, int D, int windows, float scale, bf16* out,
                    bf16* probs, int threads) {
  return forward(q, k, v, strides, bias, mask, T, heads, N, D, windows, scale, out, probs, threads);
}
int wa_backward_bf16(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const int64_t* strides,
                     const bf16* probs, int64_t T, int heads, int N, int D, float scale, bf16* dq, bf16* dk,
                     bf16* dv, float* dbias, int threads) {
  return backward(dout, q, k, v, strides, probs, T, heads, N, D, scale, dq, dk, dv, dbias, threads);
}

}  // extern "C"
