/* y[M, N] = x[M, K] W[N, K]^T (+ b) in fp32 at decode row counts (issue 56), AVX-512F only: the fp32 twin of
 * bf16_linear.c (same panels, tiling and threading; read that file first).
 *
 * Why: at 16 rows oneDNN's packed fp32 matmul reads SmolLM2-135M's weights at ~12 GB/s (docs/benchmarks.md), about
 * half what the machine streams. Weight layout (packed once by bf16_linear.pack(..., torch.float32)): panels of
 * PANEL = 48 output columns, each [K][PANEL] fp32, zeros past N. Per k, one _mm512_fmadd_ps per 16 columns with the
 * row's x[k] broadcast: each column's sum runs in k order, one rounding per fused multiply-add.
 *
 * Outside AVX-512F builds (an AVX2 machine: 16 ymm registers cannot hold this tile) the functions exist and refuse
 * (fp32_linear_supported() == 0): the caller then keeps oneDNN / F.linear.
 */
#include <stdint.h>

#define PANEL 48     /* output columns of one panel: three zmm of sixteen fp32 sums */
#define TILE_ROWS 8  /* rows whose sums are held together: 8 x 3 = 24 zmm accumulators */

int fp32_linear_supported(void);
int fp32_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads);

#if defined(__AVX512F__)
#include <immintrin.h>

int fp32_linear_supported(void) { return 1; }

/* Sums of `count` rows (a compile-time constant after inlining) against one panel, stored to y[:, c0:c0 + 48). */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t x_stride, int count,
                                                       const float *panel, int64_t k, int64_t c0, int64_t n,
                                                       const float *bias, float *y, int64_t y_stride) {
    __m512 acc[TILE_ROWS][3];
    for (int r = 0; r < count; r++)
        acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        const float *w = panel + i * PANEL;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
        for (int r = 0; r < count; r++) {
            __m512 xr = _mm512_set1_ps(x[r * x_stride + i]);
            acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(xr, w2, acc[r][2]);
        }
    }
    for (int j = 0; j < 3; j++) {
        int64_t c = c0 + 16 * j, left = n - c;
        if (left <= 0)
            break;
        __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
        for (int r = 0; r < count; r++)
            _mm512_mask_storeu_ps(y + r * y_stride + c, mask, _mm512_add_ps(acc[r][j], b));
    }
}

/* Every row of x against one panel (rows in blocks of TILE_ROWS; the last block's size picks a specialised tile). */
static void panel_rows(const float *x, int64_t rows, int64_t k, int64_t x_stride, const float *panel, int64_t c0,
                       int64_t n, const float *bias, float *y, int64_t y_stride) {
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const float *xr = x + r0 * x_stride;
        float *yr = y + r0 * y_stride;
        switch (rows - r0 < TILE_ROWS ? (int)(rows - r0) : TILE_ROWS) {
#define TILE_CASE(R) case R: tile(xr, x_stride, R, panel, k, c0, n, bias, yr, y_stride); break;
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
#undef TILE_CASE
        }
    }
}

/* Same arguments as bf16_linear (x, packed and y fp32; out_fp32 must be 1). */
int fp32_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads) {
    if (rows < 0 || k <= 0 || n <= 0 || x_stride < k || y_stride < n || !out_fp32)
        return -1;
    int64_t panels = (n + PANEL - 1) / PANEL;
    if (threads > panels)
        threads = (int)panels;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t p = 0; p < panels; p++)
        panel_rows((const float *)x, rows, k, x_stride, (const float *)packed + p * k * PANEL, p * PANEL, n, bias,
                   (float *)y, y_stride);
    return 0;
}

#else  /* no AVX-512F in this build: the caller keeps oneDNN / F.linear */

int fp32_linear_supported(void) { return 0; }

int fp32_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads) {
    (void)x, (void)rows, (void)k, (void)x_stride, (void)packed, (void)n, (void)bias, (void)y, (void)y_stride;
    (void)out_fp32, (void)threads;
    return -1;
}

#endif
