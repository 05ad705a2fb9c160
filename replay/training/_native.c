/* The replay's hot loops: a rounding point's record pass fused (round float64 results to float32,
   find the close calls, write their log codes), rounding alone, and the optimizer updates (below).

   Semantics are exactly those of replay/training/determinism.py (the torch path stays as the reference and
   the fallback; tests hold the two to the same indices): an element is a close call when its
   window v +- safety * err is > 0 wide and its two ends round to different float32 bit patterns.
   Built with -ffp-contract=off: every + - * is its own IEEE rounding, as in the torch path, and
   double -> float conversion is IEEE round-to-nearest-even on every target.

   This is ours, not a library's: it is the per-element core of the determinism argument, and the
   torch path spends ~10 kernel launches per rounding point on what one pass does here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Regions only for a team. A libgomp region costs a futex syscall (its barrier's wake) even where its `if` clause gives
   it one thread: about a microsecond in a VM guest, 52 of them in a small MLP's det64 step (2% of it), 279 in a small
   GPT's. IN_TEAM(threads, kind, statement) runs the statement (a for loop, LOOP, or a block, BLOCK) on `threads`
   threads where threads > 1, else as plain code: the same code, whose results never depend on the threads. */
#define LOOP "omp parallel for schedule(static) num_threads(team_)"
#define BLOCK "omp parallel num_threads(team_)"
#define IN_TEAM(threads, kind, ...) \
    do {                            \
        int team_ = (int)(threads); \
        if (team_ > 1) {            \
            _Pragma(kind) __VA_ARGS__ \
        } else {                    \
            __VA_ARGS__             \
        }                           \
    } while (0)

/* `threads` for `work` independent pieces, or 1 where either is 1 or less (no region). */
static inline int64_t team(int64_t threads, int64_t work) { return threads > 1 && work > 1 ? threads : 1; }

static inline uint32_t bits32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* determinism.ordinal: position on the float32 number line, -0 just below +0. */
static inline int64_t ordinal(float f) {
    int32_t b;
    memcpy(&b, &f, sizeof b);
    return b >= 0 ? (int64_t)b : -1 - (int64_t)(b & 0x7FFFFFFF);
}

/* A close call's log code (Rounder._log): all 32 bits of float32(v), tagged 1 << 32, where the
   window v +- wide * err holds more than two float32 values; else the parity of its ordinal. */
static inline int64_t log_code(double v, double err, double wide) {
    double ew = err * wide;
    float r = (float)v;
    if (ordinal((float)(v + ew)) - ordinal((float)(v - ew)) > 1) return ((int64_t)1 << 32) | bits32(r);
    return ordinal(r) & 1;
}

/* Do the two ends of v +- w round differently? A width that is not > 0 (0, negative, NaN) never. */
static inline int straddles(double v, double w) {
    return w > 0 && bits32((float)(v - w)) != bits32((float)(v + w));
}

/* |x|'s bits: non-negative doubles order as their bits do, and a NaN's (sign cleared) lie above infinity's. */
static inline uint64_t abs_bits(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b & 0x7FFFFFFFFFFFFFFFull;
}

/* The double whose |bits| are the largest, top: NaN for any NaN's. */
static inline double from_abs_bits(uint64_t top) {
    if (top > 0x7FF0000000000000ull) return NAN;
    double m;
    memcpy(&m, &top, sizeof m);
    return m;
}

/* The largest abs_bits(v[i]) over [0, n), each v[i] rounded to float32 into out[i] where out is given: functions
   of their own, so that they run in vectors (as an OpenMP loop's body, with a reduction, it ran one element at a
   time: 1.6 ns a value, 0.3 here). round_max_span's out may be v itself (a replay's product rounded in place), so
   its pointers are not restrict: GCC's runtime check still runs both cases in vectors. A signed maximum: abs_bits
   are below 2^63, and AVX2 has no unsigned 64-bit one. */
__attribute__((noinline)) static int64_t max_bits_span(const double *restrict v, int64_t n) {
    int64_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = (int64_t)abs_bits(v[i]);
        top = b > top ? b : top;
    }
    return top;
}

__attribute__((noinline)) static int64_t round_max_span(const double *v, double *out, int64_t n) {
    int64_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = (int64_t)abs_bits(v[i]);
        top = b > top ? b : top;
        out[i] = (double)(float)v[i];
    }
    return top;
}

#define MAX_SPAN 16384 /* values per task of a threaded maximum */

/* max over spans of max_bits_span / round_max_span (out NULL: none), spans on `threads` threads: a maximum is the
   same in any order. */
static int64_t max_bits(const double *v, double *out, int64_t n, int64_t threads) {
    int64_t top = 0, spans = (n + MAX_SPAN - 1) / MAX_SPAN;
    IN_TEAM(team(threads, spans), "omp parallel for reduction(max : top) schedule(static) num_threads(team_)",
            for (int64_t s = 0; s < spans; s++) {
                int64_t at = s * MAX_SPAN, m = n - at < MAX_SPAN ? n - at : MAX_SPAN;
                int64_t b = out ? round_max_span(v + at, out + at, m) : max_bits_span(v + at, m);
                top = b > top ? b : top;
            });
    return top;
}

/* max |v[i]| over n values, NaN if any is NaN, +0 for none or all zeros: a replay's scale at a point its log
   names. An integer max on abs_bits, exact in any order (lanes, threads), finds the same number as torch's
   reductions (but never -0). */
double rp_max_abs(const double *v, int64_t n, int64_t threads) {
    return from_abs_bits((uint64_t)max_bits(v, NULL, n, threads));
}

/* out[i] = float32(v[i]) as a double. */
void rp_round(const double *v, double *out, int64_t n, int64_t threads) {
    IN_TEAM(team(threads, n), LOOP, for (int64_t i = 0; i < n; i++) { out[i] = (double)(float)v[i]; });
}

/* torch's relu backward, threshold_backward(g, y, 0), from the float32 copy of the relu's output that backward keeps
   (ops._save): out[i] = g[i], or +0 where y[i] <= 0 (a NaN passes g, as torch's comparison does). One pass, where
   widening y to float64 first and then masking were two (the copy's values are y's: the same bits). */
void rp_relu_back(const double *g, const float *y, double *out, int64_t n, int64_t threads) {
    IN_TEAM(team(threads, n), LOOP, for (int64_t i = 0; i < n; i++) { out[i] = y[i] <= 0.0f ? 0.0 : g[i]; });
}

/* rp_round and rp_max_abs in one pass (a replay's logged point needs both): the rounded values (out == v: over
   v), and the max |v| rp_max_abs returns. */
double rp_round_max(const double *v, double *out, int64_t n, int64_t threads) {
    return from_abs_bits((uint64_t)max_bits(v, out, n, threads));
}

/* Element j's window in a row of a product: (ni * nb[j] + (bias_i + bcol[j])) * safety (Cauchy-Schwarz
   and the bias, SAFETY included). */
static inline double row_window(double ni, double nbj, double bias_i, double bcolj, double safety) {
    return (ni * nbj + (bias_i + bcolj)) * safety;
}

/* Nonzero where x +- w may straddle a rounding midpoint: its ends round to different float32s and
   w > 0. Branch-free, so that a row's loop vectorizes. */
static inline uint32_t may_straddle(double x, double w) {
    return (bits32((float)(x - w)) ^ bits32((float)(x + w))) & (0u - (uint32_t)(w > 0));
}

/* The value a product's point rounds: v's, plus its bias where rp_dot adds it (`add_bias`: v holds the product alone),
   one IEEE addition, as torch's v + bias; where none is added, v's own (x + 0 would make -0 +0). add: 0 none, 1 the
   row's (row), 2 the column's (col[j]); a loop's invariant, unswitched out of it. */
static inline double biased(double x, int add, double row, const double *col, int64_t j) {
    return add == 0 ? x : x + (add == 1 ? row : col[j]);
}

/* Round one row of a product, windows formed inline (row_window); flag[j] says whether element j may
   straddle, and the result whether any does. Flags are 32-bit, so that no lane is narrower than a
   float's: a short row (an attention head's 16 or 32) still runs in vectors. add, row, col: `biased`'s. */
static int round_row(const double *restrict v, double *restrict out, int64_t n, double ni,
                     const double *restrict nb, double bias_i, const double *restrict bcol, double safety,
                     uint32_t *restrict flag, int add, double row, const double *restrict col) {
    uint32_t any = 0;
    for (int64_t j = 0; j < n; j++) {
        double x = biased(v[j], add, row, col, j);
        out[j] = (double)(float)x;
        flag[j] = may_straddle(x, row_window(ni, nb[j], bias_i, bcol[j], safety));
        any |= flag[j];
    }
    return any != 0;
}

/* round_row's flags alone, nothing written but flag: the screen of a product rounded in place (rp_dot), whose values
   its candidates still read. */
static int row_flags(const double *restrict v, int64_t n, double ni, const double *restrict nb, double bias_i,
                     const double *restrict bcol, double safety, uint32_t *restrict flag, int add, double row,
                     const double *restrict col) {
    uint32_t any = 0;
    for (int64_t j = 0; j < n; j++) {
        flag[j] = may_straddle(biased(v[j], add, row, col, j), row_window(ni, nb[j], bias_i, bcol[j], safety));
        any |= flag[j];
    }
    return any != 0;
}

/* v's rows rounded in place, each plus its bias first where `add` says (`biased`): rp_round where nothing is added. */
static void round_rows(double *v, int64_t rows, int64_t M, int64_t N, int add, const double *bias, int64_t threads) {
    if (!add) {
        rp_round(v, v, rows * N, threads);
        return;
    }
    IN_TEAM(team(threads, rows), LOOP, for (int64_t r = 0; r < rows; r++) {
        double *vr = v + r * N, row = add == 1 ? bias[r % M] : 0.0;
        for (int64_t j = 0; j < N; j++) vr[j] = (double)(float)biased(vr[j], add, row, bias, j);
    });
}

/* The first j in [from, n) with flag[j] set, else n: eight flags at a time (a flagged element is rare
   even in a row that has one). */
static int64_t next_flag(const uint32_t *flag, int64_t from, int64_t n) {
    int64_t j = from;
    for (; j < n && j % 8; j++)
        if (flag[j]) return j;
    for (; j + 8 <= n; j += 8) {
        uint32_t eight = 0;
        for (int l = 0; l < 8; l++) eight |= flag[j + l];
        if (eight) break;
    }
    for (; j < n; j++)
        if (flag[j]) return j;
    return n;
}

/* sum_k |x_k| |y_k| in ACC independent partial sums (lanes a compiler vectorizes): a candidate's exact
   bound is a K-term chain otherwise, one add's latency per term, and a weight gradient's K is the batch
   (thousands). The order of these additions is free: the bound's own rounding, ~K u relative, is
   absorbed by SAFETY's slack, as the torch path's (another order again) is. */
#define ACC 16
typedef double lanes8_t __attribute__((vector_size(64)));
typedef int64_t bits8_t __attribute__((vector_size(64)));

/* Eight-double lanes in GCC's vector types (lanes8_t) where the target has registers that wide (AVX-512); elsewhere
   in arrays of doubles, whose loops the compiler vectorizes at the width it has: GCC splits a 64-byte vector type
   for AVX2 through the stack (partial stores read back whole, each a store-forwarding stall), which made abs_dot's
   and the norms' loops two to three times slower on an AVX2 EPYC. The same operations in the same order either
   way, so the same bits: the tests build the library both ways (`-DVECTOR_LANES=0`, `=1`) and compare. */
#ifndef VECTOR_LANES
#if defined(__AVX512F__)
#define VECTOR_LANES 1
#else
#define VECTOR_LANES 0
#endif
#endif

/* One block of a candidate's unit-stride pieces, len terms: its lanes' terms into s[ACC] (position l of each ACC
   into lane l), the rest into *tail. */
static inline void block_terms(const double *restrict ax, const double *restrict bx, int64_t len, double *restrict s,
                               double *restrict tail) {
    int64_t full = len / ACC * ACC;
    for (int64_t k = 0; k < full; k += ACC)
        for (int l = 0; l < ACC; l++) s[l] += fabs(ax[k + l]) * fabs(bx[k + l]);
    for (int64_t k = full; k < len; k++) *tail += fabs(ax[k]) * fabs(bx[k]);
}

/* tail plus ACC lanes summed pairwise (lane l with lane l + 8, as the vector types' acc[0] + acc[1], then a tree):
   a short vector's end, a candidate's 16-term bound. */
static inline double lanes_end(const double *s, double tail) {
    double r[8];
    for (int q = 0; q < 8; q++) r[q] = s[q] + s[q + 8];
    return tail + (((r[0] + r[4]) + (r[2] + r[6])) + ((r[1] + r[5]) + (r[3] + r[7])));
}

static double abs_dot(const double *restrict x, const double *restrict y, int64_t K) {
#if !VECTOR_LANES
    double acc[ACC] = {0}, e = 0;
    block_terms(x, y, K, acc, &e); /* one block of K terms */
    return lanes_end(acc, e);
#else
    const bits8_t magnitude = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    lanes8_t acc[ACC / 8] = {{0}};
    double e = 0;
    int64_t k = 0;
    for (; k + ACC <= K; k += ACC)
        for (int q = 0; q < ACC / 8; q++) {
            lanes8_t u, v;
            memcpy(&u, x + k + 8 * q, sizeof u);
            memcpy(&v, y + k + 8 * q, sizeof v);
            acc[q] += (lanes8_t)((bits8_t)u & magnitude) * (lanes8_t)((bits8_t)v & magnitude);
        }
    for (; k < K; k++) e += fabs(x[k]) * fabs(y[k]);
    lanes8_t s = acc[0] + acc[1]; /* the lanes summed pairwise: a short vector's end (a candidate's 16-term bound) */
    return e + (((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])));
#endif
}

/* A candidate of a product: its flat output index, where its A row and B column start, its value
   and bias; e, once formed, is its exact bound sum_k |A_ik B_kj|. */
typedef struct {
    int64_t out, a_off, b_off;
    double v, bias, e;
} cand_t;

typedef struct {
    cand_t *c;
    int64_t n, cap;
    int failed;
    int64_t *room; /* candidates all threads may still hold (shared): a crowded point does not take
                      memory without bound; its kernel says -1 and the caller takes the torch path */
} cands_t;

static void push(cands_t *l, cand_t c) {
    int64_t left;
#pragma omp atomic capture
    left = --*l->room; /* per candidate: the limit is the same however the rows are split */
    if (left < 0) {
        l->failed = 1;
        return;
    }
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 256;
        cand_t *grown = realloc(l->c, sizeof(cand_t) * cap);
        if (!grown) {
            l->failed = 1;
            return;
        }
        l->c = grown, l->cap = cap;
    }
    l->c[l->n++] = c;
}

/* This thread's candidate list and its contiguous block [*lo, *hi) of n rows: blocks in thread order,
   so lists merged in thread order are in row order (not left to the runtime's schedule). */
static cands_t *my_share(cands_t *lists, int64_t n, int64_t *lo, int64_t *hi) {
#ifdef _OPENMP
    int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    int64_t me = 0, team = 1;
#endif
    *lo = n * me / team, *hi = n * (me + 1) / team;
    return &lists[me];
}

/* Candidates one kernel call may hold: far above honest points' (~1e-3 of outputs), under a quarter
   of the outputs' own size in bytes at large points. */
static int64_t room_for(int64_t outputs) { return ((int64_t)1 << 16) + outputs / 24; }

/* The nt threads' candidate lists (contiguous blocks of rows or parts, in thread order: their candidates in index
   order) as up to cap (flat index, log code) pairs into idx and code, the lists freed: how many there are, or -1
   where a thread ran out of memory or room (rp_full's contract). */
static int64_t merged_calls(cands_t *lists, int nt, int64_t *idx, int64_t *code, int64_t cap, double wide) {
    int64_t found = 0;
    int failed = 0;
    for (int t = 0; t < nt; t++) failed |= lists[t].failed;
    for (int t = 0; t < nt && !failed; t++)
        for (int64_t y = 0; y < lists[t].n; y++, found++)
            if (found < cap) {
                idx[found] = lists[t].c[y].out;
                code[found] = log_code(lists[t].c[y].v, lists[t].c[y].e, wide);
            }
    for (int t = 0; t < nt; t++) free(lists[t].c);
    free(lists);
    return failed ? -1 : found;
}

/* The lanes of two 8-lane vectors at eight constant indices (0-7 the first's, 8-15 the second's): GCC's builtin and
   clang's differ (clang has no __builtin_shuffle; GCC has __builtin_shufflevector only from version 12). */
#if defined(__clang__)
#define PICK8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define PICK8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shuffle(a, b, (bits8_t){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

/* res[o] = sum_k x[o * so + k]^2 for eight unit-stride vectors (o < 8) of K terms: each vector's squares in eight
   lanes, the eight vectors side by side (eight add chains at once), then their lanes summed together, a transpose's
   adds in three rounds of shuffles, where eight reductions of their own cost an attention head's 16-term vectors
   most of their norms' time. Any order of a norm's squares is a bound's (SAFETY's slack). */
#if !VECTOR_LANES
/* out[l] = ab[i[l]] + ab[j[l]] (ab: a's eight lanes, then b's), l < 8: PICK8(a, b, i) + PICK8(a, b, j) on arrays. */
static void picked_sums(const double *a, const double *b, const int *i, const int *j, double *out) {
    for (int l = 0; l < 8; l++) out[l] = (i[l] < 8 ? a[i[l]] : b[i[l] - 8]) + (j[l] < 8 ? a[j[l]] : b[j[l] - 8]);
}
#endif

static void square_sums8(const double *x, int64_t so, int64_t K, double *res) {
#if !VECTOR_LANES
    static const int r_i[8] = {0, 8, 2, 10, 4, 12, 6, 14}, r_j[8] = {1, 9, 3, 11, 5, 13, 7, 15};
    static const int q_i[8] = {0, 1, 8, 9, 4, 5, 12, 13}, q_j[8] = {2, 3, 10, 11, 6, 7, 14, 15};
    static const int all_i[8] = {0, 1, 2, 3, 8, 9, 10, 11}, all_j[8] = {4, 5, 6, 7, 12, 13, 14, 15};
    double acc[8][8] = {{0}}, r[4][8], q[2][8], all[8], tail[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int o = 0; o < 8; o++)
            for (int l = 0; l < 8; l++) acc[o][l] += x[o * so + k + l] * x[o * so + k + l];
    for (; k < K; k++)
        for (int o = 0; o < 8; o++) tail[o] += x[o * so + k] * x[o * so + k];
    for (int o = 0; o < 4; o++) picked_sums(acc[2 * o], acc[2 * o + 1], r_i, r_j, r[o]); /* the shuffles below */
    for (int o = 0; o < 2; o++) picked_sums(r[2 * o], r[2 * o + 1], q_i, q_j, q[o]);
    picked_sums(q[0], q[1], all_i, all_j, all);
    for (int o = 0; o < 8; o++) res[o] = all[o] + tail[o];
#else
    lanes8_t acc[8] = {{0}}, r[4], q[2];
    double tail[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int o = 0; o < 8; o++) {
            lanes8_t v;
            memcpy(&v, x + o * so + k, sizeof v);
            acc[o] += v * v;
        }
    for (; k < K; k++)
        for (int o = 0; o < 8; o++) tail[o] += x[o * so + k] * x[o * so + k];
    for (int o = 0; o < 4; o++) /* lane l of r[o]: vector 2o + (l & 1)'s lanes (l & ~1) and (l | 1) */
        r[o] = PICK8(acc[2 * o], acc[2 * o + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               PICK8(acc[2 * o], acc[2 * o + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int o = 0; o < 2; o++) /* lane l of q[o]: vector 4o + (l & 3)'s lanes 4 (l >> 2) .. + 3 */
        q[o] = PICK8(r[2 * o], r[2 * o + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               PICK8(r[2 * o], r[2 * o + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    lanes8_t all = PICK8(q[0], q[1], 0, 1, 2, 3, 8, 9, 10, 11) + PICK8(q[0], q[1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int o = 0; o < 8; o++) res[o] = all[o] + tail[o];
#endif
}

/* res[o] = sqrt(sum_k x(o, k)^2) for o in [lo, hi), x(o, k) at x[o * so + k1 * s1 + k2 * s2] (k = (k1, k2)),
   walking memory in order: k outer where vectors are interleaved (so < s2), as an activation's
   transpose is. The same sums, in the same order, however [0, n) is split among threads. */
static void norms(const double *x, int64_t lo, int64_t hi, int64_t K1, int64_t K2, int64_t so, int64_t s1,
                  int64_t s2, double *res) {
    if ((K1 == 1 || s1 == K2 * s2) && so < s2) {
        for (int64_t o = lo; o < hi; o++) res[o] = 0;
        for (int64_t k = 0; k < K1 * K2; k++)
            for (int64_t o = lo; o < hi; o++) res[o] += x[o * so + k * s2] * x[o * so + k * s2];
    } else if ((K1 == 1 || s1 == K2 * s2) && s2 == 1) { /* unit-stride vectors: sums in lanes, eight vectors at once */
        int64_t o = lo;
        for (; o + 8 <= hi; o += 8) square_sums8(x + o * so, so, K1 * K2, res + o);
        for (; o < hi; o++) res[o] = abs_dot(x + o * so, x + o * so, K1 * K2);
    } else if (s2 == 1) { /* unit-stride pieces (a convolution's operands, per image): each in lanes */
        for (int64_t o = lo; o < hi; o++) {
            double acc = 0;
            for (int64_t k1 = 0; k1 < K1; k1++) acc += abs_dot(x + o * so + k1 * s1, x + o * so + k1 * s1, K2);
            res[o] = acc;
        }
    } else {
        for (int64_t o = lo; o < hi; o++) {
            const double *p = x + o * so;
            double acc = 0;
            for (int64_t k1 = 0; k1 < K1; k1++)
                for (int64_t k2 = 0; k2 < K2; k2++) acc += p[k1 * s1 + k2 * s2] * p[k1 * s1 + k2 * s2];
            res[o] = acc;
        }
    }
    for (int64_t o = lo; o < hi; o++) res[o] = sqrt(res[o]);
}

#define NORM_BLOCK 256 /* vectors per norms task: enough work per task, blocks small enough to share */

/* Every batch's vector norms (T batches of n vectors, batch t at x + t0 * st0 + t1 * st1), in
   parallel over blocks of vectors. */
static void all_norms(const double *x, int64_t b0, int64_t b1, int64_t st0, int64_t st1, int64_t n, int64_t K1,
                      int64_t K2, int64_t so, int64_t s1, int64_t s2, double *res, int threads) {
    int64_t blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK, tasks = b0 * b1 * blocks;
    IN_TEAM(team(threads, tasks), LOOP,
    for (int64_t task = 0; task < tasks; task++) {
        int64_t t = task / blocks, lo = (task % blocks) * NORM_BLOCK, hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
        norms(x + (t / b1) * st0 + (t % b1) * st1, lo, hi, K1, K2, so, s1, s2, res + t * n);
    });
}

/* A row-major block's squares, rows [0, rows) x columns [c0, c1): each row's sum over the block into part[i], each
   column's over the rows into col[c] (from +0, rows in order); rows in 8 lanes, summed pairwise at the end. */
__attribute__((noinline)) static void square_sums_block(const double *x, int64_t rows, int64_t s0, int64_t c0,
                                                        int64_t c1, double *restrict part, double *restrict col) {
    for (int64_t c = c0; c < c1; c++) col[c] = 0;
    for (int64_t i = 0; i < rows; i++) {
        const double *r = x + i * s0;
#if !VECTOR_LANES
        double acc[8] = {0};
#else
        lanes8_t acc = {0};
#endif
        double tail = 0;
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8) {
#if !VECTOR_LANES
            for (int l = 0; l < 8; l++) {
                double v = r[c + l] * r[c + l];
                acc[l] += v, col[c + l] += v;
            }
#else
            lanes8_t v, have;
            memcpy(&v, r + c, sizeof v);
            memcpy(&have, col + c, sizeof have);
            v *= v, acc += v, have += v;
            memcpy(col + c, &have, sizeof have);
#endif
        }
        for (; c < c1; c++) tail += r[c] * r[c], col[c] += r[c] * r[c];
        part[i] = tail + (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])));
    }
}

/* Both norms of a 2-D operand (rows x cols, element (i, c) at x[i * s0 + c * s1], one of the strides 1) in one pass
   over it: rn[i] = ||row i||, cn[c] = ||column c||. A linear layer's activations and gradients are each read by two
   rounding points' norms, by rows in one and by columns in the other (`ops._Matmul`: the input's rows in the forward
   product, its columns in the weight gradient's; the gradient's rows and columns in the two backward products); one
   pass reads them once (gpt-3.3m's det64 step 2% faster). Columns in blocks of NORM_BLOCK on `threads` threads, a
   row's partial sums added in block order: the same sums at any thread count. Any order of a norm's squares is a
   bound's (SAFETY's slack). 0, or -1 out of memory or a layout it does not take (the caller leaves the norms to
   rp_dot). */
int64_t rp_row_col_norms(const double *x, int64_t rows, int64_t cols, int64_t s0, int64_t s1, double *rn, double *cn,
                         int64_t threads) {
    if (s1 != 1) { /* column-major (a transposed view): the same pass over the transpose, the roles swapped */
        if (s0 != 1) return -1;
        int64_t t = rows;
        double *tn = rn;
        rows = cols, cols = t, s0 = s1, rn = cn, cn = tn;
    }
    int64_t blocks = (cols + NORM_BLOCK - 1) / NORM_BLOCK;
    double *part = malloc(sizeof(double) * (blocks * rows + 1));
    if (!part) return -1;
    IN_TEAM(team(threads, blocks), LOOP,
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t c0 = blk * NORM_BLOCK, c1 = c0 + NORM_BLOCK < cols ? c0 + NORM_BLOCK : cols;
        square_sums_block(x, rows, s0, c0, c1, part + blk * rows, cn);
    });
    for (int64_t i = 0; i < rows; i++) {
        double sum = 0;
        for (int64_t blk = 0; blk < blocks; blk++) sum += part[blk * rows + i];
        rn[i] = sqrt(sum);
    }
    for (int64_t c = 0; c < cols; c++) cn[c] = sqrt(cn[c]);
    free(part);
    return 0;
}

/* all_norms, an operand broadcast over the batch (both batch strides 0: a convolution's filter, the same for every
   image) formed once and copied to each batch's place (cnn-32's second layer: 64 x 64 x 288 terms -> 64 x 288). */
static void batch_norms(const double *x, int64_t b0, int64_t b1, int64_t st0, int64_t st1, int64_t n, int64_t K1,
                        int64_t K2, int64_t so, int64_t s1, int64_t s2, double *res, int threads) {
    if (b0 * b1 == 1 || st0 != 0 || st1 != 0) {
        all_norms(x, b0, b1, st0, st1, n, K1, K2, so, s1, s2, res, threads);
        return;
    }
    all_norms(x, 1, 1, 0, 0, n, K1, K2, so, s1, s2, res, threads);
    for (int64_t t = 1; t < b0 * b1; t++) memcpy(res + t * n, res, sizeof(double) * n);
}

/* The vectors [lo, hi) of an operand (x(o, k) as in norms) into dst, unit stride (o * K + k); a flat
   interleaved source in 32 x 32 tiles, read a cache line at a time. */
static void gather(const double *x, int64_t lo, int64_t hi, int64_t K1, int64_t K2, int64_t so, int64_t s1,
                   int64_t s2, double *dst) {
    int64_t K = K1 * K2;
    if (K1 != 1 && s1 != K2 * s2) {
        for (int64_t o = lo; o < hi; o++)
            for (int64_t k1 = 0; k1 < K1; k1++)
                for (int64_t k2 = 0; k2 < K2; k2++) dst[o * K + k1 * K2 + k2] = x[o * so + k1 * s1 + k2 * s2];
        return;
    }
    const int64_t TILE = 32;
    for (int64_t o0 = lo; o0 < hi; o0 += TILE)
        for (int64_t k0 = 0; k0 < K; k0 += TILE)
            for (int64_t o = o0; o < o0 + TILE && o < hi; o++)
                for (int64_t k = k0; k < k0 + TILE && k < K; k++) dst[o * K + k] = x[o * so + k * s2];
}

/* A unit-stride copy of an operand's n vectors (NULL out of memory), in parallel over blocks. */
static double *unit_copy(const double *x, int64_t n, int64_t K1, int64_t K2, int64_t so, int64_t s1, int64_t s2,
                         int threads) {
    double *dst = malloc(sizeof(double) * (n * K1 * K2 + 1));
    if (!dst) return NULL;
    int64_t blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    IN_TEAM(team(threads, blocks), LOOP,
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t lo = blk * NORM_BLOCK, hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
        gather(x, lo, hi, K1, K2, so, s1, s2, dst);
    });
    return dst;
}

#define CHUNK 4096 /* candidates whose exact bounds one strided pass forms together */
#define PIECE_MIN 16 /* unit-stride pieces at least this long are summed in lanes (abs_dot) */

/* The k-outer sums of candidates [lo, hi) (their e zero) on arrays of their offsets and sums alone:
   each k reads 24 bytes a candidate, not a cand_t's 48, where the arrays of a few thousand candidates are
   read K times (a 10.5M MLP's input gradient: 2,048 terms, 3,271 candidates, 20 -> 13 ms). The same sums
   in the same order as the loop on cand_t; 0 where they cannot be allocated (the caller runs that loop). */
static int streamed(cand_t *c, int64_t lo, int64_t hi, const double *a, const double *b, int64_t K1, int64_t K2,
                    int64_t sak1, int64_t sak2, int64_t sbk1, int64_t sbk2) {
    int64_t n = hi - lo, *ao = malloc(sizeof(int64_t) * (n + 1)), *bo = malloc(sizeof(int64_t) * (n + 1));
    double *e = calloc(n + 1, sizeof(double));
    int ok = ao && bo && e;
    for (int64_t x = 0; ok && x < n; x++) ao[x] = c[lo + x].a_off, bo[x] = c[lo + x].b_off;
    for (int64_t k1 = 0; ok && k1 < K1; k1++)
        for (int64_t k2 = 0; k2 < K2; k2++) {
            const double *ak = a + k1 * sak1 + k2 * sak2, *bk = b + k1 * sbk1 + k2 * sbk2;
            for (int64_t x = 0; x < n; x++) e[x] += fabs(ak[ao[x]]) * fabs(bk[bo[x]]);
        }
    for (int64_t x = 0; ok && x < n; x++) c[lo + x].e = e[x];
    free(ao), free(bo), free(e);
    return ok;
}

typedef struct {
    int64_t key, at;
} keyed_t;

static int by_key(const void *p, const void *q) {
    const keyed_t *x = p, *y = q;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : (x->at > y->at) - (x->at < y->at);
}

/* Candidates [lo, hi) in the order of their B vectors (then their own), or NULL out of memory (index order
   then). Candidates come in output order, A's vector by A's vector: where B has more vectors (a
   convolution's weight gradient: 288 columns for 64 channels), each image's B slice is then read once
   while its candidates sum their pieces, not once for every A vector (cnn-32's: 10 -> 8.5 ms). Each
   candidate's sum is the same, in the same order. */
static keyed_t *by_column(const cand_t *c, int64_t lo, int64_t hi) {
    keyed_t *order = malloc(sizeof(keyed_t) * (hi - lo + 1));
    if (!order) return NULL;
    for (int64_t x = lo; x < hi; x++) order[x - lo] = (keyed_t){c[x].b_off, x};
    qsort(order, hi - lo, sizeof(keyed_t), by_key);
    return order;
}

#define PIECES_CACHE (192 * 1024) /* bytes of both operands' pieces over one block of positions (in L2) */

/* Exact bounds of candidates [lo, hi) over unit-stride pieces (a convolution's weight gradient: K1 images of K2
   positions, M rows of A, N columns of B), image by image and within an image by blocks of positions short
   enough that both operands' slices of a block stay in cache (PIECES_CACHE), each candidate adding its piece of a
   block into its own ACC lanes, kept between blocks. Summing a whole image's piece per candidate read every
   candidate's pieces from memory where an image's slices outgrow the cache (cnn-32's second layer: 288 columns of
   256 positions, 576 KiB an image). Candidates in `order` (by B vector) where given: a B piece is read once
   for the candidates beside it. 0 where one block spans an image (the caller sums piece by piece); where the lanes
   cannot be allocated, each candidate's blocks in turn (the same sums). Another order of the same terms: a bound's
   (abs_dot). */
static int pieces_in_blocks(cand_t *c, int64_t lo, int64_t hi, const double *a, const double *b, int64_t M,
                            int64_t N, int64_t K1, int64_t K2, int64_t sak1, int64_t sbk1, const keyed_t *order) {
    int64_t n = hi - lo;
    if (n <= 0 || M + N <= 0) return 0;
    int64_t P = PIECES_CACHE / ((int64_t)sizeof(double) * (M + N)) / ACC * ACC;
    if (P < ACC) P = ACC;
    if (P >= K2) return 0;
    double *acc = calloc(ACC * (n + 1), sizeof(double)), *tail = calloc(n + 1, sizeof(double));
    if (!acc || !tail) { /* each candidate alone, all its blocks in turn: the same sums, with no room */
        free(acc), free(tail);
        for (int64_t y = 0; y < n; y++) {
            int64_t x = order ? order[y].at : lo + y;
            double s[ACC] = {0}, t = 0;
            for (int64_t k1 = 0; k1 < K1; k1++)
                for (int64_t p0 = 0; p0 < K2; p0 += P)
                    block_terms(a + k1 * sak1 + c[x].a_off + p0, b + k1 * sbk1 + c[x].b_off + p0,
                                p0 + P < K2 ? P : K2 - p0, s, &t);
            c[x].e = lanes_end(s, t);
        }
        return 1;
    }
    for (int64_t k1 = 0; k1 < K1; k1++)
        for (int64_t p0 = 0; p0 < K2; p0 += P)
            for (int64_t y = 0; y < n; y++) {
                int64_t x = order ? order[y].at : lo + y;
                double s[ACC];
                memcpy(s, acc + ACC * y, sizeof s);
                block_terms(a + k1 * sak1 + c[x].a_off + p0, b + k1 * sbk1 + c[x].b_off + p0,
                            p0 + P < K2 ? P : K2 - p0, s, tail + y);
                memcpy(acc + ACC * y, s, sizeof s);
            }
    for (int64_t y = 0; y < n; y++) c[order ? order[y].at : lo + y].e = lanes_end(acc + ACC * y, tail[y]);
    free(acc), free(tail);
    return 1;
}

/* Exact bounds of candidates [lo, hi). Unit-stride vectors: one dot each. Unit-stride pieces (k2):
   k1 outer, a piece's dot each. Otherwise k outer over the chunk (`streamed`): at each k the
   candidates read one row of each operand's memory, where the vectors of one candidate alone are K
   cache misses (a weight gradient's operands are both strided). */
static void exact_bounds(cand_t *c, int64_t lo, int64_t hi, const double *a, const double *b, int64_t M,
                         int64_t N, int64_t K1, int64_t K2, int64_t sak1, int64_t sak2, int64_t sbk1, int64_t sbk2,
                         int unit, int by_b_vector) {
    if (unit) {
        for (int64_t x = lo; x < hi; x++) c[x].e = abs_dot(a + c[x].a_off, b + c[x].b_off, K1 * K2);
        return;
    }
    for (int64_t x = lo; x < hi; x++) c[x].e = 0;
    if (sak2 == 1 && sbk2 == 1 && K2 >= PIECE_MIN) { /* unit-stride pieces (a convolution's weight gradient:
        one image's positions): one image's slices of both operands stay in cache while every candidate
        sums its piece there, in lanes (block by block where they outgrow it: `pieces_in_blocks`); a
        candidate's whole vectors, one after another, stream from memory */
        keyed_t *order = by_b_vector ? by_column(c, lo, hi) : NULL;
        if (pieces_in_blocks(c, lo, hi, a, b, M, N, K1, K2, sak1, sbk1, order)) {
            free(order);
            return;
        }
        for (int64_t k1 = 0; k1 < K1; k1++)
            for (int64_t y = lo; y < hi; y++) {
                int64_t x = order ? order[y - lo].at : y;
                c[x].e += abs_dot(a + k1 * sak1 + c[x].a_off, b + k1 * sbk1 + c[x].b_off, K2);
            }
        free(order);
        return;
    }
    if (streamed(c, lo, hi, a, b, K1, K2, sak1, sak2, sbk1, sbk2)) return;
    for (int64_t k1 = 0; k1 < K1; k1++)
        for (int64_t k2 = 0; k2 < K2; k2++) {
            const double *ak = a + k1 * sak1 + k2 * sak2, *bk = b + k1 * sbk1 + k2 * sbk2;
            for (int64_t x = lo; x < hi; x++) c[x].e += fabs(ak[c[x].a_off]) * fabs(bk[c[x].b_off]);
        }
}

/* A product's operands as rp_dot takes them (see there). */
typedef struct {
    const double *a, *b;
    int64_t b0, b1, M, N, K1, K2, sa0, sa1, sai, sak1, sak2, sb0, sb1, sbk1, sbk2, sbj;
} product_t;

#define COPY_CACHED (1 << 17) /* an operand of at most this many doubles (1 MiB) is copied within the cache */
#define COPY_MOST (1 << 25)   /* copies of more doubles than this (256 MiB) are not made: the candidates stream */

/* Is a strided operand of n vectors of K terms worth a unit-stride copy, `distinct` of its vectors read by
   `reads` candidates? Within the cache, where more than an eighth of its vectors are read (cheaper than their
   strided reads); beyond it, where each vector is read more than twice on average: a copy writes the operand
   again to memory, and streaming reads it once (a 10.5M MLP's input gradient: 3,271 candidates over 2,048
   vectors of 2,048 terms: 20 ms copied, 13 streamed). Both strided (a weight gradient's) are copied together
   where their candidates are more than twice their vectors in all (a 10.5M MLP's: 55K candidates over 2,048
   + 2,048 vectors of 256 terms: 28 ms streamed, 9 copied; at 8.7K about even; 865 over 256 + 256 vectors of
   64 terms: streamed 40% faster). Never past COPY_MOST: a step's memory stays its own (a GPT-2 head's weight
   gradient at a long block would copy 0.4 GiB). */
static int worth_copying(int64_t distinct, int64_t reads, int64_t n, int64_t K) {
    if (n * K > COPY_MOST) return 0;
    return n * K <= COPY_CACHED ? distinct > 8 + n / 8 : reads > 2 * n;
}

/* exact_bounds over candidates c[0, n) in chunks on nt threads: each thread a share, up to CHUNK (a chunk's
   accumulators stay in L1); in a batched product each batch starts a chunk of its own (a convolution's image
   slice then stays in cache while its candidates sum, where a chunk over all images missed it at every term:
   cnn-32's convolutions' points 3.5 -> 3.3 and 3.2 -> 3.0 ms; an attention's 64 batches of a few candidates
   each, no slower). Each candidate's sum is the same however they are chunked. */
static void summed_in_chunks(const product_t *p, cand_t *c, int64_t n, const double *a, const double *b, int64_t sak1,
                             int64_t sak2, int64_t sbk1, int64_t sbk2, int unit, int nt) {
    int64_t chunk = (n + nt - 1) / nt, mn = p->M * p->N, chunks = 0;
    chunk = chunk < 64 ? 64 : chunk > CHUNK ? CHUNK : chunk;
    int64_t *starts = malloc(sizeof(int64_t) * (n + 2));
    if (!starts) { /* one chunk: the same sums */
        exact_bounds(c, 0, n, a, b, p->M, p->N, p->K1, p->K2, sak1, sak2, sbk1, sbk2, unit, p->N > p->M);
        return;
    }
    for (int64_t x = 0; x < n; x++) {
        int next_batch = p->b0 * p->b1 > 1 && x && c[x].out / mn != c[x - 1].out / mn;
        if (!chunks || x - starts[chunks - 1] == chunk || next_batch) starts[chunks++] = x;
    }
    starts[chunks] = n;
    IN_TEAM(team(nt, chunks), "omp parallel for schedule(dynamic) num_threads(team_)",
            for (int64_t ch = 0; ch < chunks; ch++) {
                exact_bounds(c, starts[ch], starts[ch + 1], a, b, p->M, p->N, p->K1, p->K2, sak1, sak2, sbk1, sbk2, unit,
                             p->N > p->M);
            });
    free(starts);
}

/* The exact bounds' sums of candidates all[0, total) (index order), on nt threads (`summed_in_chunks`), but for
   those `done` marks (NULL: none), whose e stays +0; how operands are read is decided on the candidates summed (an
   MLP's weight gradient whose candidates are all disjoint zeros copies nothing). An unbatched product copies its
   strided operands to unit stride once where many candidates read them (`worth_copying`: one strided operand, or
   both, summed pieces shorter than PIECE_MIN included); otherwise they stream (exact_bounds), and summed pieces of
   PIECE_MIN or more (a convolution's weight gradient) keep their own path. A copy that cannot be allocated is not
   made. Which way a sum is read changes its order of addition only (the bound's own rounding: SAFETY's slack). */
static void exact_phase(const product_t *p, cand_t *all, int64_t total, const unsigned char *done, int nt) {
    /* the candidates to sum: the unmarked, in order (put back below); out of memory for that copy, every candidate
       (the marked ones' sums are +0 too) */
    cand_t *rest = done ? malloc(sizeof(cand_t) * (total + 1)) : NULL, *c = rest ? rest : all;
    int64_t n = total;
    if (rest) {
        n = 0;
        for (int64_t x = 0; x < total; x++)
            if (!done[x]) rest[n++] = all[x];
    }
    int64_t K = p->K1 * p->K2, rows_hit = 0, sak1 = p->sak1, sak2 = p->sak2, sbk1 = p->sbk1, sbk2 = p->sbk2;
    for (int64_t x = 0; x < n; x++) rows_hit += x == 0 || c[x].out / p->N != c[x - 1].out / p->N;
    int unit_a = (p->K1 == 1 || sak1 == p->K2 * sak2) && sak2 == 1;
    int unit_b = (p->K1 == 1 || sbk1 == p->K2 * sbk2) && sbk2 == 1;
    int single = p->b0 * p->b1 == 1 && n > 0;
    double *ac = !unit_a && unit_b && single && worth_copying(rows_hit, n, p->M, K)
                     ? unit_copy(p->a, p->M, p->K1, p->K2, p->sai, sak1, sak2, nt)
                     : NULL;
    double *bc = !unit_b && unit_a && single && worth_copying(n, n, p->N, K)
                     ? unit_copy(p->b, p->N, p->K1, p->K2, p->sbj, sbk1, sbk2, nt)
                     : NULL;
    int pieces = sak2 == 1 && sbk2 == 1 && p->K2 >= PIECE_MIN; /* exact_bounds' summed pieces */
    int64_t both = p->M + p->N;
    if (!unit_a && !unit_b && single && !pieces && n > 2 * both && both * K <= COPY_MOST) {
        ac = unit_copy(p->a, p->M, p->K1, p->K2, p->sai, sak1, sak2, nt);
        bc = ac ? unit_copy(p->b, p->N, p->K1, p->K2, p->sbj, sbk1, sbk2, nt) : NULL;
        if (!bc) free(ac), ac = NULL;
    }
    if (ac) {
        for (int64_t x = 0; x < n; x++) c[x].a_off = c[x].out / p->N * K;
        sak1 = p->K2, sak2 = 1, unit_a = 1;
    }
    if (bc) {
        for (int64_t x = 0; x < n; x++) c[x].b_off = c[x].out % p->N * K;
        sbk1 = p->K2, sbk2 = 1, unit_b = 1;
    }
    if (n) summed_in_chunks(p, c, n, ac ? ac : p->a, bc ? bc : p->b, sak1, sak2, sbk1, sbk2, unit_a && unit_b, nt);
    if (rest) {
        for (int64_t x = 0, y = 0; x < total; x++)
            if (!done[x]) all[x].e = rest[y++].e;
        free(rest);
    }
    free(ac), free(bc);
}

/* Support masks of n vectors of K terms (x(o, k) as in norms): bit k of vector o's words set where its term is
   not zero. Only finite operands are passed (see disjoint_terms), so a term set in neither operand's mask
   contributes |a| |b| = +0 exactly to the exact bound's sum. */
static void support_masks(const double *x, int64_t n, int64_t K1, int64_t K2, int64_t so, int64_t s1, int64_t s2,
                          int64_t words, uint64_t *mask) {
    memset(mask, 0, sizeof(uint64_t) * n * words);
    if ((K1 == 1 || s1 == K2 * s2) && so < s2) { /* interleaved vectors (an activation's transpose): k outer */
        for (int64_t k = 0; k < K1 * K2; k++) {
            uint64_t *m = mask + k / 64;
            const double *xk = x + k * s2;
            for (int64_t o = 0; o < n; o++) m[o * words] |= (uint64_t)(xk[o * so] != 0) << (k % 64);
        }
        return;
    }
    for (int64_t o = 0; o < n; o++)
        for (int64_t k1 = 0; k1 < K1; k1++)
            for (int64_t k2 = 0; k2 < K2; k2++) {
                int64_t k = k1 * K2 + k2;
                mask[o * words + k / 64] |= (uint64_t)(x[o * so + k1 * s1 + k2 * s2] != 0) << (k % 64);
            }
}

#define DISJOINT_WORDS 16 /* reductions up to 1,024 terms: a mask's words per vector */

/* Candidates of an unbatched product whose A and B vectors have no nonzero term in common: their exact bound is
   +0, the sum the exact phase would form (each of its terms |a| |b| = +0: finite operands, as their norms say).
   An MLP's weight gradient under ReLU has zeros on both sides, and where their supports miss each other the
   output is an exact 0 that Cauchy-Schwarz's window (> 0) flags: 865 of its 865 candidates at 256 x 256 over a
   batch of 64, each a strided K-term sum otherwise. Such an output is +-0 (no bias: a weight gradient's), so
   only zero-valued candidates are looked at, and the masks (a bit per term, one pass over both operands) are
   made only where those outnumber a quarter of the vectors: a network without zeros makes none. Marks done[x];
   returns how many it marked (0: none, or not worth it, or out of memory). */
static int64_t disjoint_terms(const product_t *p, const double *na, const double *nb, const cand_t *all, int64_t total,
                              unsigned char *done) {
    int64_t K = p->K1 * p->K2, words = (K + 63) / 64, marked = 0, zeros = 0;
    for (int64_t x = 0; x < total; x++) zeros += all[x].v == 0.0;
    if (p->b0 * p->b1 != 1 || words > DISJOINT_WORDS || 4 * zeros < p->M + p->N) return 0;
    uint64_t *ma = malloc(sizeof(uint64_t) * ((p->M + p->N) * words + 1)), *mb = ma + p->M * words;
    if (!ma) return 0;
    support_masks(p->a, p->M, p->K1, p->K2, p->sai, p->sak1, p->sak2, words, ma);
    support_masks(p->b, p->N, p->K1, p->K2, p->sbj, p->sbk1, p->sbk2, words, mb);
    for (int64_t x = 0; x < total; x++) {
        int64_t i = all[x].out / p->N, j = all[x].out % p->N;
        if (all[x].v != 0.0 || !isfinite(na[i]) || !isfinite(nb[j])) continue; /* |0| |inf| is NaN, not 0 */
        uint64_t common = 0;
        for (int64_t w = 0; w < words; w++) common |= ma[i * words + w] & mb[j * words + w];
        done[x] = !common;
        marked += done[x];
    }
    free(ma);
    return marked;
}

/* exact_phase, the candidates disjoint_terms marks left at +0 (all summed where the marks cannot be allocated). */
static void exact_phase_rest(const product_t *p, const double *na, const double *nb, cand_t *all, int64_t total,
                             int nt) {
    unsigned char *done = calloc(total + 1, 1);
    int marked = done && disjoint_terms(p, na, nb, all, total, done) > 0;
    exact_phase(p, all, total, marked ? done : NULL, nt);
    free(done);
}

/* A call's arguments in one block: ctypes converts each argument of a call in Python, about a third of a
   microsecond each, which was most of a small rounding point's cost at rp_dot's 29. Every field is 8 bytes
   (no padding), so native.py packs the block with struct in this order. */
typedef struct {
    const double *v;
    double *out;
    int64_t b0, b1, M, N, K1, K2;
    const double *a;
    int64_t sa0, sa1, sai, sak1, sak2;
    const double *b;
    int64_t sb0, sb1, sbk1, sbk2, sbj;
    const double *bias;
    int64_t bias_rows;
    int64_t add_bias; /* v holds the product alone: its bias is added here, in the passes that read v (`biased`) */
    const double *na_in, *nb_in; /* A's row norms (b0 * b1 * M) and B's column norms (b0 * b1 * N), batch by batch,
                                    where the caller has them (rp_row_col_norms; a convolution's columns' norms from
                                    im2col, rp_im2col), else NULL: formed here */
    double gbias, g, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap;
} dot_args_t;

/* C = scale * (A @ B) + bias over a batch of up to two dims (t0 < b0, t1 < b1), output v contiguous
   (b0, b1, M, N); the reduction index k runs over K1 x K2. A element (t0, t1, i, k1, k2) at
   a[t0*sa0 + t1*sa1 + i*sai + k1*sak1 + k2*sak2], B element (t0, t1, k1, k2, j) at
   b[t0*sb0 + t1*sb1 + k1*sbk1 + k2*sbk2 + j*sbj] (a stride of 0 broadcasts). g = gamma(K + 2) *
   |scale|; bias (contiguous) or NULL, per column j (bias_rows 0) or per row i (bias_rows 1), its term
   babs = |bias| * gbias (gbias = gamma(K + 2)); add_bias: v is the product alone, and the point's value is v + bias
   (one IEEE addition an element, formed where v is read: a GEMM that adds the bias copies it into the output
   first, a pass of its own). Candidates by Cauchy-Schwarz (||A_i|| ||B_j|| g + babs),
   then the exact bound g * sum_k |A_ik B_kj| + babs. Writes up to cap close calls (flat index, log code)
   at idx and code; returns how many there are, so the caller can retry with room for all, or -1 out of
   memory or room (the caller takes the torch path). Rows run on `threads` threads, each a contiguous
   block of them, so the candidates come out in index order, and every number is formed the same way at
   any thread count. out == v rounds v in place: its rows' screens first (row_flags), v rounded once every close
   call is found (the candidates read v's values; a failure or a rerun for room finds v as it was), where a
   separate out is written row by row with the screen (round_row): a fresh output's pages are not read in
   from memory (gpt's (512, 256) products: 0.5 -> 0.3 ns an output). */
int64_t rp_dot(const dot_args_t *x) {
    const double *v = x->v, *a = x->a, *b = x->b, *bias = x->bias;
    double *out = x->out, g = x->g, safety = x->safety, wide = x->wide;
    int64_t b0 = x->b0, b1 = x->b1, M = x->M, N = x->N, K1 = x->K1, K2 = x->K2, bias_rows = x->bias_rows;
    int64_t sa0 = x->sa0, sa1 = x->sa1, sai = x->sai, sak1 = x->sak1, sak2 = x->sak2;
    int64_t sb0 = x->sb0, sb1 = x->sb1, sbk1 = x->sbk1, sbk2 = x->sbk2, sbj = x->sbj;
    int64_t threads = x->threads, *idx = x->idx, *code = x->code, cap = x->cap;
    int64_t T = b0 * b1, rows = T * M, found = 0;
    int in_place = out == v, add = x->add_bias && bias ? (x->bias_rows ? 1 : 2) : 0;
    if (rows == 0) return 0; /* no outputs (and no row to count from: M or a batch dim is 0) */
    int nt = threads > 1 && rows > 1 ? (int)(threads < rows ? threads : rows) : 1;
    double *na = malloc(sizeof(double) * (T * M + T * N + N + M + 1)), *nb = na + T * M, *bcol = nb + T * N;
    double *brow = bcol + N; /* |bias| * gbias per column and per row (one IEEE multiply each, as torch's) */
    cands_t *lists = calloc(nt, sizeof(cands_t));
    int64_t room = room_for(rows * N);
    for (int x = 0; lists && x < nt; x++) lists[x].room = &room;
    if (!na || !lists) {
        free(na), free(lists);
        return -1;
    }
    for (int64_t j = 0; j < N; j++) bcol[j] = bias && !bias_rows ? fabs(bias[j]) * x->gbias : 0.0;
    for (int64_t i = 0; i < M; i++) brow[i] = bias && bias_rows ? fabs(bias[i]) * x->gbias : 0.0;
    if (x->na_in)
        memcpy(na, x->na_in, sizeof(double) * T * M);
    else
        batch_norms(a, b0, b1, sa0, sa1, M, K1, K2, sai, sak1, sak2, na, nt);
    if (x->nb_in)
        memcpy(nb, x->nb_in, sizeof(double) * T * N);
    else
        batch_norms(b, b0, b1, sb0, sb1, N, K1, K2, sbj, sbk1, sbk2, nb, nt);
    IN_TEAM(nt, BLOCK,
    {
        int64_t lo, hi;
        cands_t *mine = my_share(lists, rows, &lo, &hi);
        uint32_t *flag = malloc(sizeof(uint32_t) * (N + 1));
        if (!flag) mine->failed = 1;
        /* (t, i) of row r, and t's (t0, t1), counted along rather than divided out: four 64-bit
           divisions a row cost more than rounding a short row (an attention head's) */
        int64_t t = lo / M, i = lo % M, t0 = t / b1, t1 = t % b1;
        for (int64_t r = lo; r < hi && !mine->failed; r++) {
            int64_t base = r * N;
            double bias_i = brow[i], ni = na[r] * g;
            const double *vr = v + base;
            double row = add == 1 ? bias[i] : 0.0;
            int flagged = in_place ? row_flags(vr, N, ni, nb + t * N, bias_i, bcol, safety, flag, add, row, bias)
                                   : round_row(vr, out + base, N, ni, nb + t * N, bias_i, bcol, safety, flag, add,
                                               row, bias);
            if (flagged) {
                int64_t a_off = t0 * sa0 + t1 * sa1 + i * sai;
                for (int64_t j = next_flag(flag, 0, N); j < N; j = next_flag(flag, j + 1, N))
                    push(mine, (cand_t){base + j, a_off, t0 * sb0 + t1 * sb1 + j * sbj, biased(vr[j], add, row, bias, j),
                                        bias_i + bcol[j], 0});
            }
            if (++i == M) {
                i = 0, t++;
                if (++t1 == b1) t1 = 0, t0++;
            }
        }
        free(flag);
    });
    int failed = 0;
    int64_t total = 0;
    for (int x = 0; x < nt; x++) failed |= lists[x].failed, total += lists[x].n;
    cand_t *all = failed ? NULL : total && nt > 1 ? malloc(sizeof(cand_t) * total) : total ? lists[0].c : NULL;
    if (failed || (total && !all)) {
        for (int x = 0; x < nt; x++) free(lists[x].c);
        free(lists), free(na);
        return -1;
    }
    if (all && all != lists[0].c)
        for (int64_t x = 0, at = 0; x < nt; at += lists[x].n, x++)
            if (lists[x].n) memcpy(all + at, lists[x].c, sizeof(cand_t) * lists[x].n);
    product_t prod = {a, b, b0, b1, M, N, K1, K2, sa0, sa1, sai, sak1, sak2, sb0, sb1, sbk1, sbk2, sbj};
    exact_phase_rest(&prod, na, nb, all, total, nt);
    for (int64_t x = 0; x < total; x++) {
        double e = all[x].e * g + all[x].bias;
        if (!straddles(all[x].v, e * safety)) continue;
        if (found < cap) {
            idx[found] = all[x].out;
            code[found] = log_code(all[x].v, e, wide);
        }
        found++;
    }
    if (all && all != lists[0].c) free(all);
    for (int x = 0; x < nt; x++) free(lists[x].c);
    free(lists), free(na);
    if (in_place && found <= cap) /* last: a failure (-1) or a rerun for room (found > cap) finds v as it was */
        round_rows(out, rows, M, N, add, bias, threads);
    return found;
}

/* The exact bounds g * sum_k |A_ik B_kj| + babs at n flat output indices idx (a replay's logged
   elements; any order), operands and bias as in rp_dot, into e: the record pass's code, though not
   always its order of addition (a copy or the lanes depend on the set of indices; any order is within
   SAFETY's slack). 0, or -1 out of memory, -2 an index outside the output (the caller refuses the log
   before that). */
int64_t rp_dot_at(int64_t b0, int64_t b1, int64_t M, int64_t N, int64_t K1, int64_t K2, const double *a, int64_t sa0,
                  int64_t sa1, int64_t sai, int64_t sak1, int64_t sak2, const double *b, int64_t sb0, int64_t sb1,
                  int64_t sbk1, int64_t sbk2, int64_t sbj, const double *babs, int64_t bias_rows, double g,
                  int64_t threads, const int64_t *idx, int64_t n, double *e) {
    int64_t size = b0 * b1 * M * N;
    cand_t *all = malloc(sizeof(cand_t) * (n + 1));
    if (!all) return -1;
    for (int64_t x = 0; x < n; x++) {
        int64_t o = idx[x];
        if (o < 0 || o >= size) {
            free(all);
            return -2;
        }
        int64_t t = o / (M * N), i = o / N % M, j = o % N;
        double bias = babs ? babs[bias_rows ? i : j] : 0.0;
        all[x] = (cand_t){o, (t / b1) * sa0 + (t % b1) * sa1 + i * sai, (t / b1) * sb0 + (t % b1) * sb1 + j * sbj, 0,
                          bias, 0};
    }
    product_t prod = {a, b, b0, b1, M, N, K1, K2, sa0, sa1, sai, sak1, sak2, sb0, sb1, sbk1, sbk2, sbj};
    exact_phase(&prod, all, n, NULL, threads > 1 ? (int)threads : 1);
    for (int64_t x = 0; x < n; x++) e[x] = all[x].e * g + all[x].bias;
    free(all);
    return 0;
}

/* A convolution's geometry: input planes (B, C, H, W) at strides xs[4] (any: a view), kernel kh x kw,
   zero padding pad, stride st; the output is Ho x Wo, L = Ho * Wo positions. */
typedef struct {
    int64_t B, C, H, W, kh, kw, pad, st, Ho, Wo;
} conv_t;

/* The output columns [*lo, *hi) whose input column ox * st + j - pad lies inside the input (0 <= . < W). */
static void inside(const conv_t *cv, int64_t j, int64_t *lo, int64_t *hi) {
    int64_t first = cv->pad - j, end = cv->W + cv->pad - j; /* ox * st in [first, end) */
    *lo = first > 0 ? (first + cv->st - 1) / cv->st : 0;
    *hi = end > 0 ? (end + cv->st - 1) / cv->st : 0;
    if (*hi > cv->Wo) *hi = cv->Wo;
    if (*lo > *hi) *lo = *hi;
}

/* dst[k] = src[k * step] for k < n: unit steps (stride 1) in vectors. */
static inline void copy_row(double *restrict dst, const double *restrict src, int64_t n, int64_t step) {
    if (step == 1)
        for (int64_t k = 0; k < n; k++) dst[k] = src[k];
    else
        for (int64_t k = 0; k < n; k++) dst[k] = src[k * step];
}

#define SHORT_ROW 16 /* output rows shorter than this are gathered by table (gather_table) */

/* dst[t] = src[off[t]], or 0 where off[t] < 0 (noinline: in an OpenMP loop's body it ran one at a time). */
__attribute__((noinline)) static void gather_plane(const double *restrict src, const int64_t *restrict off, int64_t n,
                                                   double *restrict dst) {
    for (int64_t t = 0; t < n; t++) dst[t] = off[t] >= 0 ? src[off[t]] : 0.0;
}

/* The offset of each column entry of a (b, c) plane in its input plane, -1 in the padding: the same table for every
   plane (kk * L entries); NULL out of memory. */
static int64_t *gather_table(const int64_t *xs, const conv_t *cv) {
    int64_t L = cv->Ho * cv->Wo, n = cv->kh * cv->kw * L;
    int64_t *off = malloc(sizeof(int64_t) * (n + 1));
    if (!off) return NULL;
    for (int64_t i = 0, t = 0; i < cv->kh; i++)
        for (int64_t j = 0; j < cv->kw; j++)
            for (int64_t oy = 0; oy < cv->Ho; oy++)
                for (int64_t ox = 0; ox < cv->Wo; ox++, t++) {
                    int64_t y = oy * cv->st + i - cv->pad, c = ox * cv->st + j - cv->pad;
                    off[t] = y >= 0 && y < cv->H && c >= 0 && c < cv->W ? y * xs[2] + c * xs[3] : -1;
                }
    return off;
}

/* One input plane xp's kh * kw rows of columns into op (kk * L), row by row. */
static void plane_columns(const double *xp, const int64_t *xs, const conv_t *cv, double *op) {
    int64_t L = cv->Ho * cv->Wo;
    for (int64_t i = 0; i < cv->kh; i++)
        for (int64_t j = 0; j < cv->kw; j++, op += L) {
            int64_t lo, hi, step = cv->st * xs[3];
            inside(cv, j, &lo, &hi); /* (divisions: once per kernel tap, not per row) */
            for (int64_t oy = 0; oy < cv->Ho; oy++) {
                int64_t y = oy * cv->st + i - cv->pad;
                double *row = op + oy * cv->Wo;
                int valid = y >= 0 && y < cv->H;
                for (int64_t ox = 0; ox < (valid ? lo : cv->Wo); ox++) row[ox] = 0.0;
                if (!valid) continue;
                /* from the first input column inside (pointers formed only inside the input) */
                if (hi > lo) copy_row(row + lo, xp + y * xs[2] + (lo * cv->st + j - cv->pad) * xs[3], hi - lo, step);
                for (int64_t ox = hi; ox < cv->Wo; ox++) row[ox] = 0.0;
            }
        }
}

/* One (b, c) plane's columns: by table (off, rows shorter than SHORT_ROW: cnn's stride-2 convolution's 8 positions
   cost more in a row loop's bookkeeping than in their copies) or row by row. */
static void one_plane(const double *x, const int64_t *xs, const conv_t *cv, const int64_t *off, int64_t bc,
                      double *out) {
    int64_t n = cv->kh * cv->kw * cv->Ho * cv->Wo;
    const double *xp = x + bc / cv->C * xs[0] + bc % cv->C * xs[1];
    if (off)
        gather_plane(xp, off, n, out + bc * n);
    else
        plane_columns(xp, xs, cv, out + bc * n);
}

/* res[p] = ||column p|| of an image's rows x L columns (row-major), the squares added row by row: read while the
   image's columns are still in cache. */
__attribute__((noinline)) static void column_norms(const double *restrict cols, int64_t rows, int64_t L,
                                                   double *restrict res) {
    for (int64_t p = 0; p < L; p++) res[p] = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < L; p++) res[p] += cols[r * L + p] * cols[r * L + p];
    for (int64_t p = 0; p < L; p++) res[p] = sqrt(res[p]);
}

/* im2col: out (B, C * kh * kw, L) contiguous, out[b, (c * kh + i) * kw + j, oy * Wo + ox] = x[b, c,
   oy * st + i - pad, ox * st + j - pad], 0 outside the input: torch's F.unfold, exact copies, in
   parallel over (b, c) planes. torch's own walks a 6-d view element by element (a small network's
   largest copy). norms (B * L) or NULL: each image's columns' norms, what the forward product's rounding point reads
   of them (rp_dot's nb_in), added while the image's columns are in cache, where rp_dot's own pass reads them all
   from memory again (cnn-32's second layer: 37 MB); then an image a task, or, where images are fewer than threads,
   a plane a task and the norms in a pass of their own. */
void rp_im2col(const double *x, const int64_t *xs, const conv_t *cv, double *out, double *norms, int64_t threads) {
    int64_t L = cv->Ho * cv->Wo, rows = cv->C * cv->kh * cv->kw, planes = cv->B * cv->C;
    int64_t *off = cv->Wo < SHORT_ROW ? gather_table(xs, cv) : NULL; /* (none out of memory: row by row) */
    if (norms && (cv->B >= threads || threads <= 1)) /* an image a task: its norms while its columns are in cache */
        IN_TEAM(team(threads, cv->B), LOOP, for (int64_t b = 0; b < cv->B; b++) {
            for (int64_t c = 0; c < cv->C; c++) one_plane(x, xs, cv, off, b * cv->C + c, out);
            column_norms(out + b * rows * L, rows, L, norms + b * L);
        });
    else { /* fewer images than threads: a plane a task, then the norms (read again) */
        IN_TEAM(team(threads, planes), LOOP,
                for (int64_t bc = 0; bc < planes; bc++) one_plane(x, xs, cv, off, bc, out););
        if (norms)
            IN_TEAM(team(threads, cv->B), LOOP,
                    for (int64_t b = 0; b < cv->B; b++) column_norms(out + b * rows * L, rows, L, norms + b * L););
    }
    free(off);
}

/* dst[k * step] += src[k * src_step] for k < n: unit steps (stride 1, contiguous columns) in vectors, each
   element's one addition as the strided loop's (noinline: inside an OpenMP loop it ran one at a time). */
__attribute__((noinline)) static void add_row(double *restrict dst, const double *restrict src, int64_t n,
                                              int64_t step, int64_t src_step) {
    if (step == 1 && src_step == 1)
        for (int64_t k = 0; k < n; k++) dst[k] += src[k];
    else
        for (int64_t k = 0; k < n; k++) dst[k * step] += src[k * src_step];
}

/* op[off[t]] += src[from[t]] for t < n in order (noinline: in an OpenMP loop's body it ran one at a time). */
__attribute__((noinline)) static void scatter_plane(double *restrict op, const double *restrict src,
                                                    const int64_t *restrict off, const int64_t *restrict from,
                                                    int64_t n) {
    for (int64_t t = 0; t < n; t++) op[off[t]] += src[from[t]];
}

/* col2im where rows are short (im2col_gathered's case): one table of the (input element, column entry) pairs
   inside the input, in (i, j, oy, ox) order, the same for every (b, c) plane; each element's terms are then
   added in (i, j) order from +0, as the row loop adds them: the same bits. 0 out of memory. */
static int col2im_scattered(const double *cols, const int64_t *cs, const conv_t *cv, double *out, int64_t threads) {
    int64_t kk = cv->kh * cv->kw, n = kk * cv->Ho * cv->Wo, planes = cv->B * cv->C, hw = cv->H * cv->W, used = 0;
    int64_t *off = malloc(sizeof(int64_t) * (2 * n + 1)), *from = off + n;
    if (!off) return 0;
    for (int64_t i = 0; i < cv->kh; i++)
        for (int64_t j = 0; j < cv->kw; j++)
            for (int64_t oy = 0; oy < cv->Ho; oy++)
                for (int64_t ox = 0; ox < cv->Wo; ox++) {
                    int64_t y = oy * cv->st + i - cv->pad, c = ox * cv->st + j - cv->pad;
                    if (y < 0 || y >= cv->H || c < 0 || c >= cv->W) continue;
                    off[used] = y * cv->W + c;
                    from[used++] = (i * cv->kw + j) * cs[1] + (oy * cv->Wo + ox) * cs[2];
                }
    IN_TEAM(team(threads, planes), LOOP,
    for (int64_t bc = 0; bc < planes; bc++) {
        double *op = out + bc * hw;
        for (int64_t e = 0; e < hw; e++) op[e] = 0.0;
        scatter_plane(op, cols + bc / cv->C * cs[0] + bc % cv->C * kk * cs[1], off, from, used);
    });
    free(off);
    return 1;
}

/* col2im, im2col's adjoint: out (B, C, H, W) contiguous, zeros plus, for each (c, i, j) in order and
   each position, cols[b, (c * kh + i) * kw + j, oy * Wo + ox] (at strides cs[3]: a broadcast is 0)
   added at its input element: torch's F.fold, the same additions in the same order (an element's
   terms in (i, j) order, starting from +0), hence the same bits; in parallel over (b, c) planes. Rows under
   SHORT_ROW positions through col2im_scattered (cnn's stride-2 layer: 8 positions a row, a call a row before). */
void rp_col2im(const double *cols, const int64_t *cs, const conv_t *cv, double *out, int64_t threads) {
    int64_t kk = cv->kh * cv->kw, planes = cv->B * cv->C;
    if (cv->Wo < SHORT_ROW && col2im_scattered(cols, cs, cv, out, threads)) return;
    IN_TEAM(team(threads, planes), LOOP,
    for (int64_t bc = 0; bc < planes; bc++) {
        int64_t b = bc / cv->C, c = bc % cv->C;
        double *op = out + bc * cv->H * cv->W;
        for (int64_t e = 0; e < cv->H * cv->W; e++) op[e] = 0.0;
        for (int64_t i = 0; i < cv->kh; i++)
            for (int64_t j = 0; j < cv->kw; j++) {
                const double *cp = cols + b * cs[0] + (c * kk + i * cv->kw + j) * cs[1];
                int64_t lo, hi;
                inside(cv, j, &lo, &hi);
                for (int64_t oy = 0; oy < cv->Ho; oy++) {
                    int64_t y = oy * cv->st + i - cv->pad;
                    if (y < 0 || y >= cv->H || hi <= lo) continue;
                    double *dst = op + y * cv->W + lo * cv->st + j - cv->pad; /* inside the plane */
                    const double *src = cp + (oy * cv->Wo + lo) * cs[2];
                    add_row(dst, src, hi - lo, cv->st, cs[2]);
                }
            }
    });
}

/* A bound's magnitude sums without |x|'s temporary: x (rows, cols) contiguous; res[j] = sum_i |x_ij|
   (over_rows: a bias gradient's, in parallel over blocks of columns) or res[i] = sum_j |x_ij| (a
   mean's, in lanes, in parallel over rows). Any order: a bound's own rounding is SAFETY's slack. */
void rp_abs_sums(const double *x, int64_t rows, int64_t cols, int64_t over_rows, double *res, int64_t threads) {
    if (over_rows) {
        int64_t blocks = (cols + NORM_BLOCK - 1) / NORM_BLOCK;
        IN_TEAM(team(threads, blocks), LOOP,
        for (int64_t blk = 0; blk < blocks; blk++) {
            int64_t lo = blk * NORM_BLOCK, hi = lo + NORM_BLOCK < cols ? lo + NORM_BLOCK : cols;
            for (int64_t j = lo; j < hi; j++) res[j] = 0;
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = lo; j < hi; j++) res[j] += fabs(x[i * cols + j]);
        });
        return;
    }
    IN_TEAM(team(threads, rows), LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *r = x + i * cols;
        double acc[ACC] = {0}, e = 0;
        int64_t j = 0;
        for (; j + ACC <= cols; j += ACC)
            for (int l = 0; l < ACC; l++) acc[l] += fabs(r[j + l]);
        for (; j < cols; j++) e += fabs(r[j]);
        for (int l = 0; l < ACC; l++) e += acc[l];
        res[i] = e;
    });
}

/* The softmax backward's bound, ops._Softmax.backward's err() (the reference) in one pass per row of n
   (all contiguous): m nonzero terms of pd and their magnitude sum S (lanes: another order than torch's,
   within SAFETY's slack), then e_j = p_j * (S * ((m - 1)+ * c)) * k + |dx_j| * u4, those operations in
   that order, in the reference's precisions. */
void rp_softmax_err(const double *p, const double *pd, const double *dx, int64_t rows, int64_t n, double c,
                    double k, double u4, double *e, int64_t threads) {
    IN_TEAM(team(threads, rows), LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *pr = p + i * n, *qr = pd + i * n, *dr = dx + i * n;
        double acc[ACC] = {0}, sum = 0, *er = e + i * n;
        int64_t m = 0, j = 0;
        for (; j + ACC <= n; j += ACC)
            for (int l = 0; l < ACC; l++) acc[l] += fabs(qr[j + l]), m += qr[j + l] != 0;
        for (; j < n; j++) sum += fabs(qr[j]), m += qr[j] != 0;
        for (int l = 0; l < ACC; l++) sum += acc[l];
        /* (m - 1)+ * c is float32 in the reference (an int64 tensor times a Python float: torch's default
           dtype), widened exactly when it meets the float64 sum */
        double err_r = sum * (double)((float)(m > 1 ? m - 1 : 0) * (float)c);
        for (j = 0; j < n; j++) er[j] = pr[j] * err_r * k + fabs(dr[j]) * u4;
    });
}

/* Round n values into out, the windows e[j] * safety (per_elem) or e[0] * safety; flags and result as
   round_row's. */
static int round_stretch(const double *restrict v, double *restrict out, int64_t n, const double *restrict e,
                         int per_elem, double safety, uint32_t *restrict flag) {
    uint32_t any = 0;
    if (per_elem)
        for (int64_t j = 0; j < n; j++)
            out[j] = (double)(float)v[j], any |= flag[j] = may_straddle(v[j], e[j] * safety);
    else
        for (int64_t j = 0; j < n; j++)
            out[j] = (double)(float)v[j], any |= flag[j] = may_straddle(v[j], e[0] * safety);
    return any != 0;
}

#define STRETCH 4096 /* values a task rounds where the bound is per element (rows do not matter then) */

/* rp_full's arguments in one block, as rp_dot's (dot_args_t). */
typedef struct {
    const double *v;
    double *out;
    int64_t rows, n;
    const double *e;
    int64_t e_cols;
    double safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap;
} full_args_t;

/* v (rows, n) contiguous with its bound e given per element (e_cols == n) or per row (e_cols ==
   1), e contiguous. Same contract as rp_dot (threads, cap, -1). A bound per element is taken as one
   flat stretch of values, so that short rows (an attention's) cost no more than long ones; threads
   take contiguous blocks of stretches (or rows), so candidates come out in index order. */
int64_t rp_full(const full_args_t *x) {
    const double *v = x->v, *e = x->e;
    double *out = x->out, safety = x->safety, wide = x->wide;
    int64_t rows = x->rows, n = x->n, e_cols = x->e_cols, threads = x->threads, *idx = x->idx, *code = x->code;
    int64_t cap = x->cap;
    int per_elem = e_cols != 1;
    int64_t total = rows * n, len = per_elem ? STRETCH : n;
    int64_t parts = per_elem ? (total + STRETCH - 1) / STRETCH : rows;
    int nt = threads > 1 && parts > 1 ? (int)(threads < parts ? threads : parts) : 1;
    cands_t *lists = calloc(nt, sizeof(cands_t));
    int64_t room = room_for(total);
    if (!lists) return -1;
    for (int x = 0; x < nt; x++) lists[x].room = &room;
    IN_TEAM(nt, BLOCK,
    {
        int64_t lo, hi;
        cands_t *mine = my_share(lists, parts, &lo, &hi);
        uint32_t *flag = malloc(sizeof(uint32_t) * (len + 1));
        if (!flag) mine->failed = 1;
        for (int64_t part = lo; part < hi && !mine->failed; part++) {
            int64_t at = part * len, m = total - at < len ? total - at : len;
            const double *vp = v + at, *ep = per_elem ? e + at : e + part;
            if (!round_stretch(vp, out + at, m, ep, per_elem, safety, flag)) continue;
            for (int64_t j = next_flag(flag, 0, m); j < m; j = next_flag(flag, j + 1, m))
                push(mine, (cand_t){at + j, 0, 0, vp[j], 0, ep[per_elem ? j : 0]});
        }
        free(flag);
    });
    return merged_calls(lists, nt, idx, code, cap, wide);
}

/* ---------------------------------------------------------------- layer norm, forward and backward

   ops._LayerNorm's rounding points and the IEEE operations between them, fused: one pass per row
   where the torch path makes a dozen tensors. Every element-wise step is the reference's own
   operation in its order (x - mu, d * rstd, xhat * w + b, ...: single IEEE operations, so the same
   bits); only the sums at the rounding points are formed in another order (lanes, as rp_abs_sums),
   which their bounds cover as they cover any machine's. Each point's values and bounds are kept and
   its close calls found after the parallel part, in index order, as rp_full finds them. */

/* sum_j x_j and sum_j |x_j| in ACC lanes each, summed pairwise at the end (a layer norm's row of 64: two
   16-add chains a row were its critical path). In GCC's vector types: its vectorizer built these lanes from
   scalar loads (GCC 12: 50 -> 35 us a gpt layer norm's forward, 512 x 64). Any order: a point's sum (its bound
   covers it, as any machine's order) or a bound's. */
#if ACC != 16
#error "lane_sums' pairwise end is written for 16 lanes"
#endif
typedef double lanes4_t __attribute__((vector_size(32)));
typedef int64_t bits4_t __attribute__((vector_size(32)));
static void lane_sums(const double *restrict x, int64_t n, double *sum, double *abs_sum) {
    const bits4_t magnitude = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX}; /* the sign bit cleared: fabs */
    lanes4_t s[ACC / 4] = {{0}}, a[ACC / 4] = {{0}};
    double ts = 0, ta = 0;
    int64_t j = 0;
    for (; j + ACC <= n; j += ACC)
        for (int q = 0; q < ACC / 4; q++) {
            lanes4_t v;
            memcpy(&v, x + j + 4 * q, sizeof v);
            s[q] += v, a[q] += (lanes4_t)((bits4_t)v & magnitude);
        }
    for (; j < n; j++) ts += x[j], ta += fabs(x[j]);
    lanes4_t s2 = (s[0] + s[2]) + (s[1] + s[3]), a2 = (a[0] + a[2]) + (a[1] + a[3]);
    *sum = ts + ((s2[0] + s2[2]) + (s2[1] + s2[3])), *abs_sum = ta + ((a2[0] + a2[2]) + (a2[1] + a2[3]));
}

/* sum_j x_j y_j, sum_j |x_j y_j| and how many x_j y_j are not 0 (NaN counts), as lane_sums forms its sums
   (a layer norm's backward, the softmax's: GCC built these lanes from scalar loads too). The count is exact. */
static void lane_products(const double *restrict x, const double *restrict y, int64_t n, double *sum,
                          double *abs_sum, int64_t *nonzero) {
    const bits4_t magnitude = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    lanes4_t s[ACC / 4] = {{0}}, a[ACC / 4] = {{0}};
    bits4_t m = {0};
    double ts = 0, ta = 0;
    int64_t j = 0, tm = 0;
    for (; j + ACC <= n; j += ACC)
        for (int q = 0; q < ACC / 4; q++) {
            lanes4_t u, v;
            memcpy(&u, x + j + 4 * q, sizeof u);
            memcpy(&v, y + j + 4 * q, sizeof v);
            lanes4_t t = u * v;
            s[q] += t, a[q] += (lanes4_t)((bits4_t)t & magnitude), m -= (bits4_t)(t != 0); /* true is -1 */
        }
    for (; j < n; j++) {
        double t = x[j] * y[j];
        ts += t, ta += fabs(t), tm += t != 0;
    }
    lanes4_t s2 = (s[0] + s[2]) + (s[1] + s[3]), a2 = (a[0] + a[2]) + (a[1] + a[3]);
    *sum = ts + ((s2[0] + s2[2]) + (s2[1] + s2[3])), *abs_sum = ta + ((a2[0] + a2[2]) + (a2[1] + a2[3]));
    *nonzero = tm + m[0] + m[1] + m[2] + m[3];
}

/* A point's close calls (rp_full's test: straddles(v, e * safety), then log_code), appended at found. */
static int64_t point_calls(const double *v, const double *e, int64_t count, double safety, double wide,
                           int64_t *idx, int64_t *code, int64_t cap, int64_t found) {
    for (int64_t i = 0; i < count; i++) {
        if (!straddles(v[i], e[i] * safety)) continue;
        if (found < cap) idx[found] = i, code[found] = log_code(v[i], e[i], wide);
        found++;
    }
    return found;
}

/* The close calls of np points (values pv[p], bounds pe[p], count[p] each) into idx / code, point after
   point, counts[p] of them each; the total (may exceed cap: the caller retries with room), 0 where no
   log is kept (cap < 0). */
static int64_t all_calls(int np, double *const *pv, double *const *pe, const int64_t *count, double safety,
                         double wide, int64_t *idx, int64_t *code, int64_t cap, int64_t *counts) {
    int64_t found = 0;
    for (int p = 0; p < np; p++) {
        int64_t before = found;
        if (cap >= 0) found = point_calls(pv[p], pe[p], count[p], safety, wide, idx, code, cap, found);
        counts[p] = found - before;
    }
    return found;
}

typedef struct {
    const double *x, *w, *b;
    double *y, *xhat, *rstd;
    int64_t rows, n;
    double inv_n, g_mean, g_var, eps, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap; /* < 0: no log kept (a replay whose log names neither point) */
    int64_t *counts;
    /* A replay whose log names a point here goes in stages, the rounder applying each point between them:
       raw (4 x rows: mu's values and bounds, then var's) kept and the pass stopped before the first point
       whose rounded values are not given (mu_in, var_in: rows each); every stage passes raw (so none
       allocates, and none can fail after the rounder has applied a point). NULL raw: one whole pass. */
    double *raw;
    const double *mu_in, *var_in;
} ln_args_t;

/* LayerNorm over rows of n (x, y, xhat contiguous (rows, n); w, b (n); rstd (rows)): per row,
   mu = round(sum(x) * inv_n) (its bound sum|x| * g_mean), d = x - mu, var = round(sum(d * d) * inv_n)
   (bound var_raw * g_var), rstd = 1 / sqrt(var + eps), xhat = d * rstd, y = xhat * w + b: ops._LayerNorm's
   forward. Points mu, var (row indices); returns their close calls as rp_full does, -1 out of memory. */
int64_t rp_layer_norm(const ln_args_t *a) {
    int64_t rows = a->rows, n = a->n;
    double *pv = a->raw ? a->raw : malloc(sizeof(double) * (4 * rows + 1));
    if (!pv) return -1;
    double *mu_v = pv, *mu_e = pv + rows, *var_v = pv + 2 * rows, *var_e = pv + 3 * rows;
    int nt = a->threads > 1 && rows > 1 ? (int)(a->threads < rows ? a->threads : rows) : 1;
    IN_TEAM(nt, LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = a->x + i * n;
        double *hr = a->xhat + i * n, *yr = a->y + i * n, s, sa, q, qa;
        if (!a->mu_in) {
            lane_sums(xr, n, &s, &sa);
            mu_v[i] = s * a->inv_n, mu_e[i] = sa * a->g_mean;
            if (a->raw) continue; /* stage: mu for the rounder */
        }
        double mu = a->mu_in ? a->mu_in[i] : (double)(float)mu_v[i];
        for (int64_t j = 0; j < n; j++) hr[j] = xr[j] - mu;
        if (!a->var_in) {
            for (int64_t j = 0; j < n; j++) yr[j] = hr[j] * hr[j]; /* d * d, summed from y's room */
            lane_sums(yr, n, &q, &qa);
            var_v[i] = q * a->inv_n, var_e[i] = var_v[i] * a->g_var;
            if (a->raw) continue; /* stage: var for the rounder */
        }
        double r = 1.0 / sqrt((a->var_in ? a->var_in[i] : (double)(float)var_v[i]) + a->eps);
        a->rstd[i] = r;
        for (int64_t j = 0; j < n; j++) hr[j] = hr[j] * r, yr[j] = hr[j] * a->w[j] + a->b[j];
    });
    if (a->raw || a->mu_in) { /* a stage: no log (the rounder applies the replay's) */
        if (!a->raw) free(pv);
        return 0;
    }
    double *v2[2] = {mu_v, var_v}, *e2[2] = {mu_e, var_e};
    int64_t count[2] = {rows, rows};
    int64_t found = all_calls(2, v2, e2, count, a->safety, a->wide, a->idx, a->code, a->cap, a->counts);
    free(pv);
    return found;
}

typedef struct {
    const double *dy, *xhat, *rstd, *w;
    double *dx, *dw, *db;
    int64_t rows, n;
    double inv_n, g_mean, g_rows, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap;
    int64_t *counts;
    /* in stages as rp_layer_norm's (raw passed to each): raw (4 x n, then 4 x rows: dw's, db's, a's and c's
       values and bounds) kept and dx not formed; then dx alone from the rounder's a and c (a_in, c_in) */
    double *raw;
    const double *a_in, *c_in;
} ln_back_args_t;

/* One row's terms of rp_layer_norm_back's column sums (dw, db, their magnitudes) added for columns [lo, hi):
   a function of its own with restrict pointers, so that it runs in vectors (inside the OpenMP loop it ran
   one column at a time); each column's sums still in row order. */
__attribute__((noinline)) static void column_terms(const double *restrict dr, const double *restrict hr, int64_t lo,
                                                   int64_t hi, double *restrict dw_v, double *restrict dw_e,
                                                   double *restrict db_v, double *restrict db_e) {
    for (int64_t j = lo; j < hi; j++) {
        double p = dr[j] * hr[j];
        dw_v[j] += p, dw_e[j] += fabs(p), db_v[j] += dr[j], db_e[j] += fabs(dr[j]);
    }
}

/* LayerNorm's backward (dy, xhat, dx contiguous (rows, n); rstd (rows); w, dw, db (n)): dw = round(sum over
   rows of dy * xhat) and db = round(sum over rows of dy) (bounds: the sums of magnitudes * g_rows), then per
   row g = dy * w, a = round(sum(g) * inv_n), c = round(sum(g * xhat) * inv_n) (bounds: sums of magnitudes *
   g_mean), dx = ((g - a) - xhat * c) * rstd: ops._LayerNorm's backward. Points dw, db (column indices), a, c
   (row indices), in that order. */
int64_t rp_layer_norm_back(const ln_back_args_t *a) {
    int64_t rows = a->rows, n = a->n;
    double *pv = a->raw ? a->raw : malloc(sizeof(double) * (4 * n + 4 * rows + 1));
    if (!pv) return -1;
    double *dw_v = pv, *dw_e = pv + n, *db_v = pv + 2 * n, *db_e = pv + 3 * n;
    double *a_v = pv + 4 * n, *a_e = a_v + rows, *c_v = a_v + 2 * rows, *c_e = a_v + 3 * rows;
    int64_t blocks = a->a_in ? 0 : (n + NORM_BLOCK - 1) / NORM_BLOCK; /* dx alone: the rounder has dw, db */
    int nb = a->threads > 1 && blocks > 1 ? (int)(a->threads < blocks ? a->threads : blocks) : 1;
    IN_TEAM(nb, LOOP,
    for (int64_t blk = 0; blk < blocks; blk++) { /* columns: each sums its rows in order, vectors across columns */
        int64_t lo = blk * NORM_BLOCK, hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
        for (int64_t j = lo; j < hi; j++) dw_v[j] = dw_e[j] = db_v[j] = db_e[j] = 0;
        for (int64_t i = 0; i < rows; i++)
            column_terms(a->dy + i * n, a->xhat + i * n, lo, hi, dw_v, dw_e, db_v, db_e);
        for (int64_t j = lo; j < hi; j++) {
            dw_e[j] *= a->g_rows, db_e[j] *= a->g_rows;
            a->dw[j] = (double)(float)dw_v[j], a->db[j] = (double)(float)db_v[j];
        }
    });
    int nt = a->threads > 1 && rows > 1 ? (int)(a->threads < rows ? a->threads : rows) : 1;
    IN_TEAM(nt, LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *dr = a->dy + i * n, *hr = a->xhat + i * n;
        double *xr = a->dx + i * n, sg, sga, sx, sxa;
        for (int64_t j = 0; j < n; j++) xr[j] = dr[j] * a->w[j]; /* g, in dx's room */
        if (!a->a_in) {
            int64_t nonzero;
            lane_sums(xr, n, &sg, &sga);
            lane_products(xr, hr, n, &sx, &sxa, &nonzero);
            a_v[i] = sg * a->inv_n, a_e[i] = sga * a->g_mean;
            c_v[i] = sx * a->inv_n, c_e[i] = sxa * a->g_mean;
            if (a->raw) continue; /* stage: the points for the rounder */
        }
        double ar = a->a_in ? a->a_in[i] : (double)(float)a_v[i], cr = a->c_in ? a->c_in[i] : (double)(float)c_v[i];
        double r = a->rstd[i];
        for (int64_t j = 0; j < n; j++) xr[j] = ((xr[j] - ar) - hr[j] * cr) * r;
    });
    if (a->raw || a->a_in) { /* a stage: no log (the rounder applies the replay's) */
        if (!a->raw) free(pv);
        return 0;
    }
    double *v4[4] = {dw_v, db_v, a_v, c_v}, *e4[4] = {dw_e, db_e, a_e, c_e};
    int64_t count[4] = {n, n, rows, rows};
    int64_t found = all_calls(4, v4, e4, count, a->safety, a->wide, a->idx, a->code, a->cap, a->counts);
    free(pv);
    return found;
}

/* ---------------------------------------------------------------- softmax

   ops._Softmax's passes around torch's exp (the reference's own exp, whose error the point's bound covers):
   the row's max subtracted (exact), then the sum and the quotients, rounded with the bound p * c per element
   as rp_full rounds; the backward's gradient, its bound (rp_softmax_err's) and its rounding in one pass per
   row. The sums run in lanes (another order than torch's, which the bounds cover). */

/* out = x - max over each row of n (contiguous). The max skips a NaN, which still makes its row's sum, hence
   every p of the row, NaN: the row torch.amax's NaN gives. */
void rp_softmax_shift(const double *x, double *out, int64_t rows, int64_t n, int64_t threads) {
    IN_TEAM(team(threads, rows), LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * n;
        double *o = out + i * n, m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < n; j++) o[j] = xr[j] - m;
    });
}

/* A pass over rows of n: row(ctx, i, v, e) forms row i's values and bounds into scratch, which are rounded into
   out and their close calls found with rp_full's test; rows in contiguous blocks per thread, so the close calls
   come out in index order, and every row is formed the same way at any thread count. Up to cap (flat index,
   log code) pairs into idx and code (cap < 0: rounded only); returns how many there are, or -1 out of memory
   or room (rp_full's contract). The softmax's, the loss gradient's and an outer product's points. */
typedef void (*row_fn)(const void *ctx, int64_t i, double *v, double *e);

static int64_t rows_pass(int64_t rows, int64_t n, int64_t threads, row_fn row, const void *ctx, double *out,
                         double safety, double wide, int64_t *idx, int64_t *code, int64_t cap) {
    int nt = threads > 1 && rows > 1 ? (int)(threads < rows ? threads : rows) : 1;
    cands_t *lists = calloc(nt, sizeof(cands_t));
    int64_t room = room_for(rows * n);
    if (!lists) return -1;
    for (int t = 0; t < nt; t++) lists[t].room = &room;
    IN_TEAM(nt, BLOCK,
    {
        int64_t lo, hi;
        cands_t *mine = my_share(lists, rows, &lo, &hi);
        double *v = malloc(sizeof(double) * (2 * n + 1)), *e = v + n;
        uint32_t *flag = malloc(sizeof(uint32_t) * (n + 1));
        if (!v || !flag) mine->failed = 1;
        for (int64_t i = lo; i < hi && !mine->failed; i++) {
            row(ctx, i, v, e);
            if (!round_stretch(v, out + i * n, n, e, 1, safety, flag) || cap < 0) continue;
            for (int64_t j = next_flag(flag, 0, n); j < n; j = next_flag(flag, j + 1, n))
                push(mine, (cand_t){i * n + j, 0, 0, v[j], 0, e[j]});
        }
        free(v), free(flag);
    });
    return merged_calls(lists, nt, idx, code, cap, wide);
}

typedef struct {
    const double *p, *dp; /* forward: p the exponentials, dp unused (NULL); backward: p and the gradient */
    double *out, *bounds; /* bounds NULL: out rounded (a record pass, or plain rounding); else a stage (below) */
    int64_t rows, n;
    double c, k, u4, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap; /* < 0: no log kept */
} softmax_args_t;

/* Row i of the forward: out = e / sum(e) (v, rounded), bounds e_j = v_j * c. */
static void softmax_row(const softmax_args_t *a, int64_t i, double *v, double *e) {
    const double *er = a->p + i * a->n;
    double s, sa;
    lane_sums(er, a->n, &s, &sa);
    for (int64_t j = 0; j < a->n; j++) v[j] = er[j] / s, e[j] = v[j] * a->c;
}

/* Row i of the backward: pd = p * dp, r = sum(pd), dx = p * (dp - r) (v), its bound rp_softmax_err's formula (its
   magnitude sum in lane_products' order, not that pass's: a bound's, SAFETY's slack). */
static void softmax_back_row(const softmax_args_t *a, int64_t i, double *v, double *e) {
    const double *pr = a->p + i * a->n, *qr = a->dp + i * a->n;
    double r, sum;
    int64_t m, j, n = a->n;
    lane_products(pr, qr, n, &r, &sum, &m); /* pd = p * dp: its sum, magnitudes and nonzero terms */
    double err_r = sum * (double)((float)(m > 1 ? m - 1 : 0) * (float)a->c); /* float32 factor: the reference's */
    for (j = 0; j < n; j++) v[j] = pr[j] * (qr[j] - r), e[j] = pr[j] * err_r * a->k + fabs(v[j]) * a->u4;
}

/* The softmax's row (`softmax_row`, or `softmax_back_row` where dp is given). */
static void softmax_pass_row(const void *ctx, int64_t i, double *v, double *e) {
    const softmax_args_t *a = ctx;
    (a->dp ? softmax_back_row : softmax_row)(a, i, v, e);
}

/* The forward (dp NULL) or backward pass over rows of n (`rows_pass`): each row's values and bounds formed,
   rounded with rp_full's test, the close calls in index order. Same contract as rp_full (cap < 0: none kept).
   With bounds, a stage (a replay whose log names the point): the values into out and their bounds into bounds,
   not rounded (the rounder applies the log); out may be the forward's exponentials themselves (a row's sum is
   formed before its quotients overwrite it). */
int64_t rp_softmax(const softmax_args_t *a) {
    if (a->bounds) {
        IN_TEAM(team(a->threads, a->rows), LOOP, for (int64_t i = 0; i < a->rows; i++) {
            softmax_pass_row(a, i, a->out + i * a->n, a->bounds + i * a->n);
        });
        return 0;
    }
    return rows_pass(a->rows, a->n, a->threads, softmax_pass_row, a, a->out, a->safety, a->wide, a->idx, a->code,
                     a->cap);
}

/* The optimizer updates of replay/training/train.py, the same IEEE operations in the same order per element
   (train.py's _adamw and _sgd are the reference: every torch op there is one operation per element,
   a Python-float scalar is a double, and float32 -> double is exact). State is float32, the gradient
   float64; outputs are float32. */
static inline void adamw_one(int64_t i, double gd, const float *restrict p, const float *restrict m,
                             const float *restrict v, float *restrict p_out, float *restrict m_out,
                             float *restrict v_out, double b1, double c1, double b2, double c2, double s1, double s2,
                             double eps, double wd, double lr) {
    double pd = p[i];
    float mn = (float)((double)m[i] * b1 + gd * c1);
    float vn = (float)((double)v[i] * b2 + (gd * gd) * c2);
    double upd = ((double)mn * s1) / (sqrt((double)vn * s2) + eps);
    p_out[i] = (float)(pd - (upd + pd * wd) * lr);
    m_out[i] = mn;
    v_out[i] = vn;
}

static inline void sgd_one(int64_t i, double gd, const float *restrict p, const float *restrict mom,
                           float *restrict p_out, float *restrict mom_out, double momentum, int64_t has_wd, double wd,
                           double lr) {
    double pd = p[i];
    if (has_wd) gd = gd + pd * wd;
    float mn = (float)((double)mom[i] * momentum + gd);
    p_out[i] = (float)(pd - (double)mn * lr);
    mom_out[i] = mn;
}

/* The state's element i = r * cols + c (contiguous); the gradient's at r * gs0 + c * gs1, so a transposed
   gradient (a weight's, as the matmul's backward leaves it) is read in place, not copied first: in square
   tiles, so that both layouts are read a cache line at a time. SPAN(at, n, gv) updates the state's
   elements [at, at + n) from the n gradient values at gv: a function of its own with restrict pointers
   (noinline: inlined into an OpenMP region's body, its loop ran one element at a time). Elements are
   independent: any split among threads gives the same bits. */
#define TILE_EDGE 32
#define SPAN_LEN 4096
#define EACH_SPAN(SPAN)                                                                                      \
    if (gs1 == 1 && gs0 == cols) {                                                                           \
        int64_t total = rows * cols, spans = (total + SPAN_LEN - 1) / SPAN_LEN;                              \
        IN_TEAM(team(threads, spans), LOOP, for (int64_t s = 0; s < spans; s++) {                            \
            SPAN(s * SPAN_LEN, total - s * SPAN_LEN < SPAN_LEN ? total - s * SPAN_LEN : SPAN_LEN, g + s * SPAN_LEN);\
        });                                                                                                  \
    } else {                                                                                                 \
        IN_TEAM(team(threads, (rows + TILE_EDGE - 1) / TILE_EDGE), LOOP,                                     \
                for (int64_t r0 = 0; r0 < rows; r0 += TILE_EDGE) {                                           \
                    for (int64_t c0 = 0; c0 < cols; c0 += TILE_EDGE) {                                       \
                        double tile[TILE_EDGE][TILE_EDGE];                                                   \
                        int64_t nr = rows - r0 < TILE_EDGE ? rows - r0 : TILE_EDGE;                          \
                        int64_t nc = cols - c0 < TILE_EDGE ? cols - c0 : TILE_EDGE;                          \
                        for (int64_t c = 0; c < nc; c++)                                                     \
                            for (int64_t r = 0; r < nr; r++) tile[r][c] = g[(r0 + r) * gs0 + (c0 + c) * gs1];\
                        for (int64_t r = 0; r < nr; r++) SPAN((r0 + r) * cols + c0, nc, tile[r]);            \
                    }                                                                                        \
                });                                                                                          \
    }

__attribute__((noinline)) static void adamw_span(int64_t at, int64_t n, const double *restrict gv,
                                                 const float *restrict p, const float *restrict m,
                                                 const float *restrict v, float *restrict p_out,
                                                 float *restrict m_out, float *restrict v_out, double b1, double c1,
                                                 double b2, double c2, double s1, double s2, double eps, double wd,
                                                 double lr) {
    for (int64_t j = 0; j < n; j++)
        adamw_one(at + j, gv[j], p, m, v, p_out, m_out, v_out, b1, c1, b2, c2, s1, s2, eps, wd, lr);
}

__attribute__((noinline)) static void sgd_span(int64_t at, int64_t n, const double *restrict gv,
                                               const float *restrict p, const float *restrict mom,
                                               float *restrict p_out, float *restrict mom_out, double momentum,
                                               int64_t has_wd, double wd, double lr) {
    for (int64_t j = 0; j < n; j++) sgd_one(at + j, gv[j], p, mom, p_out, mom_out, momentum, has_wd, wd, lr);
}

static void rp_adamw(int64_t rows, int64_t cols, int64_t gs0, int64_t gs1, const float *p, const double *g, const float *m,
              const float *v, float *p_out, float *m_out, float *v_out, double b1, double c1, double b2, double c2,
              double s1, double s2, double eps, double wd, double lr, int64_t threads) {
#define ADAMW(at, n, gv) adamw_span(at, n, gv, p, m, v, p_out, m_out, v_out, b1, c1, b2, c2, s1, s2, eps, wd, lr)
    EACH_SPAN(ADAMW)
#undef ADAMW
}

static void rp_sgd(int64_t rows, int64_t cols, int64_t gs0, int64_t gs1, const float *p, const double *g, const float *mom,
            float *p_out, float *mom_out, double momentum, int64_t has_wd, double wd, double lr, int64_t threads) {
#define SGD(at, n, gv) sgd_span(at, n, gv, p, mom, p_out, mom_out, momentum, has_wd, wd, lr)
    EACH_SPAN(SGD)
#undef SGD
}

/* rp_adamw / rp_sgd over n parameters in one call (a call from Python costs more than a small parameter's
   update): parameter k's layout (rows, cols, gs0, gs1) at lay[4k..], its threads at nthreads[k], its
   tensors at ptr[7k..] (p, g, m, v, p_out, m_out, v_out) or ptr[5k..] (p, g, mom, p_out, mom_out). The
   same calls, one after another, hence the same bits. */
void rp_adamw_many(int64_t n, const int64_t *lay, const int64_t *nthreads, void *const *ptr, double b1, double c1,
                   double b2, double c2, double s1, double s2, double eps, double wd, double lr) {
    for (int64_t k = 0; k < n; k++) {
        const int64_t *l = lay + 4 * k;
        void *const *q = ptr + 7 * k;
        rp_adamw(l[0], l[1], l[2], l[3], q[0], q[1], q[2], q[3], q[4], q[5], q[6], b1, c1, b2, c2, s1, s2, eps, wd,
                 lr, nthreads[k]);
    }
}

void rp_sgd_many(int64_t n, const int64_t *lay, const int64_t *nthreads, void *const *ptr, double momentum,
                 int64_t has_wd, double wd, double lr) {
    for (int64_t k = 0; k < n; k++) {
        const int64_t *l = lay + 4 * k;
        void *const *q = ptr + 5 * k;
        rp_sgd(l[0], l[1], l[2], l[3], q[0], q[1], q[2], q[3], q[4], momentum, has_wd, wd, lr, nthreads[k]);
    }
}

/* A replay's log entries at one rounding point applied, as Rounder._apply decides them (the reference):
   element x[j] with window +- e[j] (DECODE * its bound) and code[j] (a parity bit, or a wide entry's
   32 bits | 1 << 32) becomes out[j], a float32 as a double. An entry is refused, and the kernel stops
   there, when its window is wider than rel * scale (steers; NaN too): *why = 1, or when it does not
   name a float32 inside its window (a parity neither of at most two floats there has, a wide value
   outside, a window not > 0): *why = 2. Returns the refused entry, or -1; *ratio the widest applied
   window over scale. */
static int64_t rp_apply(const double *x, const double *e, const int64_t *code, int64_t n, double scale, int64_t steers,
                 double rel, double *out, int64_t *why, double *ratio) {
    *ratio = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double ej = e[j], xj = x[j];
        if (steers && !(ej <= rel * scale)) {
            *why = 1;
            return j;
        }
        if (ej > 0 && steers && ej / scale > *ratio) *ratio = ej / scale;
        int64_t lo = ordinal((float)(xj - ej)), hi = ordinal((float)(xj + ej)), o;
        int good;
        if (code[j] < 2) {
            o = (lo & 1) == code[j] ? lo : hi;
            good = ej > 0 && hi - lo <= 1 && (o & 1) == code[j];
        } else {
            int32_t bits = (int32_t)(uint32_t)(code[j] & 0xFFFFFFFF);
            o = bits >= 0 ? (int64_t)bits : -1 - (int64_t)(bits & 0x7FFFFFFF);
            good = ej > 0 && lo <= o && o <= hi;
        }
        if (!good) {
            *why = 2;
            return j;
        }
        int32_t b = o >= 0 ? (int32_t)o : (int32_t)((-1 - o) - 2147483648LL);
        float f;
        memcpy(&f, &b, sizeof f);
        out[j] = f;
    }
    return -1;
}

/* rp_apply at n flat indices of v (size values, contiguous): x read there, and the decisions written to r
   at the same indices only if every entry is accepted (r unchanged where one is refused). Returns as
   rp_apply, or -2 for an index outside [0, size), -3 out of memory (the caller takes its other path). */
int64_t rp_apply_at(const double *v, double *r, int64_t size, const int64_t *idx, const double *e,
                    const int64_t *code, int64_t n, double scale, int64_t steers, double rel, int64_t *why,
                    double *ratio) {
    if (n <= 0) return *ratio = 0.0, -1; /* nothing logged here: nothing refused */
    double *x = malloc(sizeof(double) * (2 * n + 1));
    if (!x) return -3;
    double *out = x + n;
    for (int64_t j = 0; j < n; j++) {
        if (idx[j] < 0 || idx[j] >= size) {
            free(x);
            return -2;
        }
        x[j] = v[idx[j]];
    }
    int64_t bad = rp_apply(x, e, code, n, scale, steers, rel, out, why, ratio);
    if (bad == -1)
        for (int64_t j = 0; j < n; j++) r[idx[j]] = out[j];
    free(x);
    return bad;
}

/* A replay's logged product point in one call, Rounder._apply's work for a product (the reference) with no
   Python step between: rp_round_max's rounding of v into out and its scale (*scale: max |v|), rp_dot_at's
   exact bounds at the log's n indices times decode (the windows, into e), and rp_apply_at's decisions at
   those indices, written into out. Returns rp_apply_at's result (-1: every entry applied; else the refused
   entry, *why and *ratio as there), or -2 an index outside the output, -3 out of memory: the caller then
   takes its other path, v untouched. The same operations as the three calls, hence the same bits and the
   same refusals. out == v rounds v in place (the logged elements' values read first). */
typedef struct {
    const double *v;
    double *out;
    int64_t b0, b1, M, N, K1, K2;
    const double *a;
    int64_t sa0, sa1, sai, sak1, sak2;
    const double *b;
    int64_t sb0, sb1, sbk1, sbk2, sbj;
    const double *bias; /* per column, or per row (bias_rows), or NULL; its bound's term |bias| * gbias */
    int64_t bias_rows;
    double gbias, g;
    int64_t round_threads, term_threads;
    const int64_t *idx, *code; /* code as rp_apply_at reads it */
    int64_t n;
    double decode, rel;
    int64_t steers;
    double *e, *scale, *ratio;
    int64_t *why;
} dot_replay_args_t;

int64_t rp_dot_replay(const dot_replay_args_t *x) {
    int64_t size = x->b0 * x->b1 * x->M * x->N, terms = x->bias_rows ? x->M : x->N, n = x->n;
    double *babs = malloc(sizeof(double) * (terms + 2 * n + 1)), *at = babs + terms, *res = at + n;
    if (!babs) return -3;
    for (int64_t j = 0; j < n; j++) {
        if (x->idx[j] < 0 || x->idx[j] >= size) {
            free(babs);
            return -2;
        }
        at[j] = x->v[x->idx[j]]; /* the logged elements' values, read before v is rounded (out == v: in place) */
    }
    for (int64_t j = 0; x->bias && j < terms; j++) babs[j] = fabs(x->bias[j]) * x->gbias; /* dot_bound's two IEEE ops */
    int64_t got = rp_dot_at(x->b0, x->b1, x->M, x->N, x->K1, x->K2, x->a, x->sa0, x->sa1, x->sai, x->sak1, x->sak2,
                            x->b, x->sb0, x->sb1, x->sbk1, x->sbk2, x->sbj, x->bias ? babs : NULL, x->bias_rows, x->g,
                            x->term_threads, x->idx, n, x->e);
    if (got != 0) {
        free(babs);
        return got == -2 ? -2 : -3;
    }
    /* every way out that leaves v to the caller's other path is behind: v rounded (into out, or over itself) */
    *x->scale = rp_round_max(x->v, x->out, size, x->round_threads);
    for (int64_t j = 0; j < n; j++) x->e[j] *= x->decode;
    int64_t bad = rp_apply(at, x->e, x->code, n, *x->scale, x->steers, x->rel, res, x->why, x->ratio);
    for (int64_t j = 0; bad == -1 && j < n; j++) x->out[x->idx[j]] = res[j];
    free(babs);
    return bad;
}

/* ---------------------------------------------------------------- sums over all axes but one, the loss

   A bias's gradient (ops: a linear layer's sum over rows, a convolution's over images and positions) and the
   cross-entropy's two points, each in one pass where the torch path makes a temporary of the input's size and
   a handful of small tensors. Element-wise steps are the reference's own IEEE operations in its order, but
   for the loss's logarithm (the C library's, not torch's: within an ulp of each other, inside EXP_ERR's two);
   the sums run in another order (lanes, and a row at a time), which their bounds cover as they cover any
   machine's, and that order does not depend on the threads. */

typedef struct {
    const double *x; /* (A, O, L) contiguous */
    double *out;     /* (O): the sums, rounded; where bounds is given, the sums themselves */
    double *bounds;  /* NULL, or (O): the bounds (a replay whose log names the point: the rounder applies it) */
    int64_t A, O, L;
    double g, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap; /* < 0: rounded only (no bound formed, no log kept) */
} axis_sums_args_t;

/* x[0, n) added into lanes s and a (their magnitudes), ACC each, and the last n % ACC into rest[0] and rest[1]:
   a row's share of a sum over many rows, the lanes combined once at the end (`rp_axis_sums`), not per row
   (a convolution's rows of positions are short: combining 2 x ACC lanes per row cost more than the row). */
__attribute__((noinline)) static void lane_add(const double *restrict x, int64_t n, double *restrict s,
                                         double *restrict a, double *restrict rest) {
    const bits4_t magnitude = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    lanes4_t vs[ACC / 4], va[ACC / 4]; /* lane_sums' vectors: s[l] += x[j + l], a[l] += |x[j + l]|, l < ACC */
    memcpy(vs, s, sizeof vs), memcpy(va, a, sizeof va);
    int64_t j = 0;
    for (; j + ACC <= n; j += ACC)
        for (int q = 0; q < ACC / 4; q++) {
            lanes4_t v;
            memcpy(&v, x + j + 4 * q, sizeof v);
            vs[q] += v, va[q] += (lanes4_t)((bits4_t)v & magnitude);
        }
    memcpy(s, vs, sizeof vs), memcpy(a, va, sizeof va);
    for (; j < n; j++) rest[0] += x[j], rest[1] += fabs(x[j]);
}

/* v_o = sum over a, l of x[a, o, l] and its bound e_o = (sum of |x[a, o, l]|) * g (ops' abs_sum(...) *
   gamma(A * L)), a at a time (L == 1: each a's row across o in vectors; else each (a, o) row into o's lanes);
   rounded and its close calls found as rp_full's, or (bounds given) the sums and bounds handed back. Threads split o, so each sum is formed the same way at
   any thread count. -1 out of memory. */
int64_t rp_axis_sums(const axis_sums_args_t *s) {
    int64_t A = s->A, O = s->O, L = s->L, lanes = L == 1 ? 0 : (2 * ACC + 2) * O;
    double *v = malloc(sizeof(double) * (2 * O + lanes + 1)), *e = v + O, *lane = e + O;
    if (!v) return -1;
    int64_t blocks = (O + NORM_BLOCK - 1) / NORM_BLOCK;
    IN_TEAM(team(s->threads, blocks), LOOP,
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t lo = blk * NORM_BLOCK, hi = lo + NORM_BLOCK < O ? lo + NORM_BLOCK : O;
        double *sl = lane + lo * (2 * ACC + 2); /* per o: ACC sums, ACC magnitudes, the rest's two */
        for (int64_t o = lo; o < hi; o++) v[o] = 0, e[o] = 0;
        if (L > 1) memset(sl, 0, sizeof(double) * (2 * ACC + 2) * (hi - lo));
        for (int64_t a = 0; a < A; a++) {
            const double *row = s->x + a * O * L;
            if (L == 1)
                for (int64_t o = lo; o < hi; o++) v[o] += row[o], e[o] += fabs(row[o]);
            else
                for (int64_t o = lo; o < hi; o++) {
                    double *at = sl + (o - lo) * (2 * ACC + 2);
                    lane_add(row + o * L, L, at, at + ACC, at + 2 * ACC);
                }
        }
        for (int64_t o = lo; o < hi && L > 1; o++) {
            double *at = sl + (o - lo) * (2 * ACC + 2);
            v[o] = at[2 * ACC], e[o] = at[2 * ACC + 1];
            for (int l = 0; l < ACC; l++) v[o] += at[l], e[o] += at[ACC + l];
        }
        for (int64_t o = lo; o < hi; o++) s->out[o] = s->bounds ? v[o] : (double)(float)v[o], e[o] *= s->g;
    });
    if (s->bounds) memcpy(s->bounds, e, sizeof(double) * O);
    int64_t found = s->cap < 0 || s->bounds ? 0 : point_calls(v, e, O, s->safety, s->wide, s->idx, s->code, s->cap, 0);
    free(v);
    return found;
}

typedef struct {
    const double *x;    /* the logits (rows, n) */
    double *p;          /* in: exp(x - the row's max) (rp_softmax_shift, then torch's exp); out: p = e / s */
    const int64_t *t;   /* the targets (rows) */
    int64_t rows, n;
    double g_row, exp_err, u, g_rows, inv_rows; /* gamma(n + 8), EXP_ERR, U, gamma(rows + 1), 1 / rows */
    int64_t threads;
    double *loss; /* out: the mean loss before rounding, then its bound */
    double safety, wide;
    double *rounded; /* NULL: the loss and its bound alone (a replay whose log names the loss: the rounder applies it);
                        else out: float32(loss), the loss's point rounded in this call, its close call (rp_full's
                        test and code) at idx / code where cap >= 0 (cap < 0: rounded only, no log kept) */
    int64_t *idx, *code;
    int64_t cap;
} ce_args_t;

/* ops._CrossEntropy's forward after its exponentials: per row, s = sum(e), ls = log(s), row = ls - zt (zt the
   target's x - max), p = e / s in place; the loss sum(row) * inv_rows and its bound (sum |row| * g_rows +
   sum(g_row + |ls| exp_err + |row| u)) * inv_rows, summed row by row after the parallel part; where `rounded` is
   given, the loss's point too, as rp_full rounds a 0-dim point (a Rounder.full and its ATen ops fewer, a small model's
   step). The close calls found (0 or 1), -2 where a target is not in [0, n) (the caller's torch path says so), -1 out
   of memory. */
int64_t rp_ce_forward(const ce_args_t *a) {
    int64_t rows = a->rows, n = a->n;
    for (int64_t i = 0; i < rows; i++)
        if (a->t[i] < 0 || a->t[i] >= n) return -2;
    double *row = malloc(sizeof(double) * (2 * rows + 1)), *ls = row + rows;
    if (!row) return -1;
    IN_TEAM(team(a->threads, rows), LOOP,
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = a->x + i * n;
        double *pr = a->p + i * n, m = -INFINITY, s, mag;
        for (int64_t j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m; /* rp_softmax_shift's max */
        lane_sums(pr, n, &s, &mag);
        ls[i] = log(s), row[i] = ls[i] - (xr[a->t[i]] - m);
        for (int64_t j = 0; j < n; j++) pr[j] = pr[j] / s;
    });
    double sum = 0, mag = 0, err = 0;
    for (int64_t i = 0; i < rows; i++)
        sum += row[i], mag += fabs(row[i]), err += a->g_row + fabs(ls[i]) * a->exp_err + fabs(row[i]) * a->u;
    a->loss[0] = sum * a->inv_rows;
    a->loss[1] = (mag * a->g_rows + err) * a->inv_rows;
    free(row);
    if (!a->rounded) return 0;
    double v = a->loss[0], e = a->loss[1];
    a->rounded[0] = (double)(float)v;
    if (a->cap < 0 || !straddles(v, e * a->safety)) return 0;
    if (a->cap > 0) a->idx[0] = 0, a->code[0] = log_code(v, e, a->wide);
    return 1;
}

typedef struct {
    const double *p;  /* the probabilities (rows, n) */
    const int64_t *t; /* the targets (rows) */
    double *out;      /* dz, rounded */
    double *bounds;   /* its bound, where given (NULL: not kept) */
    int64_t rows, n;
    double c, u, g_p, safety, wide; /* c = dL/dloss / rows; U; gamma(n + 10) */
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap; /* < 0: rounded only */
} ce_back_args_t;

/* ops._CrossEntropy's backward, dz = (p - onehot) * c, where p - onehot is p + -1 at the target and p
   elsewhere, and its bound (|p - onehot| u + p g_p) |c| + |dz| 2u: the reference's operations in its
   order, element by element, so the same bits; rounded and its close calls found as rp_full's (rows in
   contiguous blocks per thread: in index order). -2 where a target is not in [0, n). */
static void ce_back_row(const void *ctx, int64_t i, double *v, double *e) {
    const ce_back_args_t *a = ctx;
    const double *pr = a->p + i * a->n;
    double c = a->c, ac = fabs(a->c), u2 = 2 * a->u;
    for (int64_t j = 0; j < a->n; j++) {
        double pm = j == a->t[i] ? pr[j] + -1.0 : pr[j];
        v[j] = pm * c;
        e[j] = (fabs(pm) * a->u + pr[j] * a->g_p) * ac + fabs(v[j]) * u2;
    }
    if (a->bounds) memcpy(a->bounds + i * a->n, e, sizeof(double) * a->n);
}

int64_t rp_ce_backward(const ce_back_args_t *a) {
    for (int64_t i = 0; i < a->rows; i++)
        if (a->t[i] < 0 || a->t[i] >= a->n) return -2;
    return rows_pass(a->rows, a->n, a->threads, ce_back_row, a, a->out, a->safety, a->wide, a->idx, a->code, a->cap);
}

/* A point whose bound is an outer product: v (B, C, P) contiguous, e[b, c, p] = (win[b, p] * f[c]) * g, those
   two IEEE multiplies in that order (ops._conv_input_grad_bound's: a convolution's input gradient, its bound the
   window's norm times the filter's), rounded and its close calls found as rp_full's, without the bound's
   B x C x P tensor (two passes and a copy of the input's size). Rows (b, c) in contiguous blocks per thread:
   the close calls in index order. Same contract as rp_full. */
typedef struct {
    const double *v;
    double *out;
    int64_t B, C, P;
    const double *win, *f;
    double g, safety, wide;
    int64_t threads;
    int64_t *idx, *code;
    int64_t cap;
} outer_args_t;

static void outer_row(const void *ctx, int64_t r, double *v, double *e) {
    const outer_args_t *a = ctx;
    const double *w = a->win + (r / a->C) * a->P;
    double fc = a->f[r % a->C];
    memcpy(v, a->v + r * a->P, sizeof(double) * a->P);
    for (int64_t j = 0; j < a->P; j++) e[j] = (w[j] * fc) * a->g;
}

int64_t rp_round_outer(const outer_args_t *a) {
    return rows_pass(a->B * a->C, a->P, a->threads, outer_row, a, a->out, a->safety, a->wide, a->idx, a->code,
                     a->cap);
}

/* A replay's logged point whose bound is given as values (ops' sums, the loss and its gradient: Rounder.full)
   in one call, Rounder._apply's work for it (the reference) with no Python step between: rp_round_max's
   rounding of v into out and its scale (*scale: max |v|, or the point's floor where that is larger, as
   Python's max takes it), the windows e at the log's count indices times decode (into win), and
   rp_apply_at's decisions there, written into out. Returns as rp_dot_replay: -1 every entry applied, else
   the refused entry (*why, *ratio as rp_apply's), or -2 an index outside the output, -3 out of memory. */
typedef struct {
    const double *v;
    double *out;
    int64_t rows, n;
    const double *e; /* the bound per element (e_cols == n) or per row (e_cols == 1) */
    int64_t e_cols, threads;
    const int64_t *idx, *code; /* code as rp_apply_at reads it */
    int64_t count;
    double decode, rel, floor;
    int64_t has_floor, steers;
    double *win, *scale, *ratio;
    int64_t *why;
} full_replay_args_t;

int64_t rp_full_replay(const full_replay_args_t *x) {
    int64_t size = x->rows * x->n;
    double s = rp_round_max(x->v, x->out, size, x->threads);
    if (x->has_floor && x->floor > s) s = x->floor;
    *x->scale = s;
    for (int64_t j = 0; j < x->count; j++) {
        int64_t i = x->idx[j];
        if (i < 0 || i >= size) return -2;
        x->win[j] = x->e[x->e_cols == 1 ? i / x->n : i] * x->decode;
    }
    return rp_apply_at(x->v, x->out, size, x->idx, x->win, x->code, x->count, s, x->steers, x->rel, x->why,
                       x->ratio);
}

/* The rounding log's decoder (determinism.decode_log is the reference; tests hold the two to the same
   entries and the same refusals on crafted bytes). Untrusted input: every read is bounds-checked
   first. Returns the number of entries, or a negative code: -1..-9 the reference's refusals (version,
   varint, point count, key order, entry count, wide entry, parity bits, stray bits, trailing bytes),
   -10 a value beyond 63 bits (the caller then decodes with the reference, whose integers are
   unbounded). Per point: its key, first entry and count in keys/starts/counts (at most len points);
   per entry: its flat index and code (0/1 parity, or the wide entry's 32 bits | 1 << 32). */
static int varint(const uint8_t *buf, int64_t len, int64_t *pos, uint64_t *out) {
    uint64_t n = 0;
    for (int shift = 0;; shift += 7) {
        if (*pos >= len || shift > 63) return -2;
        uint8_t b = buf[(*pos)++];
        uint64_t part = (uint64_t)(b & 0x7F);
        if (shift > 0 && (shift >= 64 || (part >> (64 - shift)) != 0)) return -10;
        n |= part << shift;
        if (b < 0x80) break;
    }
    if (n > (uint64_t)INT64_MAX) return -10;
    *out = n;
    return 0;
}

int64_t rp_decode_log(const uint8_t *buf, int64_t len, int64_t max_entries, int64_t *keys, int64_t *starts,
                      int64_t *counts, int64_t *idx, int64_t *codes, int64_t *npoints) {
    int64_t pos = 1, total = 0, key = -1, err;
    uint64_t points, delta, count, d;
    *npoints = 0;
    if (len < 1 || buf[0] != 1) return -1;
    if ((err = varint(buf, len, &pos, &points))) return err;
    if (points > (uint64_t)len) return -3;
    for (uint64_t p = 0; p < points; p++) {
        if ((err = varint(buf, len, &pos, &delta))) return err;
        if (p && delta == 0) return -4;
        if (p == 0) key = (int64_t)delta;
        else if ((uint64_t)key + delta > (uint64_t)INT64_MAX) return -10;
        else key += (int64_t)delta;
        if ((err = varint(buf, len, &pos, &count))) return err;
        if (count == 0 || count > (uint64_t)(max_entries - total) || count > (uint64_t)(len - pos)) return -5;
        keys[p] = key, starts[p] = total, counts[p] = (int64_t)count, *npoints = (int64_t)p + 1;
        int64_t prev = -1, narrow = 0, first = total;
        for (uint64_t j = 0; j < count; j++) {
            if ((err = varint(buf, len, &pos, &d))) return err;
            if ((uint64_t)prev + 1 + (d >> 1) > (uint64_t)INT64_MAX) return -10;
            prev += (int64_t)(d >> 1) + 1;
            idx[total] = prev;
            if (d & 1) {
                if (pos + 4 > len) return -6;
                codes[total] = (int64_t)((uint64_t)buf[pos] | (uint64_t)buf[pos + 1] << 8 | (uint64_t)buf[pos + 2] << 16 |
                                         (uint64_t)buf[pos + 3] << 24 | (uint64_t)1 << 32);
                pos += 4;
            } else {
                codes[total] = -1 - narrow++;  /* its parity bit's number, filled below */
            }
            total++;
        }
        int64_t nbytes = (narrow + 7) / 8;
        if (pos + nbytes > len) return -7;
        for (int64_t e = first; e < total; e++)
            if (codes[e] < 0) {
                int64_t j = -1 - codes[e];
                codes[e] = (buf[pos + (j >> 3)] >> (j & 7)) & 1;
            }
        if ((narrow % 8) && (buf[pos + nbytes - 1] >> (narrow % 8))) return -8;
        pos += nbytes;
    }
    if (pos != len) return -9;
    return total;
}

/* The rounding log's encoder over a FlatLog's arrays (determinism.encode_log_reference is the reference;
   a property test holds the two to the same bytes). Per point, in key order: the key's delta, the
   count, per entry a varint of (gap * 2 + wide) and a wide entry's 4 bytes, then the point's parity
   bits packed. Returns the bytes written, or -1 where the arrays are not a log (keys or indices not
   strictly increasing, a negative key or index, a run outside idx's nidx entries, a code neither a
   parity bit nor 32 bits | 2^32), -2 where `cap` is too small. */
static int put_varint(uint8_t *out, int64_t cap, int64_t *pos, uint64_t n) {
    while (n >= 0x80) {
        if (*pos >= cap) return -2;
        out[(*pos)++] = (uint8_t)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    if (*pos >= cap) return -2;
    out[(*pos)++] = (uint8_t)n;
    return 0;
}

int64_t rp_encode_log(const int64_t *keys, const int64_t *starts, const int64_t *counts, int64_t npoints,
                      const int64_t *idx, const int64_t *codes, int64_t nidx, uint8_t *out, int64_t cap) {
    int64_t pos = 0, err, prev_key = 0;
    if (cap < 1) return -2;
    out[pos++] = 1;
    if ((err = put_varint(out, cap, &pos, (uint64_t)npoints))) return err;
    for (int64_t p = 0; p < npoints; p++) {
        int64_t key = keys[p], s = starts[p], c = counts[p];
        if (key < 0 || c < 1 || s < 0 || s > nidx - c || (p && key <= prev_key)) return -1;
        if ((err = put_varint(out, cap, &pos, (uint64_t)(key - prev_key)))) return err;
        prev_key = key;
        if ((err = put_varint(out, cap, &pos, (uint64_t)c))) return err;
        int64_t prev = -1, narrow = 0;
        for (int64_t j = s; j < s + c; j++) {
            int64_t i = idx[j], wide = codes[j] >= ((int64_t)1 << 32);
            if (i <= prev || codes[j] < 0 || (codes[j] > 1 && !wide) || codes[j] >= ((int64_t)1 << 33)) return -1;
            if ((err = put_varint(out, cap, &pos, (uint64_t)(i - prev - 1) * 2 + (uint64_t)wide))) return err;
            prev = i;
            if (wide) {
                if (pos + 4 > cap) return -2;
                uint32_t bits = (uint32_t)(codes[j] & 0xFFFFFFFF);
                for (int b = 0; b < 4; b++) out[pos++] = (uint8_t)(bits >> (8 * b));
            } else {
                narrow++;
            }
        }
        int64_t nbytes = (narrow + 7) / 8;
        if (pos + nbytes > cap) return -2;
        memset(out + pos, 0, (size_t)nbytes);
        int64_t bit = 0;
        for (int64_t j = s; j < s + c; j++)
            if (codes[j] < ((int64_t)1 << 32)) {
                if (codes[j] & 1) out[pos + (bit >> 3)] |= (uint8_t)(1 << (bit & 7));
                bit++;
            }
        pos += nbytes;
    }
    return pos;
}

/* Which lanes this build has: 1 GCC's vector types, 0 arrays (`VECTOR_LANES`). */
int64_t rp_vector_lanes(void) { return VECTOR_LANES; }

/* The size of argument block `which` (dot_args_t, full_args_t, ln_args_t, ln_back_args_t, softmax_args_t,
   dot_replay_args_t, axis_sums_args_t, ce_args_t, ce_back_args_t, full_replay_args_t,
   outer_args_t), -1 past them: native.py checks its packing against each. */
int64_t rp_args_size(int64_t which) {
    static const int64_t sizes[] = {sizeof(dot_args_t),        sizeof(full_args_t),    sizeof(ln_args_t),
                                    sizeof(ln_back_args_t),    sizeof(softmax_args_t), sizeof(dot_replay_args_t),
                                    sizeof(axis_sums_args_t), sizeof(ce_args_t),      sizeof(ce_back_args_t),
                                    sizeof(full_replay_args_t), sizeof(outer_args_t)};
    return which >= 0 && which < (int64_t)(sizeof sizes / sizeof *sizes) ? sizes[which] : -1;
}
