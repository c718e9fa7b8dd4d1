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
 * paged_decode_attention_bf16 takes a bf16 pool, q and out (sinks stay fp32) and reads the pool in place (half the
 * fp32 bytes, no fp32 copy of it): one pass over a row's positions, 16 at a time, each key and value widened to fp32 in
 * registers (or, for the scores, multiplied as bf16 pairs by AVX-512-BF16's vdpbf16ps where the build has it), fp32
 * sums, an online softmax, the output rounded to bf16 once. An earlier twin widened the row's blocks into an fp32
 * scratch first: at 64 rows that copy cost more than the halved bytes saved (docs/benchmarks.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

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
        __builtin_prefetch(start + byte, 0, 2); /* into L2: 1.4-1.5x faster than into L1 (issue 56, benchmarks.md) */
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

/* ---- bf16: the pool read in place, each key and value widened to fp32 in registers (issue 56) ---- */

#define TILE 16 /* positions whose scores are computed together (one vector of 16 scores per query head) */

typedef uint16_t half16 __attribute__((vector_size(32)));
typedef uint32_t word16 __attribute__((vector_size(64)));

/* 16 bf16 as fp32: a bf16 is the top half of an fp32, so widening is a zero-extension and a shift. */
static inline vec16 widen16(const uint16_t *p) {
    half16 h;
    memcpy(&h, p, sizeof h);
    word16 w = __builtin_convertvector(h, word16) << 16;
    return (vec16)w;
}

/* 32 bf16 as two fp32 vectors: the even dims 0, 2, .., 30 (the low half of each 32-bit pair, shifted up) and the odd
 * ones (the high half, masked): one shift and one and, where widening 16 in order takes a zero-extension and a shift. */
static inline void split32(const uint16_t *p, vec16 *even, vec16 *odd) {
    word16 w;
    memcpy(&w, p, sizeof w);
    *even = (vec16)(w << 16);
    *odd = (vec16)(w & 0xffff0000u);
}

/* The kernel's fp32 layout of a D-vector ("split"): each whole 32 dims as their 16 even dims then their 16 odd ones,
 * a last 16 (D % 32) in order. q is widened into it, the output's sums are kept in it. */
static inline void widen_split(const uint16_t *source, float *target, int64_t d) {
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        vec16 even, odd;
        split32(source + c, &even, &odd);
        memcpy(target + c, &even, sizeof even);
        memcpy(target + c + 16, &odd, sizeof odd);
    }
    for (; c < d; c++) target[c] = bf16_to_f32(source[c]);
}

static inline void narrow_split(const float *source, uint16_t *target, float norm, int64_t d) {
    int64_t c = 0;
    for (; c + 32 <= d; c += 32)
        for (int64_t i = 0; i < 16; i++) {
            target[c + 2 * i] = f32_to_bf16(source[c + i] * norm);
            target[c + 2 * i + 1] = f32_to_bf16(source[c + 16 + i] * norm);
        }
    for (; c < d; c++) target[c] = f32_to_bf16(source[c] * norm);
}

/* lanes[g][j] = the lanes of <q_g, k_j> over D for the tile's `count` keys (rows of D bf16 from k; zero past count:
 * those keys are not read), each key read once for the group: fp32 products of the widened key, and with AVX-512-BF16
 * (built where the CPU has it) vdpbf16ps on 32 dims at a time, whose bf16 x bf16 products are exact in fp32; q in
 * the split layout. */
static inline __attribute__((always_inline)) void tile_lanes(const float *q, const uint16_t *q_bf16, const uint16_t *k,
                                                             int64_t count, int64_t d, int64_t group,
                                                             vec16 lanes[][TILE]) {
    for (int64_t j = 0; j < TILE; j++) {
        vec16 acc[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) acc[g] = (vec16){0};
        if (j < count) {
            const uint16_t *key = k + j * d;
            int64_t c = 0;
#ifdef __AVX512BF16__
            for (; c + 32 <= d; c += 32) {
                __m512bh pairs = (__m512bh)_mm512_loadu_si512(key + c);
                for (int64_t g = 0; g < group; g++)
                    acc[g] = (vec16)_mm512_dpbf16_ps((__m512)acc[g], (__m512bh)_mm512_loadu_si512(q_bf16 + g * d + c), pairs);
            }
#else
            (void)q_bf16;
            for (; c + 32 <= d; c += 32) {
                vec16 even, odd;
                split32(key + c, &even, &odd);
                for (int64_t g = 0; g < group; g++)
                    acc[g] += load16(q + g * d + c) * even + load16(q + g * d + c + 16) * odd;
            }
#endif
            for (; c < d; c += LANES) {
                vec16 x = widen16(key + c);
                for (int64_t g = 0; g < group; g++) acc[g] += load16(q + g * d + c) * x;
            }
        }
        for (int64_t g = 0; g < group; g++) lanes[g][j] = acc[g];
    }
}

/* r[j] = the sum of v[j]'s 16 lanes, in a tree of in-lane, then 128-bit-lane shuffles: 45 shuffles and adds for the
 * 16 sums against ~8 a sum one by one. Level by level the vectors hold 2, 4, 8 and 16 positions' partial sums. */
static inline vec16 sum_lanes16(const vec16 v[TILE]) {
    vec16 two[8], four[4], eight[2];
    for (int i = 0; i < 8; i++)
        two[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29)
               + __builtin_shufflevector(v[2 * i], v[2 * i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    for (int i = 0; i < 4; i++)
        four[i] = __builtin_shufflevector(two[2 * i], two[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
                + __builtin_shufflevector(two[2 * i], two[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    for (int i = 0; i < 2; i++)
        eight[i] = __builtin_shufflevector(four[2 * i], four[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
                 + __builtin_shufflevector(four[2 * i], four[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    return __builtin_shufflevector(eight[0], eight[1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
         + __builtin_shufflevector(eight[0], eight[1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}

/* acc[g] = alpha[g] acc[g] + sum_j p[g][j] v_j over the tile's `count` values (acc in the split layout), 32 dims at a
 * time with the group's sums in registers. */
static inline __attribute__((always_inline)) void accumulate_values(float *acc, const float *alpha, const float *p,
                                                                    const uint16_t *v, int64_t count, int64_t d,
                                                                    int64_t group) {
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        vec16 even[MAX_GROUP], odd[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) {
            even[g] = load16(acc + g * d + c) * alpha[g];
            odd[g] = load16(acc + g * d + c + 16) * alpha[g];
        }
        for (int64_t j = 0; j < count; j++) {
            vec16 x_even, x_odd;
            split32(v + j * d + c, &x_even, &x_odd);
            for (int64_t g = 0; g < group; g++) {
                even[g] += p[g * TILE + j] * x_even;
                odd[g] += p[g * TILE + j] * x_odd;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            memcpy(acc + g * d + c, &even[g], sizeof even[g]);
            memcpy(acc + g * d + c + 16, &odd[g], sizeof odd[g]);
        }
    }
    if (c < d) { /* the last 16 dims, in order */
        vec16 sums[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) sums[g] = load16(acc + g * d + c) * alpha[g];
        for (int64_t j = 0; j < count; j++) {
            vec16 x = widen16(v + j * d + c);
            for (int64_t g = 0; g < group; g++) sums[g] += p[g * TILE + j] * x;
        }
        for (int64_t g = 0; g < group; g++) memcpy(acc + g * d + c, &sums[g], sizeof sums[g]);
    }
}

#define AHEAD 2    /* blocks */
#define LOCALITY 2 /* into L2 (prefetcht1): 1.4x faster than into L1 at 64 rows, where L1's miss queue overflowed */
/* Ask for the keys and values of block `index` of the table (if the row has it) AHEAD blocks before they are read:
 * consecutive blocks lie anywhere in the pool, where the hardware prefetcher does not follow. */
static inline void prefetch_bf16_block(const uint16_t *keys, const uint16_t *values, const int32_t *table,
                                       int64_t index, int64_t blocks, int64_t head_offset, int64_t block_elements,
                                       int64_t d) {
    if (index >= blocks) return;
    const char *k = (const char *)(keys + head_offset * d + (int64_t)table[index] * block_elements);
    const char *v = (const char *)(values + head_offset * d + (int64_t)table[index] * block_elements);
    for (int64_t byte = 0; byte < (int64_t)sizeof(uint16_t) * block_elements; byte += 64) {
        __builtin_prefetch(k + byte, 0, LOCALITY);
        __builtin_prefetch(v + byte, 0, LOCALITY);
    }
}

/* One (row, KV head) task in one pass over its positions, TILE at a time, with an online softmax: per query head the
 * running maximum m and sum l of exp(s - m), the output's running sum acc; a tile with maximum m' > m rescales l and
 * acc by exp(m - m'). Sinks start m at the sink logit and join l at the end (as in the fp32 kernel). q: fp32 (widened,
 * split layout) and bf16; acc: group x D floats of scratch. */
static inline __attribute__((always_inline)) void attend_one_bf16(
        const float *q, const uint16_t *q_bf16, const uint16_t *keys, const uint16_t *values, const int32_t *table,
        int64_t first, int64_t length, int64_t head_offset, int64_t block_size, int64_t d, int64_t group, float scale,
        float softcap, const float *sinks, float *acc, uint16_t *out) {
    float maximum[MAX_GROUP], total[MAX_GROUP], alpha[MAX_GROUP], p[MAX_GROUP * TILE];
    for (int64_t g = 0; g < group; g++) maximum[g] = sinks != NULL ? sinks[g] : -INFINITY, total[g] = 0.0f;
    memset(acc, 0, sizeof(float) * group * d);
    int64_t blocks = (length + block_size - 1) / block_size, block_elements = block_size * d;
    for (int64_t index = first / block_size; index < blocks; index++) {
        prefetch_bf16_block(keys, values, table, index + AHEAD, blocks, head_offset, block_elements, d);
        int64_t start = index * block_size, lo = first > start ? first : start;
        int64_t hi = length < start + block_size ? length : start + block_size;
        const uint16_t *block_keys = keys + head_offset * d + (int64_t)table[index] * block_elements;
        const uint16_t *block_values = values + head_offset * d + (int64_t)table[index] * block_elements;
        for (int64_t t = lo; t < hi; t += TILE) {
            int64_t count = hi - t < TILE ? hi - t : TILE;
            vec16 lanes[MAX_GROUP][TILE];
            tile_lanes(q, q_bf16, block_keys + (t - start) * d, count, d, group, lanes);
            for (int64_t g = 0; g < group; g++) {
                float s[TILE];
                vec16 scores = sum_lanes16(lanes[g]) * scale;
                memcpy(s, &scores, sizeof s);
                if (softcap > 0.0f) /* Gemma 2: c tanh(s / c) */
                    for (int64_t j = 0; j < count; j++) s[j] = softcap * tanhf(s[j] / softcap);
                float m = maximum[g], sum = 0.0f;
                for (int64_t j = 0; j < count; j++) m = s[j] > m ? s[j] : m;
                for (int64_t j = 0; j < TILE; j++) {
                    p[g * TILE + j] = j < count ? exp_clamped(s[j] - m) : 0.0f;
                    sum += p[g * TILE + j];
                }
                alpha[g] = exp_clamped(maximum[g] - m); /* ~1e-38 on the first tile, where acc and total are 0 */
                total[g] = total[g] * alpha[g] + sum;
                maximum[g] = m;
            }
            accumulate_values(acc, alpha, p, block_values + (t - start) * d, count, d, group);
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float norm = 1.0f / (total[g] + (sinks != NULL ? exp_clamped(sinks[g] - maximum[g]) : 0.0f));
        narrow_split(acc + g * d, out + g * d, norm, d);
    }
}

/* attend_one_bf16 with the group's loops unrolled for the common group sizes (as attend_task). */
static void attend_task_bf16(const float *q, const uint16_t *q_bf16, const uint16_t *keys, const uint16_t *values,
                             const int32_t *table, int64_t first, int64_t length, int64_t head_offset,
                             int64_t block_size, int64_t d, int64_t group, float scale, float softcap,
                             const float *sinks, float *acc, uint16_t *out) {
#define ATTEND(G) attend_one_bf16(q, q_bf16, keys, values, table, first, length, head_offset, block_size, d, G, scale, \
                                  softcap, sinks, acc, out)
    switch (group) {
        case 1: ATTEND(1); break;
        case 2: ATTEND(2); break;
        case 3: ATTEND(3); break;
        case 4: ATTEND(4); break;
        case 6: ATTEND(6); break;
        case 8: ATTEND(8); break;
        default: ATTEND(group);
    }
#undef ATTEND
}

/* Whether this build scores with AVX-512-BF16's vdpbf16ps (1) or widens keys to fp32 (0): tests check which path they
 * pinned. */
int paged_decode_attention_bf16_dot_units(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

/* paged_decode_attention_f32 over a bf16 pool, q and out (the header comment): one pass, fp32 math, out rounded once. */
int paged_decode_attention_bf16(const uint16_t *q, const uint16_t *keys, const uint16_t *values,
                                const int32_t *tables, int64_t table_stride, const int64_t *lengths, uint16_t *out,
                                int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t blocks,
                                int64_t block_size, int64_t max_length, float scale, float softcap,
                                const float *sinks, int64_t window, int threads) {
    int64_t group = heads / kv_heads;
    if (group > MAX_GROUP || group * kv_heads != heads || head_dim % LANES != 0) return -1;
    if (!tables_valid(tables, table_stride, lengths, rows, block_size, blocks, max_length)) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *wide_q = malloc(sizeof(float) * 2 * group * head_dim), *acc = wide_q + group * head_dim;
        if (wide_q == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < rows * kv_heads; task++) {
            if (wide_q == NULL) continue;
            int64_t n = task / kv_heads, h = task % kv_heads, length = lengths[n];
            const uint16_t *task_q = q + (n * heads + h * group) * head_dim;
            if (task + 1 < rows * kv_heads) { /* the next task's first blocks, before this one's AHEAD-th is asked for */
                int64_t next_n = (task + 1) / kv_heads, next_length = lengths[next_n];
                int64_t next_first = window_start(next_length, window) / block_size;
                for (int64_t index = next_first; index < next_first + AHEAD; index++)
                    prefetch_bf16_block(keys, values, tables + next_n * table_stride, index,
                                        (next_length + block_size - 1) / block_size,
                                        (task + 1) % kv_heads * blocks * block_size, block_size * head_dim, head_dim);
            }
            for (int64_t g = 0; g < group; g++) widen_split(task_q + g * head_dim, wide_q + g * head_dim, head_dim);
            attend_task_bf16(wide_q, task_q, keys, values, tables + n * table_stride, window_start(length, window),
                             length, h * blocks * block_size, block_size, head_dim, group, scale, softcap,
                             sinks != NULL ? sinks + h * group : NULL, acc, out + (n * heads + h * group) * head_dim);
        }
        free(wide_q);
    }
    return failed ? -1 : 0;
}
