/* The replay's hot loops: a rounding point's record pass fused (round float64 results to float32,
   find the close calls, write their log codes), rounding alone, and the optimizer updates (below).

   Semantics are exactly those of replay/determinism.py (the torch path stays as the reference and
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

/* out[i] = float32(v[i]) as a double. */
void rp_round(const double *v, double *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = (double)(float)v[i];
}

/* Round one row, widths w[j] (safety included) given; flag[j] says whether element j's window
   may straddle, and the result whether any does. Branch-free so that it vectorizes; most rows
   report nothing. */
static int round_row(const double *restrict v, double *restrict out, int64_t n, const double *restrict w,
                     uint8_t *restrict flag) {
    uint32_t any = 0;
    for (int64_t j = 0; j < n; j++) {
        double x = v[j], wj = w[j];
        out[j] = (double)(float)x;
        uint32_t d = (bits32((float)(x - wj)) ^ bits32((float)(x + wj))) & (0u - (uint32_t)(wj > 0));
        flag[j] = d != 0;
        any |= d;
    }
    return any != 0;
}

/* res[o] = sqrt(sum_r X[o * so + r * sr]^2), o < n_out, r < n_red: walking memory in order. */
static void norms(const double *X, int64_t n_out, int64_t n_red, int64_t so, int64_t sr, double *res) {
    if (so < sr) {
        for (int64_t o = 0; o < n_out; o++) res[o] = 0;
        for (int64_t r = 0; r < n_red; r++)
            for (int64_t o = 0; o < n_out; o++) res[o] += X[o * so + r * sr] * X[o * so + r * sr];
    } else {
        for (int64_t o = 0; o < n_out; o++) {
            double acc = 0;
            for (int64_t r = 0; r < n_red; r++) acc += X[o * so + r * sr] * X[o * so + r * sr];
            res[o] = acc;
        }
    }
    for (int64_t o = 0; o < n_out; o++) res[o] = sqrt(res[o]);
}

/* dst (n_out x n_red, contiguous) = X[o * so + r * sr], in tiles so that a transposed source is
   read a cache line at a time. */
static void gather_rows(const double *X, int64_t n_out, int64_t n_red, int64_t so, int64_t sr, double *dst) {
    const int64_t T = 32;
    for (int64_t o0 = 0; o0 < n_out; o0 += T)
        for (int64_t r0 = 0; r0 < n_red; r0 += T)
            for (int64_t o = o0; o < o0 + T && o < n_out; o++)
                for (int64_t r = r0; r < r0 + T && r < n_red; r++) dst[o * n_red + r] = X[o * so + r * sr];
}

/* An operand's rows (A's rows i, or B's columns j) as unit-stride vectors over k, for the exact
   bounds of candidates (a whole row and column each: K cache misses when strided). Laid out so
   already: the operand itself. Else strided reads until they have cost an eighth of a contiguous
   copy of the operand, then the copy (tiled). */
typedef struct {
    const double *x;
    int64_t n_out, n_red, so, sr, uses, budget; /* copy once uses exceed budget */
    double *copy;
} rows_t;

static const double *row_of(rows_t *r, int64_t o, int64_t *stride) {
    if (r->sr != 1 && !r->copy && ++r->uses > r->budget &&
        (r->copy = malloc(sizeof(double) * r->n_out * r->n_red)))
        gather_rows(r->x, r->n_out, r->n_red, r->so, r->sr, r->copy);
    if (r->copy) {
        *stride = 1;
        return r->copy + o * r->n_red;
    }
    *stride = r->sr;
    return r->x + o * r->so;
}

/* C = scale * (A @ B) + bias over a batch of up to two dims (b0, b1), outputs v contiguous
   (b0, b1, M, N). A element (t0, t1, i, k) at a[t0*sa0 + t1*sa1 + i*sa2 + k*sa3] (a stride of 0
   broadcasts), B likewise with sb0..sb3. g = gamma(K + 2) * |scale|; babs = |bias| *
   gamma(K + 2) or NULL, per column j (bias_rows 0) or per row i (bias_rows 1). Candidates by
   Cauchy-Schwarz (||A_i|| ||B_j|| g + babs), then the exact bound g * sum_k |A_ik B_kj| + babs.
   Writes up to cap close calls (flat index, log code); returns how many there are, so the caller
   can retry with room for all. scratch holds M + 3N doubles. */
int64_t rp_dot(const double *v, double *out, int64_t b0, int64_t b1, int64_t M, int64_t N, int64_t K,
               const double *a, int64_t sa0, int64_t sa1, int64_t sa2, int64_t sa3,
               const double *b, int64_t sb0, int64_t sb1, int64_t sb2, int64_t sb3,
               const double *babs, int64_t bias_rows, double g, double safety, double wide, double *scratch,
               int64_t *idx, int64_t *code, int64_t cap) {
    const int64_t sa[4] = {sa0, sa1, sa2, sa3}, sb[4] = {sb0, sb1, sb2, sb3};
    int64_t found = 0;
    double *na = scratch, *nb = scratch + M, *bcol = nb + N, *w = bcol + N, *arow = w + N;
    uint8_t *flag = (uint8_t *)(arow + K);
    for (int64_t j = 0; j < N; j++) bcol[j] = babs && !bias_rows ? babs[j] : 0.0;
    for (int64_t t0 = 0; t0 < b0; t0++) {
        for (int64_t t1 = 0; t1 < b1; t1++) {
            const double *A = a + t0 * sa[0] + t1 * sa[1];
            const double *B = b + t0 * sb[0] + t1 * sb[1];
            int64_t base = (t0 * b1 + t1) * M * N;
            norms(A, M, K, sa[2], sa[3], na);
            for (int64_t i = 0; i < M; i++) na[i] *= g;
            norms(B, N, K, sb[3], sb[2], nb);
            /* A is read a row at a time (all of a row's candidates are handled together), never copied whole */
            rows_t arows = {A, M, K, sa[2], sa[3], 0, INT64_MAX, NULL}, bcols = {B, N, K, sb[3], sb[2], 0, 8 + N / 8, NULL};
            for (int64_t i = 0; i < M; i++) {
                const double *vr = v + base + i * N;
                double bias_i = babs && bias_rows ? babs[i] : 0.0, ni = na[i];
                for (int64_t j = 0; j < N; j++) w[j] = (ni * nb[j] + (bias_i + bcol[j])) * safety;
                if (!round_row(vr, out + base + i * N, N, w, flag)) continue;
                const double *ai = NULL;
                int64_t ak = 1, bk;
                for (int64_t j = 0; j < N; j++) {
                    if (!flag[j]) continue;
                    double bias = bias_i + bcol[j];
                    if (!ai) {  /* this row's first candidate: its row of A, gathered once if strided */
                        ai = row_of(&arows, i, &ak);
                        if (ak != 1) {
                            for (int64_t k = 0; k < K; k++) arow[k] = ai[k * ak];
                            ai = arow, ak = 1;
                        }
                    }
                    const double *bj = row_of(&bcols, j, &bk);
                    double e = 0;
                    for (int64_t k = 0; k < K; k++) e += fabs(ai[k * ak]) * fabs(bj[k * bk]);
                    e = e * g + bias;
                    if (!straddles(vr[j], e * safety)) continue;
                    if (found < cap) {
                        idx[found] = base + i * N + j;
                        code[found] = log_code(vr[j], e, wide);
                    }
                    found++;
                }
            }
            free(arows.copy);
            free(bcols.copy);
        }
    }
    return found;
}

/* v (rows, n) contiguous with its bound e given per element (e_cols == n) or per row (e_cols ==
   1), e contiguous. scratch holds n doubles and n bytes. Same contract as rp_dot. */
int64_t rp_full(const double *v, double *out, int64_t rows, int64_t n, const double *e, int64_t e_cols,
                double safety, double wide, double *w, int64_t *idx, int64_t *code, int64_t cap) {
    int64_t found = 0;
    for (int64_t i = 0; i < rows; i++) {
        const double *vr = v + i * n, *er = e + i * e_cols;
        for (int64_t j = 0; j < n; j++) w[j] = er[e_cols == 1 ? 0 : j] * safety;
        if (!round_row(vr, out + i * n, n, w, (uint8_t *)(w + n))) continue;
        for (int64_t j = 0; j < n; j++) {
            if (!((uint8_t *)(w + n))[j]) continue;
            if (found < cap) {
                idx[found] = i * n + j;
                code[found] = log_code(vr[j], er[e_cols == 1 ? 0 : j], wide);
            }
            found++;
        }
    }
    return found;
}

/* The optimizer updates of replay/train.py, the same IEEE operations in the same order per element
   (train.py's _adamw and _sgd are the reference: every torch op there is one operation per element,
   a Python-float scalar is a double, and float32 -> double is exact). State is float32, the gradient
   float64; outputs are float32. */
void rp_adamw(int64_t n, const float *p, const double *g, const float *m, const float *v,
              float *p_out, float *m_out, float *v_out, double b1, double c1, double b2, double c2,
              double s1, double s2, double eps, double wd, double lr) {
    for (int64_t i = 0; i < n; i++) {
        double pd = p[i], gd = g[i];
        float mn = (float)((double)m[i] * b1 + gd * c1);
        float vn = (float)((double)v[i] * b2 + (gd * gd) * c2);
        double upd = ((double)mn * s1) / (sqrt((double)vn * s2) + eps);
        p_out[i] = (float)(pd - (upd + pd * wd) * lr);
        m_out[i] = mn;
        v_out[i] = vn;
    }
}

void rp_sgd(int64_t n, const float *p, const double *g, const float *mom, float *p_out, float *mom_out,
            double momentum, int64_t has_wd, double wd, double lr) {
    for (int64_t i = 0; i < n; i++) {
        double pd = p[i], gd = g[i];
        if (has_wd) gd = gd + pd * wd;
        float mn = (float)((double)mom[i] * momentum + gd);
        p_out[i] = (float)(pd - (double)mn * lr);
        mom_out[i] = mn;
    }
}
