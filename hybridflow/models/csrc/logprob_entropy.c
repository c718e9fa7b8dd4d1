/* The policy head's log p(label) and entropy from [K, V] logits, and their gradient (issue 62).
 *
 * Built at first use by hybridflow/models/logprob_kernel.py, loaded with ctypes. The torch path
 * (hybridflow/algos/logprob.py) makes ~10 passes over each chunk of rows (cast, max, subtract, exp, sum, log,
 * softmax, multiply, sum; backward: cast, subtract, exp, multiply, addcmul, scatter); here a row is read twice
 * forward (its max; then exp and two sums, from the cache) and once backward (exp, the gradient, one write).
 * Per row z (bf16 or fp32, computed in fp32), label y:
 *
 *   m = max_j z_j;   d_j = z_j - m;   s = sum_j e^{d_j};   t = sum_j e^{d_j} d_j
 *   lse = m + log s;   log p_y = z_y - lse;   H = lse - sum_j p_j z_j = log s - t / s
 *   dz_j = g_lp ([j = y] - p_j) - g_H p_j (log p_j + H),   p_j = e^{z_j - lse}   (the torch path's formula)
 *
 * Sums are fp32 in 16 lanes over blocks of BLOCK entries, each block's total added in fp64, so a row's sum has
 * the rounding of a ~BLOCK / 16-term sum whatever V is. exp is Cephes' (within 2 ulp of expf); arguments at or
 * below -88 give 0 (expf gives a subnormal there, under 2^-126 of the row's largest term, 1), so a masked logit
 * (-inf, or the dtype's lowest) adds nothing to s, t or H, where torch's 0 * -inf gives NaN.
 * Rows are independent: the results do not depend on the thread count (OpenMP over rows). Written as gcc vectors
 * of 16 floats (one zmm on AVX-512, two ymm on AVX2, SSE pieces elsewhere), no intrinsics.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

#define LANES 16
#define BLOCK 1024
#define LOW -88.0f  /* e^LOW is under fp32's smallest normal: the exp below returns 0 from here down */

static inline vf splat(float x) { return (vf){} + x; }

static inline vf select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* e^x for x <= 0 (NaN stays NaN); 0 for x <= LOW. x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial in r,
 * times 2^n built in the exponent bits (n = -127 there gives the bits of 0). */
static inline vf vexp(vf x) {
    x = select(x < LOW, splat(LOW), x);
    /* n = x log2 e rounded to nearest: adding 1.5 * 2^23 leaves no fraction bits, and n in the mantissa's low bits
     * (15% faster than converting to int and back; needs the flags' lack of -fassociative-math) */
    vf shifted = x * 1.44269504088896341f + 12582912.0f;
    vf nf = shifted - 12582912.0f;
    vi n = (vi)shifted - 0x4B400000;
    vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (vf)((n + 127) << 23);
}

static inline float load1(const void *z, int64_t i, int bf16) {
    if (!bf16) return ((const float *)z)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)z)[i] << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* z[i : i + count) as fp32 lanes (count <= 16), -inf past count (adds nothing to a max or a sum of exps). */
static inline vf load(const void *z, int64_t i, int64_t count, int bf16) {
    vf x;
    if (count < LANES) {
        float part[LANES];
        for (int l = 0; l < LANES; l++) part[l] = l < count ? load1(z, i + l, bf16) : -INFINITY;
        memcpy(&x, part, sizeof x);
    } else if (bf16) {
        vh h;
        memcpy(&h, (const uint16_t *)z + i, sizeof h);
        x = (vf)(__builtin_convertvector(h, vu) << 16);
    } else {
        memcpy(&x, (const float *)z + i, sizeof x);
    }
    return x;
}

/* The first count lanes of g into out[i:], bf16 rounded to nearest even, or fp32. A NaN stays a NaN: the NaNs here
 * are the default one or a bf16 input's, quiet, whose low 16 bits are 0, so the rounding carries into no other bit. */
static inline void store(void *out, int64_t i, int64_t count, int bf16, vf g) {
    if (!bf16) {
        memcpy((float *)out + i, &g, sizeof(float) * (count < LANES ? count : LANES));
        return;
    }
    vu bits = (vu)g;
    vh h = __builtin_convertvector((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16, vh);
    memcpy((uint16_t *)out + i, &h, sizeof(uint16_t) * (count < LANES ? count : LANES));
}

static inline float lane_sum(vf v) {
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += v[l];
    return total;
}

static inline __attribute__((always_inline)) void forward_row(const void *z, int64_t vocab, int bf16, int64_t label,
                                                              float *log_prob, float *entropy, float *lse) {
    vf top = splat(-INFINITY);
    for (int64_t i = 0; i < vocab; i += LANES) {
        vf x = load(z, i, vocab - i, bf16);
        top = select(x > top, x, top);
    }
    float m = -INFINITY;
    for (int l = 0; l < LANES; l++) m = top[l] > m ? top[l] : m;
    double s = 0.0, t = 0.0;
    for (int64_t start = 0; start < vocab; start += BLOCK) {
        int64_t stop = start + BLOCK < vocab ? start + BLOCK : vocab;
        vf s_lanes = {}, t_lanes = {};
        for (int64_t i = start; i < stop; i += LANES) {
            vf d = load(z, i, stop - i, bf16) - m;
            d = select(d < LOW, splat(LOW), d);  /* its exp is 0: keeps 0 * -inf out of t */
            vf p = vexp(d);
            s_lanes += p;
            t_lanes += p * d;
        }
        s += lane_sum(s_lanes);
        t += lane_sum(t_lanes);
    }
    float log_s = (float)log(s);
    *lse = m + log_s;
    *log_prob = load1(z, label, bf16) - *lse;
    if (entropy) *entropy = (float)((double)log_s - t / s);
}

/* dz of one row into out (same dtype as z); g_lp / g_h 0 where that output has no gradient. */
static inline __attribute__((always_inline)) void backward_row(const void *z, int64_t vocab, int bf16, int64_t label,
                                                               float lse, float h, float g_lp, float g_h,
                                                               int with_entropy, void *out) {
    for (int64_t i = 0; i < vocab; i += LANES) {
        vf d = load(z, i, vocab - i, bf16) - lse;  /* log p_j */
        d = select(d < LOW, splat(LOW), d);
        vf p = vexp(d);
        vf g = p * -g_lp;
        if (with_entropy) g = (d + h) * p * -g_h + g;
        if (label >= i && label < i + LANES) g[label - i] += g_lp;
        store(out, i, vocab - i, bf16, g);
    }
}

static int labels_in_range(const int64_t *labels, int64_t rows, int64_t vocab) {
    for (int64_t r = 0; r < rows; r++)
        if (labels[r] < 0 || labels[r] >= vocab) return 0;
    return 1;
}

/* logits [rows, vocab] (row stride `stride` elements; bf16 when bf16 != 0, else fp32), labels [rows] ->
 * log_probs, lse [rows] and entropy [rows] (skipped where NULL). -1: a label out of range or a bad shape. */
int logprob_entropy_forward(const void *logits, int64_t rows, int64_t vocab, int64_t stride, int bf16,
                            const int64_t *labels, float *log_probs, float *entropy, float *lse, int threads) {
    if (rows < 0 || vocab <= 0 || stride < vocab || !labels_in_range(labels, rows, vocab)) return -1;
    int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const char *z = (const char *)logits + r * stride * size;
        float *h = entropy ? entropy + r : NULL;
        if (bf16) forward_row(z, vocab, 1, labels[r], log_probs + r, h, lse + r);
        else forward_row(z, vocab, 0, labels[r], log_probs + r, h, lse + r);
    }
    return 0;
}

/* grad [rows, vocab] (row stride grad_stride, the logits' dtype) of sum_r g_lp[r] log_probs[r] + g_h[r] entropy[r]
 * from the forward's lse and entropy; grad_log_probs / grad_entropy NULL where that output has no gradient. */
int logprob_entropy_backward(const void *logits, int64_t rows, int64_t vocab, int64_t stride, int bf16,
                             const int64_t *labels, const float *lse, const float *entropy,
                             const float *grad_log_probs, const float *grad_entropy, void *grad, int64_t grad_stride,
                             int threads) {
    if (rows < 0 || vocab <= 0 || stride < vocab || grad_stride < vocab || !labels_in_range(labels, rows, vocab))
        return -1;
    if (grad_entropy && !entropy) return -1;
    int64_t size = bf16 ? 2 : 4;
    int with_entropy = grad_entropy != NULL;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const char *z = (const char *)logits + r * stride * size;
        char *out = (char *)grad + r * grad_stride * size;
        float g_lp = grad_log_probs ? grad_log_probs[r] : 0.0f, g_h = with_entropy ? grad_entropy[r] : 0.0f;
        float h = with_entropy ? entropy[r] : 0.0f;
        if (bf16) backward_row(z, vocab, 1, labels[r], lse[r], h, g_lp, g_h, with_entropy, out);
        else backward_row(z, vocab, 0, labels[r], lse[r], h, g_lp, g_h, with_entropy, out);
    }
    return 0;
}
