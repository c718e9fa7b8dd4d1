/* One token per row from raw fp32 logits: temperature, then the inverse CDF (greedy rows: the arg max).
 *
 * Built at first use by hybridflow/rollout/cpu_kernels.py, loaded with ctypes; the CPU counterpart of
 * hybridflow/rollout/triton_sampling.py, with the same rule. The torch path (hybridflow/rollout/sampler.py) makes
 * five passes over [N, V] (max, subtract, exp, running sum, search), each its own op; at SmolLM2's 49,152-token
 * vocabulary that was ~6 ms of a 32-row decode lane. Here, per row n with z = logits[n], T = temperature[n],
 * u = uniform[n]:
 *
 *   m = max_i z_i / T;   w_i = exp(z_i / T - m);   s = sum_i w_i                     (w kept in a scratch row)
 *   token = the first i with w_0 + ... + w_i > u s   (torch: searchsorted(cumsum(w), u s, right=True))
 *   logprob = z_token / T - m - log s
 *
 * The running sum is taken 64 entries at a time (a block's fp32 sum, added in fp64; then the block that crosses u s
 * entry by entry), not in torch.cumsum's order, so a draw within rounding of a boundary between two tokens can
 * pick the neighbour: within ~64 fp32 roundings of the block (a few 1e-6 of s), inside the sampler's check. A greedy row (T = 1 given) reports its arg max (the first
 * maximum, as torch.argmax) and log softmax(z)[token].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector_math.h"

#define BLOCK 64

static float maximum(const float *z, int64_t vocab) {
    float best = -INFINITY;
    for (int64_t i = 0; i < vocab; i++) best = z[i] > best ? z[i] : best;
    return best;
}

/* The first index holding top (torch.argmax's tie rule). */
static int64_t first_index_of(const float *z, int64_t vocab, float top) {
    int64_t index = 0;
    while (index < vocab - 1 && !(z[index] == top)) index++;
    return index;
}

static inline float sum(const float *x, int64_t n) {
    float total = 0.0f;
    for (int64_t i = 0; i < n; i++) total += x[i];
    return total;
}

/* Each block's sum of w (BLOCK entries, fp32) into sums[], and their total in fp64. */
static double block_sums(const float *w, int64_t vocab, float *sums) {
    double total = 0.0;
    for (int64_t b = 0, start = 0; start < vocab; b++, start += BLOCK) {
        sums[b] = sum(w + start, (start + BLOCK < vocab ? start + BLOCK : vocab) - start);
        total += sums[b];
    }
    return total;
}

/* The first index whose running sum of w exceeds target, or the last index with w > 0 where rounding leaves the
 * target at or above the whole sum. The running sum is fp64 over the same block sums as the total: an fp32 one
 * drifts by ~1e-4 of the total over a 262k vocabulary (Gemma 3), against an fp32 total summed in another order,
 * which moved a quarter of the draws of a real model's rows to the wrong side of a token boundary. */
static int64_t inverse_cdf(const float *w, const float *sums, int64_t vocab, double target) {
    double before = 0.0;
    for (int64_t b = 0, start = 0; start < vocab; b++, start += BLOCK) {
        int64_t stop = start + BLOCK < vocab ? start + BLOCK : vocab;
        if (before + sums[b] > target) {
            for (int64_t i = start; i < stop; i++) {
                before += w[i];
                if (before > target) return i;
            }
            return stop - 1;
        }
        before += sums[b];
    }
    int64_t last = vocab - 1;
    while (last > 0 && !(w[last] > 0.0f)) last--;
    return last;
}

/* w: scratch of vocab + ceil(vocab / BLOCK) floats (the weights, then the block sums). */
static void sample_row(const float *z, float temperature, int greedy, float u, int64_t vocab, float *w,
                       int64_t *token, float *logprob) {
    float inverse_t = 1.0f / temperature, top = maximum(z, vocab);
    float peak = top * inverse_t; /* = max z / T: scaling by T > 0 keeps the order */
    for (int64_t i = 0; i < vocab; i++) w[i] = exp_clamped(z[i] * inverse_t - peak);
    float *sums = w + vocab;
    double total = block_sums(w, vocab, sums);
    int64_t chosen = greedy ? first_index_of(z, vocab, top) : inverse_cdf(w, sums, vocab, (double)u * total);
    *token = chosen;
    *logprob = z[chosen] * inverse_t - peak - (float)log(total);
}

/* Shapes: logits [rows, vocab] contiguous; temperature, uniform [rows] (uniform may be [rows, 1]); greedy [rows]
 * bytes (0 or 1); tokens [rows] int64; logprobs [rows]. Returns -1 where scratch memory could not be had. */
int sample_rows_f32(const float *logits, const float *temperature, const uint8_t *greedy, const float *uniform,
                    int64_t *tokens, float *logprobs, int64_t rows, int64_t vocab, int threads) {
    int failed = 0;
    /* Below 16 rows waking a second thread costs more than it saves (~50 us against ~15 us a row). */
#pragma omp parallel num_threads(threads) if (threads > 1 && rows >= 16)
    {
        float *w = malloc(sizeof(float) * ((vocab > 0 ? vocab : 1) + (vocab + BLOCK - 1) / BLOCK));
        if (w == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (w == NULL) continue;
            sample_row(logits + n * vocab, temperature[n], greedy[n], uniform[n], vocab, w, tokens + n, logprobs + n);
        }
        free(w);
    }
    return failed ? -1 : 0;
}
