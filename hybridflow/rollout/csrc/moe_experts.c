/* The routed experts of a mixture-of-experts layer at decode sizes, in one call: fp32, OpenMP threads.
 *
 * Built at first use by hybridflow/rollout/cpu_kernels.py, loaded with ctypes (hybridflow/rollout/cpu_moe.py).
 * Why: at a decode step each expert sees a few rows, and the torch path (sort by expert, two packed matmuls and a
 * gate per used expert, index_add) is ~40 small ops a layer, each paying dispatch for little work
 * (docs/benchmarks.md). Here the (token, slot) pairs are grouped by expert (stable counting sort) and each expert's
 * weights are read once per block of four of its pairs (weights packed in blocks of sixteen output columns: each
 * input's sixteen weights scaled into sums held in registers, one contiguous read a task), then:
 *
 *   gate_up[p] = W_gu[e] x[t] (+ b_gu[e])                  [P, 2 I]  P = tokens * top_k pairs, e = ids[p]
 *   act[p]     = silu(g) * u over the halves [g | u]        (gate_kind 0: Mixtral, Qwen3-MoE, DeepSeek-V3, GLM-4.5)
 *              = (clamp(u, -L, L) + 1) * g' sigmoid(alpha g'), g' = min(g, L), over interleaved [g0 u0 g1 u1 ...]
 *                                                           (gate_kind 1: gpt-oss's clamped SwiGLU)
 *   y[p]       = W_d[e] act[p] (+ b_d[e])                   [P, hidden]
 *   out[t]     = sum_s weights[t, s] y[(t, s)]               slots in order
 *
 * the same operations as hybridflow/rollout/moe.py's grouped_experts, so results differ from it by the order of
 * fp32 sums only.
 */
#include <stdint.h>
#include <stdlib.h>

#include "vector_math.h"

#define ROW_BLOCK 4      /* pairs multiplied together: each weight element loaded once per block of pairs */
#define COLUMN_BLOCK 16  /* output columns of one task: ROW_BLOCK x COLUMN_BLOCK sums stay in vector registers */

/* Sixteen floats as one value (gcc's vector extension: one zmm register with AVX-512, two ymm with AVX2). */
typedef float columns __attribute__((vector_size(COLUMN_BLOCK * sizeof(float))));
typedef float unaligned_columns __attribute__((vector_size(COLUMN_BLOCK * sizeof(float)), aligned(4)));

/* target[p][c0:c0 + width) = source_p W[:, c0:c0 + width) (+ b) for the pairs [start, end) of one expert. The
 * weight is packed in column blocks: block = W[:, c0:c0 + COLUMN_BLOCK) as [n, COLUMN_BLOCK] contiguous (zeros past
 * the last column), so a task reads one contiguous run. Source rows: source + index[p] * source_stride (index
 * NULL: p itself). */
static void expert_columns(const float *block, const float *bias, int64_t n, int64_t c0, int64_t width,
                           const float *source, int64_t source_stride, const int64_t *index, int64_t start,
                           int64_t end, float *target, int64_t target_stride) {
    for (int64_t p = start; p < end; p += ROW_BLOCK) {
        int count = end - p < ROW_BLOCK ? (int)(end - p) : ROW_BLOCK;
        const float *x[ROW_BLOCK];
        for (int j = 0; j < ROW_BLOCK; j++) {  /* a short block repeats its first row (its sums are not stored) */
            int64_t row = p + (j < count ? j : 0);
            x[j] = source + (index ? index[row] : row) * source_stride;
        }
        columns v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0};
        for (int64_t i = 0; i < n; i++) {
            columns w = *(const unaligned_columns *)(block + i * COLUMN_BLOCK);
            v0 += x[0][i] * w, v1 += x[1][i] * w, v2 += x[2][i] * w, v3 += x[3][i] * w;
        }
        float sums[ROW_BLOCK][COLUMN_BLOCK];
        *(unaligned_columns *)sums[0] = v0, *(unaligned_columns *)sums[1] = v1;
        *(unaligned_columns *)sums[2] = v2, *(unaligned_columns *)sums[3] = v3;
        for (int j = 0; j < count; j++)
            for (int64_t c = 0; c < width; c++)
                target[(p + j) * target_stride + c0 + c] = sums[j][c] + (bias ? bias[c0 + c] : 0.0f);
    }
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + exp_clamped(-x)); }

/* act [inner] from one pair's gate_up [2 inner] (module doc). */
static void gate(const float *gate_up, float *act, int64_t inner, int gate_kind, float alpha, float limit) {
    if (gate_kind == 0) {
        for (int64_t i = 0; i < inner; i++) act[i] = gate_up[i] * sigmoid(gate_up[i]) * gate_up[inner + i];
        return;
    }
    for (int64_t i = 0; i < inner; i++) {
        float g = gate_up[2 * i], u = gate_up[2 * i + 1];
        g = g > limit ? limit : g;
        u = u > limit ? limit : (u < -limit ? -limit : u);
        act[i] = (u + 1.0f) * (g * sigmoid(g * alpha));
    }
}

/* Shapes: hidden [tokens, dim]; ids, weights [tokens, top_k] (int64, fp32); gate_up [experts, ceil(2 inner / 16),
 * dim, 16] (column blocks, expert_columns); gate_up_bias [experts, 2 inner] or NULL; down [experts, ceil(dim / 16),
 * inner, 16]; down_bias [experts, dim] or NULL; out
 * [tokens, dim]; all contiguous. gate_kind 0 or 1 (module doc). Returns -1 for an expert id out of range or a
 * failed allocation (out untouched), else 0. */
int moe_experts_f32(const float *hidden, const int64_t *ids, const float *weights, int64_t tokens, int64_t top_k,
                    const float *gate_up, const float *gate_up_bias, const float *down, const float *down_bias,
                    int64_t experts, int64_t dim, int64_t inner, int gate_kind, float alpha, float limit, float *out,
                    int threads) {
    int64_t pairs = tokens * top_k;
    for (int64_t p = 0; p < pairs; p++)
        if (ids[p] < 0 || ids[p] >= experts) return -1;
    int64_t *starts = calloc(experts + 1, sizeof(int64_t)), *token_of = malloc(pairs * sizeof(int64_t));
    int64_t *slot_of = malloc(pairs * sizeof(int64_t));  /* sorted position of pair (t, s) */
    float *projected = malloc(pairs * (2 * inner + inner + dim) * sizeof(float));
    if (!starts || !token_of || !slot_of || !projected) {
        free(starts), free(token_of), free(slot_of), free(projected);
        return -1;
    }
    for (int64_t p = 0; p < pairs; p++) starts[ids[p] + 1]++;
    for (int64_t e = 0; e < experts; e++) starts[e + 1] += starts[e];
    int64_t *fill = malloc(experts * sizeof(int64_t));
    if (!fill) {
        free(starts), free(token_of), free(slot_of), free(projected);
        return -1;
    }
    for (int64_t e = 0; e < experts; e++) fill[e] = starts[e];
    for (int64_t p = 0; p < pairs; p++) {  /* stable: pairs of one expert keep their token order */
        int64_t position = fill[ids[p]]++;
        token_of[position] = p / top_k;
        slot_of[p] = position;
    }
    free(fill);
    float *activated = projected + pairs * 2 * inner, *expert_out = activated + pairs * inner;
    int64_t up_tasks = (2 * inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, down_tasks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < experts * up_tasks; task++) {
            int64_t e = task / up_tasks, c0 = (task % up_tasks) * COLUMN_BLOCK;
            int64_t width = c0 + COLUMN_BLOCK < 2 * inner ? COLUMN_BLOCK : 2 * inner - c0;
            if (starts[e] == starts[e + 1]) continue;
            expert_columns(gate_up + (e * up_tasks + c0 / COLUMN_BLOCK) * dim * COLUMN_BLOCK,
                           gate_up_bias ? gate_up_bias + e * 2 * inner : NULL, dim, c0, width, hidden, dim, token_of,
                           starts[e], starts[e + 1], projected, 2 * inner);
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++)
            gate(projected + p * 2 * inner, activated + p * inner, inner, gate_kind, alpha, limit);
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < experts * down_tasks; task++) {
            int64_t e = task / down_tasks, c0 = (task % down_tasks) * COLUMN_BLOCK;
            int64_t width = c0 + COLUMN_BLOCK < dim ? COLUMN_BLOCK : dim - c0;
            if (starts[e] == starts[e + 1]) continue;
            expert_columns(down + (e * down_tasks + c0 / COLUMN_BLOCK) * inner * COLUMN_BLOCK,
                           down_bias ? down_bias + e * dim : NULL, inner, c0, width, activated, inner, NULL,
                           starts[e], starts[e + 1], expert_out, dim);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            float *target = out + t * dim;
            for (int64_t h = 0; h < dim; h++) target[h] = 0.0f;
            for (int64_t s = 0; s < top_k; s++) {
                const float *y = expert_out + slot_of[t * top_k + s] * dim;
                float w = weights[t * top_k + s];
                for (int64_t h = 0; h < dim; h++) target[h] += w * y[h];
            }
        }
    }
    free(starts), free(token_of), free(slot_of), free(projected);
    return 0;
}
