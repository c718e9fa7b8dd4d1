/* exp for the kernels of this directory, written so that the loops calling it vectorise (no libm call), and the
 * bf16 <-> fp32 conversions of their bf16 twins.
 *
 * Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial in r, times 2^n, branch-free; within
 * 2 ulp of expf over the range it is used on.
 */
#ifndef HYBRIDFLOW_VECTOR_MATH_H
#define HYBRIDFLOW_VECTOR_MATH_H

#include <stdint.h>

/* exp(x) for x in [-87, 88] (inputs are clamped there: below, the result is ~1e-38 rather than 0). */
static inline float exp_clamped(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* bf16 <-> fp32 (the bf16 kernels compute in fp32 and round once on the way out). A bf16 is the top 16 bits of an
 * fp32; the narrowing rounds to nearest even as torch's does, and keeps a NaN a (quiet) NaN. */
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t i; float f; } bits;
    bits.i = (uint32_t)x << 16;
    return bits.f;
}

static inline uint16_t f32_to_bf16(float x) {
    union { float f; uint32_t i; } bits;
    bits.f = x;
    if ((bits.i & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits.i >> 16) | 0x40u);
    return (uint16_t)((bits.i + 0x7fffu + ((bits.i >> 16) & 1u)) >> 16);
}

static inline void widen_bf16(const uint16_t *source, float *target, int64_t n) {
    for (int64_t i = 0; i < n; i++) target[i] = bf16_to_f32(source[i]);
}

static inline void narrow_to_bf16(const float *source, uint16_t *target, int64_t n) {
    for (int64_t i = 0; i < n; i++) target[i] = f32_to_bf16(source[i]);
}

#endif
