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

/* An operand's vectors over k -- A's rows i, or B's columns j -- where k runs over K1 x K2 (K1 = 1
   for a plain matmul; a batch of products summed, as a convolution's weight gradient, has K1 = the
   batch): element (o, k1, k2) at x[o * so + k1 * s1 + k2 * s2]. "flat" when k is one stride. */
typedef struct {
    const double *x;
    int64_t n_out, K1, K2, so, s1, s2;
    int64_t uses, budget; /* B: strided reads until uses exceed budget, then a contiguous copy */
    double *copy;
} vecs_t;

static int flat(const vecs_t *r) { return r->K1 == 1 || r->s1 == r->K2 * r->s2; }

/* res[o] = sqrt(sum_k x(o, k)^2), walking memory in order. */
static void norms(const vecs_t *r, double *res) {
    int64_t K = r->K1 * r->K2;
    if (flat(r) && r->so < r->s2) {
        for (int64_t o = 0; o < r->n_out; o++) res[o] = 0;
        for (int64_t k = 0; k < K; k++)
            for (int64_t o = 0; o < r->n_out; o++) res[o] += r->x[o * r->so + k * r->s2] * r->x[o * r->so + k * r->s2];
    } else {
        for (int64_t o = 0; o < r->n_out; o++) {
            const double *p = r->x + o * r->so;
            double acc = 0;
            for (int64_t k1 = 0; k1 < r->K1; k1++)
                for (int64_t k2 = 0; k2 < r->K2; k2++) acc += p[k1 * r->s1 + k2 * r->s2] * p[k1 * r->s1 + k2 * r->s2];
            res[o] = acc;
        }
    }
    for (int64_t o = 0; o < r->n_out; o++) res[o] = sqrt(res[o]);
}

static void gather_one(const vecs_t *r, int64_t o, double *dst) {
    const double *p = r->x + o * r->so;
    for (int64_t k1 = 0; k1 < r->K1; k1++)
        for (int64_t k2 = 0; k2 < r->K2; k2++) *dst++ = p[k1 * r->s1 + k2 * r->s2];
}

/* All vectors into dst (n_out x K, contiguous); a flat transposed source in tiles, so that it is
   read a cache line at a time. */
static void gather_all(const vecs_t *r, double *dst) {
    int64_t K = r->K1 * r->K2;
    if (!flat(r)) {
        for (int64_t o = 0; o < r->n_out; o++) gather_one(r, o, dst + o * K);
        return;
    }
    const int64_t T = 32;
    for (int64_t o0 = 0; o0 < r->n_out; o0 += T)
        for (int64_t k0 = 0; k0 < K; k0 += T)
            for (int64_t o = o0; o < o0 + T && o < r->n_out; o++)
                for (int64_t k = k0; k < k0 + T && k < K; k++) dst[o * K + k] = r->x[o * r->so + k * r->s2];
}

/* Vector o as a unit-stride array, for a candidate's exact bound (a whole row and column: K cache
   misses when strided): the operand itself where laid out so; else its copy once strided reads
   have cost an eighth of making one (budget); else gathered into buf. */
static const double *vec(vecs_t *r, int64_t o, double *buf) {
    int64_t K = r->K1 * r->K2;
    if (flat(r) && r->s2 == 1) return r->x + o * r->so;
    if (!r->copy && ++r->uses > r->budget && (r->copy = malloc(sizeof(double) * r->n_out * K))) gather_all(r, r->copy);
    if (r->copy) return r->copy + o * K;
    gather_one(r, o, buf);
    return buf;
}

/* C = scale * (A @ B) + bias over a batch of up to two dims (t0 < b0, t1 < b1), output v contiguous
   (b0, b1, M, N); the reduction index k runs over K1 x K2. A element (t0, t1, i, k1, k2) at
   a[t0*sa0 + t1*sa1 + i*sai + k1*sak1 + k2*sak2], B element (t0, t1, k1, k2, j) at
   b[t0*sb0 + t1*sb1 + k1*sbk1 + k2*sbk2 + j*sbj] (a stride of 0 broadcasts). g = gamma(K + 2) *
   |scale|; babs = |bias| * gamma(K + 2) or NULL, per column j (bias_rows 0) or per row i
   (bias_rows 1). Candidates by Cauchy-Schwarz (||A_i|| ||B_j|| g + babs), then the exact bound
   g * sum_k |A_ik B_kj| + babs. Writes up to cap close calls (flat index, log code); returns how
   many there are, so the caller can retry with room for all. scratch holds M + 4N + 2K doubles. */
int64_t rp_dot(const double *v, double *out, int64_t b0, int64_t b1, int64_t M, int64_t N, int64_t K1, int64_t K2,
               const double *a, int64_t sa0, int64_t sa1, int64_t sai, int64_t sak1, int64_t sak2,
               const double *b, int64_t sb0, int64_t sb1, int64_t sbk1, int64_t sbk2, int64_t sbj,
               const double *babs, int64_t bias_rows, double g, double safety, double wide, double *scratch,
               int64_t *idx, int64_t *code, int64_t cap) {
    int64_t found = 0, K = K1 * K2;
    double *na = scratch, *nb = scratch + M, *bcol = nb + N, *w = bcol + N, *arow = w + N, *bbuf = arow + K;
    uint8_t *flag = (uint8_t *)(bbuf + K);
    for (int64_t j = 0; j < N; j++) bcol[j] = babs && !bias_rows ? babs[j] : 0.0;
    for (int64_t t0 = 0; t0 < b0; t0++) {
        for (int64_t t1 = 0; t1 < b1; t1++) {
            /* A's rows are never copied whole: a row's candidates are handled together, so a strided
               row is gathered once (into arow) */
            vecs_t arows = {a + t0 * sa0 + t1 * sa1, M, K1, K2, sai, sak1, sak2, 0, INT64_MAX, NULL};
            vecs_t bcols = {b + t0 * sb0 + t1 * sb1, N, K1, K2, sbj, sbk1, sbk2, 0, 8 + N / 8, NULL};
            int64_t base = (t0 * b1 + t1) * M * N;
            norms(&arows, na);
            for (int64_t i = 0; i < M; i++) na[i] *= g;
            norms(&bcols, nb);
            for (int64_t i = 0; i < M; i++) {
                const double *vr = v + base + i * N;
                double bias_i = babs && bias_rows ? babs[i] : 0.0, ni = na[i];
                for (int64_t j = 0; j < N; j++) w[j] = (ni * nb[j] + (bias_i + bcol[j])) * safety;
                if (!round_row(vr, out + base + i * N, N, w, flag)) continue;
                const double *ai = NULL;
                for (int64_t j = 0; j < N; j++) {
                    if (!flag[j]) continue;
                    double bias = bias_i + bcol[j];
                    if (!ai) ai = vec(&arows, i, arow);
                    const double *bj = vec(&bcols, j, bbuf);
                    double e = 0;
                    for (int64_t k = 0; k < K; k++) e += fabs(ai[k]) * fabs(bj[k]);
                    e = e * g + bias;
                    if (!straddles(vr[j], e * safety)) continue;
                    if (found < cap) {
                        idx[found] = base + i * N + j;
                        code[found] = log_code(vr[j], e, wide);
                    }
                    found++;
                }
            }
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

/* The optimizer updates of replay/training/train.py, the same IEEE operations in the same order per element
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
