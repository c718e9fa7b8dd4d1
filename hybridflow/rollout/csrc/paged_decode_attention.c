/* Decode attention over the paged KV cache on CPU, fp32: each row reads its own keys and values once.
 *
 * Built at first use by hybridflow/rollout/cpu_kernels.py (gcc -O3 -march=native -fopenmp), loaded with
 * ctypes. Why a kernel of its own: SDPA over the cache needs one key span for the whole batch (every row
 * reads up to the longest row's length, ~1.5x the bytes in an RL batch) and a contiguous layout (the
 * blocks gathered, or a slot-layout mirror kept beside the pool); and with 3 query heads per KV head its
 * tiny matmuls ran at ~40 % of the bandwidth a plain sum reaches (docs/benchmarks.md).
 *
 * Shapes (all contiguous except the table's row stride): q [N, H, D]; keys, values [KV, blocks, B, D] (one
 * layer of the pool); tables [N, table_stride] int32, position p of row n at block tables[n][p / B], offset
 * p % B; lengths [N] int64; out [N, H, D]. Grouped-query: query heads h*G .. h*G+G-1 read KV head h.
 *
 * Per (row, KV head) task, two passes over the row's positions t in [first, length):
 *   s[g][t] = scale * <q_g, k_t>, or c tanh(s / c) with a soft cap c (Gemma 2); pass 1 reads each key once
 *             for the G query heads
 *   m[g] = max_t s[g][t];  p = exp(s - m);  out_g = sum_t p[g][t] v_t / sum_t p[g][t]   (pass 2: values once)
 * with first = max(0, length - window) for a sliding window (window = 0: none). With attention sinks (gpt-oss,
 * sinks [H], NULL: none) each head's sink logit joins the softmax and is dropped: m[g] = max(m, sink[g]) and
 * sum_t p[g][t] + exp(sink[g] - m[g]) divides.
 *
 * paged_decode_attention_bf16 takes a bf16 pool, q and out (sinks stay fp32): a task first widens its row's blocks
 * of the pool (read once from memory, half the fp32 bytes) into a per-thread fp32 scratch laid out as blocks
 * 0, 1, ... (a few tens of KB at decode lengths: it stays in cache), then runs the same fp32 task over it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#define LANES 16
#define MAX_GROUP 16

/* LANES floats in one vector (GCC splits it into two on AVX2 machines). */
typedef float vec16 __attribute__((vector_size(64)));
static inline vec16 load16(const float *p) {
    vec16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* <a, b> over D floats (vectorised by the compiler, which may reassociate the sum: -fassociative-math). */
static inline float dot(const float *a, const float *b, int64_t d) {
    float total = 0.0f;
    for (int64_t i = 0; i < d; i++) total += a[i] * b[i];
    return total;
}

static inline float sum(const float *x, int64_t n) {
    float total = 0.0f;
    for (int64_t i = 0; i < n; i++) total += x[i];
    return total;
}

/* The positions [lo, hi) of a row that block `index` of its table holds, and where they lie. */
typedef struct {
    const float *base;
    int64_t lo, hi;
} BlockSpan;

static inline BlockSpan block_span(const float *pool, const int32_t *table, int64_t index, int64_t first,
                                   int64_t length, int64_t head_offset, int64_t block_size, int64_t d) {
    int64_t start = index * block_size;
    BlockSpan span;
    span.lo = first > start ? first : start;
    span.hi = length < start + block_size ? length : start + block_size;
    /* position t of the block at base + (t - first) * d, so that callers index by t - first */
    span.base = pool + (head_offset + (int64_t)table[index] * block_size + (first - start)) * d;
    return span;
}

/* Ask for block `index` of the table while the one before it is read: a block's positions are one
 * contiguous run (block_size x D floats), but consecutive blocks lie anywhere in the pool, where the hardware
 * prefetcher does not follow (the kernel stalled on the first lines of every block). */
static inline void prefetch_block(const float *pool, const int32_t *table, int64_t index, int64_t blocks,
                                  int64_t head_offset, int64_t block_size, int64_t d) {
    if (index >= blocks) return;
    const char *start = (const char *)(pool + (head_offset + (int64_t)table[index] * block_size) * d);
    for (int64_t byte = 0; byte < (int64_t)sizeof(float) * block_size * d; byte += 64)
        __builtin_prefetch(start + byte, 0, 3);
}

static inline __attribute__((always_inline)) void attend_one(const float *q, const float *keys, const float *values, const int32_t *table,
                       int64_t first, int64_t length, int64_t head_offset, int64_t block_size, int64_t d,
                       int64_t group, float scale, float softcap, const float *sinks, float *scores, float *out) {
    int64_t span = length - first, blocks = (length + block_size - 1) / block_size;
    float maximum[MAX_GROUP], total[MAX_GROUP];
    for (int64_t g = 0; g < group; g++) maximum[g] = sinks != NULL ? sinks[g] : -INFINITY;
    /* Walked block by block, so that no position pays a division. */
    for (int64_t index = first / block_size; index < blocks; index++) {
        BlockSpan at = block_span(keys, table, index, first, length, head_offset, block_size, d);
        if (index + 1 < blocks)
            prefetch_block(keys, table, index + 1, blocks, head_offset, block_size, d);
        else /* the values' first block, read next */
            prefetch_block(values, table, first / block_size, blocks, head_offset, block_size, d);
        for (int64_t t = at.lo - first; t < at.hi - first; t++) {
            const float *k = at.base + t * d;
            for (int64_t g = 0; g < group; g++) {
                float s = scale * dot(q + g * d, k, d);
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap); /* Gemma 2: c tanh(s / c) */
                scores[g * span + t] = s;
                maximum[g] = s > maximum[g] ? s : maximum[g];
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *row = scores + g * span, m = maximum[g];
        for (int64_t t = 0; t < span; t++) row[t] = exp_clamped(row[t] - m);
        total[g] = sum(row, span) + (sinks != NULL ? exp_clamped(sinks[g] - m) : 0.0f);
    }
    /* Values 16 dims at a time, the group's sums held in registers: each line of a value row is read once,
     * and no partial sum goes back to memory between positions. */
    for (int64_t chunk = 0; chunk < d; chunk += LANES) {
        vec16 acc[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) acc[g] = (vec16){0};
        for (int64_t index = first / block_size; index < blocks; index++) {
            BlockSpan at = block_span(values, table, index, first, length, head_offset, block_size, d);
            if (chunk == 0) prefetch_block(values, table, index + 1, blocks, head_offset, block_size, d);
            for (int64_t t = at.lo - first; t < at.hi - first; t++) {
                vec16 v = load16(at.base + t * d + chunk);
                for (int64_t g = 0; g < group; g++) acc[g] += scores[g * span + t] * v;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            vec16 o = acc[g] / total[g];
            memcpy(out + g * d + chunk, &o, sizeof o);
        }
    }
}

/* Whether every row's length fits its table (length <= max_length) and every block id it reads lies in the pool:
 * checked once, before any row is read, so that a malformed table is refused rather than read out of bounds. */
static int tables_valid(const int32_t *tables, int64_t table_stride, const int64_t *lengths, int64_t rows,
                        int64_t block_size, int64_t blocks, int64_t max_length) {
    for (int64_t n = 0; n < rows; n++) {
        if (lengths[n] < 0 || lengths[n] > max_length) return 0;
        for (int64_t index = 0; index * block_size < lengths[n]; index++) {
            int32_t block = tables[n * table_stride + index];
            if (block < 0 || block >= blocks) return 0;
        }
    }
    return 1;
}

/* The first position a row of `length` attends to: the last `window` ones, or all (window = 0). */
static inline int64_t window_start(int64_t length, int64_t window) {
    return window > 0 && length > window ? length - window : 0;
}

/* One (row, KV head) task: a copy of attend_one per common group size (H / KV of the models in use), with the
 * group's loops unrolled. */
static void attend_task(const float *q, const float *keys, const float *values, const int32_t *table, int64_t first,
                        int64_t length, int64_t head_offset, int64_t block_size, int64_t d, int64_t group,
                        float scale, float softcap, const float *sinks, float *scores, float *out) {
#define ATTEND(G) attend_one(q, keys, values, table, first, length, head_offset, block_size, d, G, scale, softcap, \
                             sinks, scores, out)
    switch (group) {
        case 1: ATTEND(1); break;
        case 2: ATTEND(2); break;
        case 3: ATTEND(3); break;
        case 4: ATTEND(4); break;
        case 5: ATTEND(5); break;
        case 6: ATTEND(6); break;
        case 7: ATTEND(7); break;
        case 8: ATTEND(8); break;
        default: ATTEND(group);
    }
#undef ATTEND
}

/* Returns 0, or -1 for inputs it refuses: a group it cannot take, a row longer than its table (max_length), or a
 * block id outside the pool. */
int paged_decode_attention_f32(const float *q, const float *keys, const float *values, const int32_t *tables,
                               int64_t table_stride, const int64_t *lengths, float *out, int64_t rows,
                               int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t blocks,
                               int64_t block_size, int64_t max_length, float scale, float softcap,
                               const float *sinks, int64_t window, int threads) {
    int64_t group = heads / kv_heads;
    if (group > MAX_GROUP || group * kv_heads != heads || head_dim % LANES != 0) return -1;
    if (!tables_valid(tables, table_stride, lengths, rows, block_size, blocks, max_length)) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scores = malloc(sizeof(float) * group * (max_length > 0 ? max_length : 1));
        if (scores == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < rows * kv_heads; task++) {
            if (scores == NULL) continue;
            int64_t n = task / kv_heads, h = task % kv_heads, length = lengths[n];
            int64_t first = window_start(length, window);
            if (task + 1 < rows * kv_heads) { /* the next task's first keys, while this one runs */
                int64_t next_n = (task + 1) / kv_heads, next_length = lengths[next_n];
                prefetch_block(keys, tables + next_n * table_stride, window_start(next_length, window) / block_size,
                               (next_length + block_size - 1) / block_size,
                               (task + 1) % kv_heads * blocks * block_size, block_size, head_dim);
            }
            attend_task(q + (n * heads + h * group) * head_dim, keys, values, tables + n * table_stride, first,
                        length, h * blocks * block_size, block_size, head_dim, group, scale, softcap,
                        sinks != NULL ? sinks + h * group : NULL, scores, out + (n * heads + h * group) * head_dim);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

/* Blocks first / B .. of a row's table, of one KV head (at head_offset in the bf16 pool), widened into scratch at
 * block index * B (the scratch's own table is 0, 1, ...). */
static void widen_blocks(const uint16_t *pool, const int32_t *table, int64_t first, int64_t length,
                         int64_t head_offset, int64_t block_size, int64_t d, float *scratch) {
    int64_t blocks = (length + block_size - 1) / block_size;
    for (int64_t index = first / block_size; index < blocks; index++) {
        if (index + 1 < blocks)
            for (int64_t byte = 0; byte < (int64_t)sizeof(uint16_t) * block_size * d; byte += 64)
                __builtin_prefetch((const char *)(pool + (head_offset + (int64_t)table[index + 1] * block_size) * d)
                                   + byte, 0, 0);
        widen_bf16(pool + (head_offset + (int64_t)table[index] * block_size) * d, scratch + index * block_size * d,
                   block_size * d);
    }
}

/* paged_decode_attention_f32 over a bf16 pool, q and out (the header comment). */
int paged_decode_attention_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                                const int32_t *tables, int64_t table_stride, const int64_t *lengths, uint16_t *out,
                                int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t blocks,
                                int64_t block_size, int64_t max_length, float scale, float softcap,
                                const float *sinks, int64_t window, int threads) {
    int64_t group = heads / kv_heads;
    if (group > MAX_GROUP || group * kv_heads != heads || head_dim % LANES != 0) return -1;
    if (!tables_valid(tables, table_stride, lengths, rows, block_size, blocks, max_length)) return -1;
    int64_t table_blocks = (max_length + block_size - 1) / block_size, span = table_blocks * block_size * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scores = malloc(sizeof(float) * group * (max_length > 0 ? max_length : 1));
        /* keys, values, q and out of one task, in fp32 */
        float *wide = malloc(sizeof(float) * (2 * span + 2 * group * head_dim));
        int32_t *identity = malloc(sizeof(int32_t) * (table_blocks > 0 ? table_blocks : 1));
        if (scores == NULL || wide == NULL || identity == NULL) failed = 1;
        for (int64_t index = 0; identity != NULL && index < table_blocks; index++) identity[index] = (int32_t)index;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < rows * kv_heads; task++) {
            if (scores == NULL || wide == NULL || identity == NULL) continue;
            int64_t n = task / kv_heads, h = task % kv_heads, length = lengths[n];
            int64_t first = window_start(length, window), offset = h * blocks * block_size;
            float *wide_keys = wide, *wide_values = wide + span, *wide_q = wide + 2 * span;
            float *wide_out = wide_q + group * head_dim;
            widen_blocks(keys, tables + n * table_stride, first, length, offset, block_size, head_dim, wide_keys);
            widen_blocks(values, tables + n * table_stride, first, length, offset, block_size, head_dim, wide_values);
            widen_bf16(q + (n * heads + h * group) * head_dim, wide_q, group * head_dim);
            attend_task(wide_q, wide_keys, wide_values, identity, first, length, 0, block_size, head_dim, group, scale,
                        softcap, sinks != NULL ? sinks + h * group : NULL, scores, wide_out);
            narrow_to_bf16(wide_out, out + (n * heads + h * group) * head_dim, group * head_dim);
        }
        free(scores);
        free(wide);
        free(identity);
    }
    return failed ? -1 : 0;
}
