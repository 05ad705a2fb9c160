/* A float32 GEMM whose every output is summed in one fixed order: acc = fma(a_ik, b_kj, acc) for
   k = 0, 1, ..., K-1, from acc = 0. fma is correctly rounded everywhere (x86 FMA3, ARM, CUDA
   fmaf), and vectorizing across j does not change any element's order, so the bits do not depend
   on the machine, its vector width or its thread count: the RepOps idea (Verde, Arun et al. 2025)
   for the one op that dominates training. An experiment for bench/fixed_order_gemm.py, not used
   by replay/: it measures how close such a GEMM comes to MKL's float32 GEMM on this machine.

   Blocking: 4 rows of A by 4 vectors of B's columns in 16 register accumulators, B streamed over
   k; AVX-512, AVX2 + FMA and plain C variants, which give the same bits. */
#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#define MR 4

/* One MR x (vector width x 4) tile, accumulators in registers: per k, four rows of A broadcast
   against four vectors of B's row k. Same per-element order (k ascending, one fma each) in every
   variant below. */
#if defined(__AVX512F__)
#define NR 64
static void full_tile(const float *A, const float *B, float *C, int64_t N, int64_t K, int64_t i0, int64_t j0) {
    __m512 acc[MR][4];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * N + j0;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
        for (int r = 0; r < MR; r++) {
            __m512 a = _mm512_set1_ps(A[(i0 + r) * K + k]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(a, b2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(a, b3, acc[r][3]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(C + (i0 + r) * N + j0 + 16 * v, acc[r][v]);
}
#elif defined(__FMA__)
#define NR 32
static void full_tile(const float *A, const float *B, float *C, int64_t N, int64_t K, int64_t i0, int64_t j0) {
    __m256 acc[MR][4];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * N + j0;
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16), b3 = _mm256_loadu_ps(b + 24);
        for (int r = 0; r < MR; r++) {
            __m256 a = _mm256_set1_ps(A[(i0 + r) * K + k]);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(a, b2, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(a, b3, acc[r][3]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 4; v++) _mm256_storeu_ps(C + (i0 + r) * N + j0 + 8 * v, acc[r][v]);
}
#else
#define NR 16
static void full_tile(const float *A, const float *B, float *C, int64_t N, int64_t K, int64_t i0, int64_t j0) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < K; k++)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] = fmaf(A[(i0 + r) * K + k], B[k * N + j0 + j], acc[r][j]);
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) C[(i0 + r) * N + j0 + j] = acc[r][j];
}
#endif

/* Edges, scalar: the same order. */
static void edge_tile(const float *A, const float *B, float *C, int64_t N, int64_t K, int64_t i0, int64_t j0, int64_t mr,
                      int64_t nr) {
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < nr; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(A[(i0 + r) * K + k], B[k * N + j0 + j], acc);
            C[(i0 + r) * N + j0 + j] = acc;
        }
}

/* C (M x N) = A (M x K) @ B (K x N), all row-major contiguous float32. */
void gemm_fixed(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    for (int64_t j0 = 0; j0 < N; j0 += NR)
        for (int64_t i0 = 0; i0 < M; i0 += MR) {
            int64_t mr = M - i0 < MR ? M - i0 : MR, nr = N - j0 < NR ? N - j0 : NR;
            if (mr == MR && nr == NR)
                full_tile(A, B, C, N, K, i0, j0);
            else
                edge_tile(A, B, C, N, K, i0, j0, mr, nr);
        }
}
