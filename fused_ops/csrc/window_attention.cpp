// Window attention (Swin's WindowAttention core), forward and backward, fused per (window, head)
// on the CPU, fp32 or bf16. Built and loaded by fused_ops/native.py (ctypes; no PyTorch headers, so it
// compiles in seconds); fused_ops/attention.py calls it from its custom operators.
//
// Why it is faster than the batched ATen formulation: for one window and head every operand fits
// in the core's L1 cache (49 tokens x 32 channels: 6 KiB; the scores 49 x 64: 12 KiB), so the
// scale, the bias-and-mask add, the softmax and its gradient are done on the scores while they are
// in cache instead of as passes over the (B*nW, heads, N, N) tensor in memory, and the products run
// on register-blocked micro-kernels (4 rows x up to 64 columns of accumulators) sized for these
// shapes instead of a general small-matrix GEMM.
//
// Numerics: fp32 arithmetic (the bias gradient's sum over windows in fp64 across threads; bf16
// storage: see kPairs below);
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
#include "pairs.h"
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

// Where a task's result rows go: C = alpha * the product, rows ld apart at dst (bf16 rounded as
// they are stored).
template <class E>
inline Out result(E* dst, int ld, float alpha) {
  if constexpr (std::is_same_v<E, float>) return {dst, ld, alpha}; else return {nullptr, ld, alpha, nullptr, nullptr, dst};
}

// Whether E's products run on bf16 pairs (pairs.h), the probabilities and the scores' gradient
// rounded to bf16 before they are multiplied, as the eager bf16 formula rounds them; otherwise
// the values are widened and multiplied in fp32.
#ifdef __AVX512BF16__
template <class E>
constexpr bool kPairs = std::is_same_v<E, bf16>;
#else
template <class E>
constexpr bool kPairs = false;
#endif

// A row of scores (NP values, the padding -inf) replaced by their exponentials less the row's
// maximum; returns 1 / their sum, what normalises them.
inline float softmax_exp(float* row, int NP) {
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
  return 1.0f / hsum(sum);
}

// A vector of fp32 values from fp32 or bf16 storage.
inline vf load_wide(const float* p) { return load(p); }
inline vf load_wide(const bf16* p) { return widen(p); }
inline float wide(float x) { return x; }
using wa::widen;
inline float wide(bf16 x) { return widen(x); }

// dS = P * (dP - rowsum(P * dP)) on one row of N values, added into the bias gradient's row dbr:
// row holds dP and becomes dS (its padding stays 0), or, given dst, dS is written there rounded
// to bf16 and zero up to n_to. The probabilities (fp32 or bf16) are read where the forward wrote
// them (rows of N): a padded copy would be read back by vector loads across its scalar-written
// tail, which stalls store forwarding.
template <class P>
inline void softmax_grad_row(const P* prow, float* row, float* dbr, int N, bf16* dst = nullptr, int n_to = 0) {
  const int NV = N / W * W;
  vf dot = vf{};
  for (int j = 0; j < NV; j += W) dot += load_wide(prow + j) * load(row + j);
  float sum = hsum(dot);
  for (int j = NV; j < N; ++j) sum += wide(prow[j]) * row[j];
  const vf d = splat(sum);
  for (int j = 0; j < NV; j += W) {
    const vf x = load_wide(prow + j) * (load(row + j) - d);
    if (dst) narrow(dst + j, x); else store(row + j, x);
    store(dbr + j, load(dbr + j) + x);
  }
  for (int j = NV; j < N; ++j) {
    const float x = wide(prow[j]) * (row[j] - sum);
    if (dst) dst[j] = narrow(x); else row[j] = x;
    dbr[j] += x;
  }
  if (dst) std::memset(dst + N, 0, sizeof(bf16) * (n_to - N));
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
    std::vector<float> kt(kPairs<E> ? 0 : static_cast<size_t>(D) * NP), s(static_cast<size_t>(N) * NP),
        bm(static_cast<size_t>(N) * NP);
    // bf16 multiplied in fp32 only: q, k, v of the task widened
    std::vector<float> widened(std::is_same_v<E, float> || kPairs<E> ? 0 : static_cast<size_t>(3) * N * D);
    // pair products only: K^T and V as pairs, and P rounded to bf16
    std::vector<uint32_t> kt2(kPairs<E> ? static_cast<size_t>(D / 2) * NP : 0), v2(kPairs<E> ? (N + 1) / 2 * D : 0);
    std::vector<bf16> pb(kPairs<E> ? static_cast<size_t>(N) * NP : 0);
    int64_t tile = -1;  // the (window, head) whose bias-plus-mask bm holds
    // Tasks in (window of the image, head, image) order, the image fastest: consecutive tasks
    // share one bias-plus-mask tile, formed once for all the images.
    for (int64_t task = begin; task < end; ++task) {
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
      // S = scale Q K^T + bias (+ mask); the padding columns come out -inf
      const Out scores{s.data(), NP, scale, bm.data()};
      if constexpr (kPairs<E>) {
#ifdef __AVX512BF16__
        const E* qr = rows(q, strides, t, heads);
        const E* kr = rows(k, strides + 3, t, heads);
        transpose_pairs(kr, ldk_in, N, D / 2, kt2.data(), NP);
        gemm_pairs(PairMat::rows(qr, ldq_in), kt2.data(), NP, D / 2, scores, N, NP);
#endif
      } else {
        const auto [qt, ldq] = as_fp32(rows(q, strides, t, heads), ldq_in, N, D, widened.data());
        const auto [kr, ldk] = as_fp32(rows(k, strides + 3, t, heads), ldk_in, N, D, widened.data() + N * D);
        transpose(kr, ldk, N, D, kt.data(), NP);
        gemm({qt, ldq, 1}, kt.data(), NP, D, scores, N, NP);
      }
      for (int i = 0; i < N; ++i) {
        float* row = s.data() + i * NP;
        const float r = softmax_exp(row, NP);
        if constexpr (kPairs<E>) {  // normalised as they are rounded: P V reads them in bf16
          copy_row(pb.data() + i * NP, row, NP, r);  // the padding's exponentials are 0
          copy_row(probs + (t * N + i) * N, row, N, r);
        } else {
          copy_row(row, row, NP, r);
          copy_row(probs + (t * N + i) * N, row, N, 1.0f);
        }
      }
      const Out ov = result(out + t * N * D, D, 1.0f);  // O = P V
      if constexpr (kPairs<E>) {
#ifdef __AVX512BF16__
        interleave_rows(rows(v, strides + 6, t, heads), ldv_in, N, D, v2.data(), D);
        gemm_pairs(PairMat::rows(pb.data(), NP), v2.data(), D, (N + 1) / 2, ov, N, D);
#endif
      } else {
        const auto [vr, ldv] = as_fp32(rows(v, strides + 6, t, heads), ldv_in, N, D, widened.data() + 2 * N * D);
        gemm({s.data(), NP, 1}, vr, ldv, N, ov, N, D);
      }
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
  const int NP = padded(N);
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
    std::vector<float> vt(kPairs<E> ? 0 : static_cast<size_t>(D) * NP), ds(static_cast<size_t>(N) * NP);
    // bf16 multiplied in fp32 only: dO, q, k, v and the probabilities widened
    std::vector<float> widened(std::is_same_v<E, float> || kPairs<E> ? 0 : static_cast<size_t>(4) * N * D + static_cast<size_t>(N) * N);
    // pair products only: V^T in pairs (D/2 x NP), a left operand's rows interleaved (N2 x NP),
    // the right operand's (N2 x D); dS rounded to bf16
    const int N2 = (N + 1) / 2;
    const size_t left_size = static_cast<size_t>(N2) * NP;
    std::vector<uint32_t> pairs(kPairs<E> ? static_cast<size_t>(D / 2) * NP + left_size + static_cast<size_t>(N2) * D : 0);
    std::vector<bf16> ds16(kPairs<E> ? static_cast<size_t>(N) * NP : 0);
    std::vector<float>& acc = partial[id];
    for (int64_t t = begin; t < end; ++t) {
      const int h = static_cast<int>(t % heads);
      const E* go_in = dout + t * N * D;
      const float* go = nullptr;  // dO in fp32, for the fp32 products
      if constexpr (!kPairs<E>) go = as_fp32(go_in, D, N, D, widened.data()).first;
      const Out dp{ds.data(), NP, 1.0f, nullptr};  // dP = dO V^T
      uint32_t* const left = kPairs<E> ? pairs.data() + static_cast<size_t>(D / 2) * NP : nullptr;
      if constexpr (kPairs<E>) {
#ifdef __AVX512BF16__
        const E* vr = rows(v, strides + 6, t, heads);
        transpose_pairs(vr, ldv_in, N, D / 2, pairs.data(), NP);
        gemm_pairs(PairMat::rows(go_in, D), pairs.data(), NP, D / 2, dp, N, NP);
#endif
      } else {
        const auto [vr, ldv] = as_fp32(rows(v, strides + 6, t, heads), ldv_in, N, D, widened.data() + 3 * N * D);
        transpose(vr, ldv, N, D, vt.data(), NP);
        gemm({go, D, 1}, vt.data(), NP, D, dp, N, NP);
      }
      float* db = acc.data() + h * per_head;
      const Out outs[3] = {result(dq + t * N * D, D, scale), result(dk + t * N * D, D, scale),
                           result(dv + t * N * D, D, 1.0f)};
      if constexpr (kPairs<E>) {
#ifdef __AVX512BF16__
        const E* p16 = probs + t * N * N;
        for (int i = 0; i < N; ++i) softmax_grad_row(p16 + i * N, ds.data() + i * NP, db + i * NP, N, ds16.data() + i * NP, NP);
        uint32_t* const right = left + left_size;
        interleave_rows(rows(k, strides + 3, t, heads), ldk_in, N, D, right, D);  // dQ = scale dS K
        gemm_pairs(PairMat::rows(ds16.data(), NP), right, D, N2, outs[0], N, D);
        interleave_rows(ds16.data(), NP, N, N, left, NP);  // dK = scale dS^T Q
        interleave_rows(rows(q, strides, t, heads), ldq_in, N, D, right, D);
        gemm_pairs(PairMat::columns(left, NP), right, D, N2, outs[1], N, D);
        interleave_rows(p16, N, N, N, left, NP);  // dV = P^T dO
        interleave_rows(go_in, D, N, D, right, D);
        gemm_pairs(PairMat::columns(left, NP), right, D, N2, outs[2], N, D);
#endif
      } else {
        const float* pt = as_fp32(probs + t * N * N, N, N, N, widened.data() + 4 * N * D).first;
        for (int i = 0; i < N; ++i) softmax_grad_row(pt + i * N, ds.data() + i * NP, db + i * NP, N);
        const auto [qr, ldq] = as_fp32(rows(q, strides, t, heads), ldq_in, N, D, widened.data() + N * D);
        const auto [kr, ldk] = as_fp32(rows(k, strides + 3, t, heads), ldk_in, N, D, widened.data() + 2 * N * D);
        gemm({ds.data(), NP, 1}, kr, ldk, N, outs[0], N, D);  // dQ = scale dS K
        gemm({ds.data(), 1, NP}, qr, ldq, N, outs[1], N, D);  // dK = scale dS^T Q
        gemm({pt, 1, N}, go, D, N, outs[2], N, D);            // dV = P^T dO
      }
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
