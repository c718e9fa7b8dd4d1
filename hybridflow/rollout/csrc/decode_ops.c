/* The small ops of a CPU decode layer, fused: fp32, one pass each, on the calling thread.
 *
 * Built at first use by hybridflow/rollout/cpu_kernels.py, loaded with ctypes; the CPU counterparts of the Triton
 * kernels of hybridflow/rollout/triton_fused.py, with the same contracts. Why: an eager layer is ~30 torch ops on
 * [N, 576]-sized tensors, each a few microseconds of dispatch for well under a microsecond of work, and in decode
 * lanes two threads' dispatches also queue for the GIL (docs/benchmarks.md). A layer is now the four matmuls, the
 * attention kernel and these three calls:
 *
 *   add_rms_norm:   h = x + residual (or x alone);  normed = w * (h / sqrt(mean(h^2) + eps))   (Zhang & Sennrich 2019)
 *                   (unit_offset: Gemma's (1 + w) in place of w)
 *   qkv_rope_write: per head of the fused q|k|v row: Qwen3's / Gemma 3's RMSNorm of q and k heads, the rotary
 *                   embedding (Su et al. 2021, HF's rotate-half layout: x cos + rotate_half(x) sin) on the first
 *                   rotary_dim values of a head (GLM-4.5's partial rotary; the rest pass), q out as [N, H, D], k and
 *                   v written into the paged pool at the row's position
 *   silu_mul:       silu(gate) * up = gate / (1 + exp(-gate)) * up                             (Shazeer 2020)
 *   gelu_tanh_mul:  gelu_tanh(gate) * up, GeGLU (Gemma); gelu_tanh(x) = x / 2 (1 + tanh(y)) = x / (1 + exp(-2 y)),
 *                   y = sqrt(2 / pi) (x + 0.044715 x^3)                       (Shazeer 2020; Hendrycks & Gimpel 2016)
 *
 * in the order of operations of the eager path (hybridflow/rollout/decoder.py), so results differ from it by fp32
 * rounding of sums (and fused multiply-adds) only.
 *
 * Each has a bf16 twin (`_bf16`: every tensor of the call bf16, the engine's dtype on a CPU with bf16 units): the same
 * math in fp32 on the widened values, rounded to bf16 once where a result is stored (the eager bf16 path rounds after
 * each op, as HF does: results differ from it by those roundings). The residual sum is rounded before it is
 * normalised, so the norm reads the same stream the next layer adds to.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector_math.h"

#define MAX_HEAD_DIM 512

/* Shapes: x, residual, normed, summed [rows, columns] contiguous; weight [columns]. residual NULL: h = x (summed
 * is not written). unit_offset 1: scale by (1 + w) (Gemma), 0: by w. */
int add_rms_norm_f32(const float *x, const float *residual, const float *weight, float *normed, float *summed,
                     int64_t rows, int64_t columns, float eps, int unit_offset) {
    float offset = unit_offset ? 1.0f : 0.0f;
    for (int64_t n = 0; n < rows; n++) {
        const float *h = x + n * columns;
        if (residual != NULL) {
            float *out = summed + n * columns;
            const float *r = residual + n * columns;
            for (int64_t i = 0; i < columns; i++) out[i] = h[i] + r[i];
            h = out;
        }
        float squares = 0.0f;
        for (int64_t i = 0; i < columns; i++) squares += h[i] * h[i];
        float inverse_rms = 1.0f / sqrtf(squares / (float)columns + eps);
        float *out = normed + n * columns;
        for (int64_t i = 0; i < columns; i++) out[i] = (offset + weight[i]) * (h[i] * inverse_rms);
    }
    return 0;
}

/* Whether every row's position lies below max_length and the block holding it in the pool: checked before any
 * row is written, so that a malformed table is refused rather than written out of bounds. */
static int positions_valid(const int64_t *positions, const int32_t *tables, int64_t table_stride, int64_t rows,
                           int64_t blocks, int64_t block_size, int64_t max_length) {
    for (int64_t n = 0; n < rows; n++) {
        if (positions[n] < 0 || positions[n] >= max_length) return 0;
        int32_t block = tables[n * table_stride + positions[n] / block_size];
        if (block < 0 || block >= blocks) return 0;
    }
    return 1;
}

/* One q or k head: optional RMSNorm over its D values (weight: that head's row of the norm, plus norm_offset),
 * then the rotation of its first rotary_dim values by the position's cos / sin rows, into target. */
static inline void rotate_head(const float *source, const float *norm_weight, float norm_offset, const float *cos,
                               const float *sin, int64_t d, int64_t rotary_dim, float eps, float *target) {
    float x[MAX_HEAD_DIM];
    memcpy(x, source, sizeof(float) * d);
    if (norm_weight != NULL) {
        float squares = 0.0f;
        for (int64_t i = 0; i < d; i++) squares += x[i] * x[i];
        float inverse_rms = 1.0f / sqrtf(squares / (float)d + eps);
        for (int64_t i = 0; i < d; i++) x[i] = (norm_offset + norm_weight[i]) * (x[i] * inverse_rms);
    }
    int64_t half = rotary_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        target[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
        target[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    for (int64_t i = rotary_dim; i < d; i++) target[i] = x[i];
}

/* The checks of qkv_rope_write_*: the head and rotary dims it takes, every position inside its table and the pool,
 * every rotation at or before its row's own position (so inside the rotary table too). */
static int qkv_inputs_valid(const int64_t *positions, const int64_t *rope_positions, const int32_t *tables,
                            int64_t table_stride, int64_t rows, int64_t d, int64_t rotary_dim, int64_t blocks,
                            int64_t block_size, int64_t max_length) {
    if (d % 2 != 0 || d > MAX_HEAD_DIM || rotary_dim % 2 != 0 || rotary_dim <= 0 || rotary_dim > d) return 0;
    if (!positions_valid(positions, tables, table_stride, rows, blocks, block_size, max_length)) return 0;
    if (rope_positions == NULL) return 1;
    for (int64_t n = 0; n < rows; n++)
        if (rope_positions[n] < 0 || rope_positions[n] > positions[n]) return 0;
    return 1;
}

/* Shapes: qkv [rows, (heads + 2 kv_heads) * d] contiguous (q heads, then k, then v); positions [rows] int64;
 * cos, sin [>= max_length, rotary_dim]; norm_weight [heads + kv_heads, d] or NULL (unit_offset 1: scale by 1 + w,
 * Gemma 3);
 * q_out [rows, heads, d]; keys, values
 * [kv_heads, blocks, block_size, d] (one layer of the pool); tables [rows, table_stride] int32, position p of row n
 * in block tables[n][p / block_size] at offset p % block_size. Returns -1 (writing nothing) for a position at or
 * past max_length, a block id outside the pool, an odd or too large head dim, an odd rotary_dim or one past d. */
int qkv_rope_write_f32(const float *qkv, const int64_t *positions, const int64_t *rope_positions, const float *cos,
                       const float *sin, const float *norm_weight, float *q_out, float *keys, float *values,
                       int64_t rows, int64_t heads, const int32_t *tables, int64_t table_stride, int64_t kv_heads,
                       int64_t d, int64_t rotary_dim, int64_t blocks, int64_t block_size, int64_t max_length,
                       float eps, int unit_offset) {
    if (!qkv_inputs_valid(positions, rope_positions, tables, table_stride, rows, d, rotary_dim, blocks, block_size,
                          max_length))
        return -1;
    if (rope_positions == NULL) rope_positions = positions;
    int64_t width = (heads + 2 * kv_heads) * d;
    for (int64_t n = 0; n < rows; n++) {
        int64_t p = positions[n], r = rope_positions[n];
        int64_t slot = (int64_t)tables[n * table_stride + p / block_size] * block_size + p % block_size;
        const float *row = qkv + n * width, *cos_p = cos + r * rotary_dim, *sin_p = sin + r * rotary_dim;
        for (int64_t j = 0; j < heads + kv_heads; j++) {
            const float *norm = norm_weight == NULL ? NULL : norm_weight + j * d;
            float *target = j < heads ? q_out + (n * heads + j) * d : keys + ((j - heads) * blocks * block_size + slot) * d;
            rotate_head(row + j * d, norm, unit_offset ? 1.0f : 0.0f, cos_p, sin_p, d, rotary_dim, eps, target);
        }
        for (int64_t h = 0; h < kv_heads; h++)
            memcpy(values + (h * blocks * block_size + slot) * d, row + (heads + kv_heads + h) * d, sizeof(float) * d);
    }
    return 0;
}

static inline float silu_times(float gate, float up) { return gate / (1.0f + exp_clamped(-gate)) * up; }

static inline float gelu_tanh_times(float x, float up) {
    float y = 0.7978845608028654f * (x + 0.044715f * x * x * x); /* sqrt(2 / pi) (x + 0.044715 x^3) */
    return x / (1.0f + exp_clamped(-2.0f * y)) * up;
}

/* silu_mul_f32 / _bf16 and gelu_tanh_mul_f32 / _bf16. Shapes: gate_up [rows, 2 * inner] contiguous (gate first);
 * out [rows, inner]. ACT: silu_times or gelu_tanh_times. */
#define GATED(NAME, ACT)                                                                                          \
    int NAME##_f32(const float *gate_up, float *out, int64_t rows, int64_t inner) {                                 \
        for (int64_t n = 0; n < rows; n++) {                                                                      \
            const float *gate = gate_up + n * 2 * inner, *up = gate + inner;                                        \
            for (int64_t i = 0; i < inner; i++) out[n * inner + i] = ACT(gate[i], up[i]);                           \
        }                                                                                                         \
        return 0;                                                                                                 \
    }                                                                                                             \
    int NAME##_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inner) {                        \
        for (int64_t n = 0; n < rows; n++) {                                                                      \
            const uint16_t *gate = gate_up + n * 2 * inner, *up = gate + inner;                                     \
            for (int64_t i = 0; i < inner; i++)                                                                   \
                out[n * inner + i] = f32_to_bf16(ACT(bf16_to_f32(gate[i]), bf16_to_f32(up[i])));                    \
        }                                                                                                         \
        return 0;                                                                                                 \
    }
GATED(silu_mul, silu_times)
GATED(gelu_tanh_mul, gelu_tanh_times)
#undef GATED

/* add_rms_norm_f32 on bf16 tensors (weight too). */
int add_rms_norm_bf16(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, uint16_t *normed,
                      uint16_t *summed, int64_t rows, int64_t columns, float eps, int unit_offset) {
    float offset = unit_offset ? 1.0f : 0.0f;
    for (int64_t n = 0; n < rows; n++) {
        const uint16_t *h = x + n * columns;
        if (residual != NULL) {
            uint16_t *out = summed + n * columns;
            const uint16_t *r = residual + n * columns;
            for (int64_t i = 0; i < columns; i++) out[i] = f32_to_bf16(bf16_to_f32(h[i]) + bf16_to_f32(r[i]));
            h = out;
        }
        float squares = 0.0f;
        for (int64_t i = 0; i < columns; i++) squares += bf16_to_f32(h[i]) * bf16_to_f32(h[i]);
        float inverse_rms = 1.0f / sqrtf(squares / (float)columns + eps);
        uint16_t *out = normed + n * columns;
        for (int64_t i = 0; i < columns; i++)
            out[i] = f32_to_bf16((offset + bf16_to_f32(weight[i])) * (bf16_to_f32(h[i]) * inverse_rms));
    }
    return 0;
}

/* Row r of a rotary table, bf16 or (tables_f32: OLMo 3 keeps its tables fp32 whatever the model's dtype) fp32. */
static inline void table_row(const void *table, int64_t r, int64_t width, int tables_f32, float *target) {
    if (tables_f32)
        memcpy(target, (const float *)table + r * width, sizeof(float) * width);
    else
        widen_bf16((const uint16_t *)table + r * width, target, width);
}

/* qkv_rope_write_f32 on bf16 tensors (qkv, norm_weight, q_out and the pool; cos and sin bf16 or fp32): each head
 * widened, rotated in fp32 by rotate_head, rounded once into q_out or the pool; v copied as it is. */
int qkv_rope_write_bf16(const uint16_t *qkv, const int64_t *positions, const int64_t *rope_positions,
                        const void *cos, const void *sin, const uint16_t *norm_weight, uint16_t *q_out,
                        uint16_t *keys, uint16_t *values, int64_t rows, int64_t heads, const int32_t *tables,
                        int64_t table_stride, int64_t kv_heads, int64_t d, int64_t rotary_dim, int64_t blocks,
                        int64_t block_size, int64_t max_length, float eps, int unit_offset, int tables_f32) {
    if (!qkv_inputs_valid(positions, rope_positions, tables, table_stride, rows, d, rotary_dim, blocks, block_size,
                          max_length))
        return -1;
    if (rope_positions == NULL) rope_positions = positions;
    int64_t width = (heads + 2 * kv_heads) * d;
    float source[MAX_HEAD_DIM], norm[MAX_HEAD_DIM], target[MAX_HEAD_DIM], cos_p[MAX_HEAD_DIM], sin_p[MAX_HEAD_DIM];
    for (int64_t n = 0; n < rows; n++) {
        int64_t p = positions[n], r = rope_positions[n];
        int64_t slot = (int64_t)tables[n * table_stride + p / block_size] * block_size + p % block_size;
        const uint16_t *row = qkv + n * width;
        table_row(cos, r, rotary_dim, tables_f32, cos_p);
        table_row(sin, r, rotary_dim, tables_f32, sin_p);
        for (int64_t j = 0; j < heads + kv_heads; j++) {
            widen_bf16(row + j * d, source, d);
            if (norm_weight != NULL) widen_bf16(norm_weight + j * d, norm, d);
            rotate_head(source, norm_weight == NULL ? NULL : norm, unit_offset ? 1.0f : 0.0f, cos_p, sin_p, d,
                        rotary_dim, eps, target);
            narrow_to_bf16(target, j < heads ? q_out + (n * heads + j) * d
                                             : keys + ((j - heads) * blocks * block_size + slot) * d, d);
        }
        for (int64_t h = 0; h < kv_heads; h++)
            memcpy(values + (h * blocks * block_size + slot) * d, row + (heads + kv_heads + h) * d,
                   sizeof(uint16_t) * d);
    }
    return 0;
}
