/* exp for the kernels of this directory, written so that the loops calling it vectorise (no libm call).
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

#endif
