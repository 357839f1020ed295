// bf16 products on AVX512-BF16's dot-product instruction (vdpbf16ps: 32 bf16 products a vector,
// added in pairs into 16 fp32 lanes, twice the multiplies of an fp32 FMA). Its operands are bf16
// *pairs*: A's row r gives A[r][k], A[r][k+1] as one 32-bit value (row-major bf16 already is),
// and B is stored as B2[k/2][c] = B[k][c] | B[k+1][c] << 16 (the "VNNI" layout): for B = X^T that
// is the 32-bit transpose of X (transpose_pairs), for B = X it is X's rows interleaved two by two
// (interleave_rows). Products of bf16 values are exact in fp32; the instruction adds them with
// round-to-nearest-even and treats subnormal inputs and results as zero.

#pragma once

#include "tiles.h"

namespace wa {

// n values of src rounded to bf16 into dst, with dst[n:n_to] zero (a product's padding).
inline void narrow_row(bf16* dst, const float* src, int n, int n_to) {
  copy_row(dst, src, n, 1.0f);
  std::memset(dst + n, 0, sizeof(bf16) * (n_to - n));
}

// dst (pairs x ld_dst 32-bit values, zero from column `rows` on) = src (rows x 2 * pairs bf16,
// rows ld elements apart) transposed as pairs: B2 for the product with B = src^T.
inline void transpose_pairs(const bf16* src, int64_t ld, int rows, int pairs, uint32_t* dst, int ld_dst) {
  transpose_bits(reinterpret_cast<const char*>(src), 2 * ld, rows, pairs, reinterpret_cast<float*>(dst), ld_dst);
}

#ifdef __AVX512BF16__
// dst (ceil(rows / 2) x ld_dst 32-bit values) = rows 2i and 2i + 1 of src (bf16, rows ld
// elements apart) interleaved, the second in the high half; an odd last row is paired with zeros.
// Columns from cols to the next multiple of 16 come out zero (nothing past a row is read).
inline void interleave_rows(const bf16* src, int64_t ld, int rows, int cols, uint32_t* dst, int ld_dst) {
  // 32 columns of two rows at a time: one two-source word permutation gives each half's pairs.
  // Masked loads: zero past the row, and no fault there.
  static const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                                38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  static const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
  const int padded = (cols + W - 1) / W * W;
  for (int i = 0; 2 * i < rows; ++i) {
    const bf16* lo = src + 2 * i * ld;
    const bool odd = 2 * i + 1 == rows;
    uint32_t* out = dst + i * ld_dst;
    for (int c = 0; c < cols; c += 2 * W) {
      const __mmask32 m = cols - c >= 2 * W ? ~__mmask32{0} : (__mmask32{1} << (cols - c)) - 1;
      const __m512i a = _mm512_maskz_loadu_epi16(m, lo + c);
      const __m512i b = odd ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(m, lo + ld + c);
      _mm512_storeu_si512(out + c, _mm512_permutex2var_epi16(a, first, b));
      if (c + W < padded) _mm512_storeu_si512(out + c + W, _mm512_permutex2var_epi16(a, second, b));
    }
  }
}

// A for the pair products: A's pair (r, k2) = A[r][2 k2] | A[r][2 k2 + 1] << 16 is the 32 bits at
// a + r * rs + k2 * ks (strides in bytes). bf16 rows ld elements apart: rows(); the transpose
// of a matrix whose rows were interleaved (interleave_rows, ld_dst pairs a row): columns().
struct PairMat {
  const char* a;
  int64_t rs, ks;
  static PairMat rows(const bf16* a, int64_t ld) { return {reinterpret_cast<const char*>(a), 2 * ld, 4}; }
  static PairMat columns(const uint32_t* a, int ld_dst) { return {reinterpret_cast<const char*>(a), 4, 4 * ld_dst}; }
  PairMat from(int r) const { return {a + r * rs, rs, ks}; }
  __m512i pair(int r, int k2) const {
    uint32_t x;
    std::memcpy(&x, a + r * rs + k2 * ks, sizeof x);
    return _mm512_set1_epi32(static_cast<int>(x));
  }
};

// Fma's counterpart (tiles.h) over K2 pairs of the contraction: C = alpha * A @ B (+ add).
template <int R, int NC, int U = 1>
struct Pairs {
  static void run(PairMat A, const uint32_t* B, int ldb, int K2, Out C) {
    __m512 acc[R][U][NC];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u)
        for (int c = 0; c < NC; ++c) acc[r][u][c] = _mm512_setzero_ps();
    auto step = [&](int u, int k2) {
      __m512i b[NC];
      for (int c = 0; c < NC; ++c) b[c] = _mm512_loadu_si512(B + k2 * ldb + c * W);
      for (int r = 0; r < R; ++r) {
        const __m512i x = A.pair(r, k2);
        for (int c = 0; c < NC; ++c) acc[r][u][c] = _mm512_dpbf16_ps(acc[r][u][c], (__m512bh)x, (__m512bh)b[c]);
      }
    };
    int k2 = 0;
    for (; k2 + U <= K2; k2 += U)
      for (int u = 0; u < U; ++u) step(u, k2 + u);
    for (; k2 < K2; ++k2) step(0, k2);
    for (int r = 0; r < R; ++r) {
      vf out[U][NC];
      std::memcpy(out, acc[r], sizeof out);
      C.put(r, out);
    }
  }
};

// C (rows x cols) = alpha * A (rows x 2 K2, bf16) @ B (2 K2 x cols, as B2: K2 x ldb pairs) [+ add].
inline void gemm_pairs(PairMat A, const uint32_t* B, int ldb, int K2, Out C, int rows, int cols) {
  gemm_by<Pairs>(A, B, ldb, K2, C, rows, cols);
}
#endif

}  // namespace wa
