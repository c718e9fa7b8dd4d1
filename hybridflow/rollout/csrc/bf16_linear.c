/* y[M, N] = x[M, K] W[N, K]^T (+ b) in bf16 at decode row counts (issue 56), fp32 sums, AVX-512-BF16 only.
 *
 * Built at first use by hybridflow/rollout/cpu_kernels.py, loaded with ctypes (hybridflow/rollout/bf16_linear.py).
 * Why: at 16-64 rows oneDNN's packed bf16 matmul streams weights at ~5 GB/s (docs/benchmarks.md), several times
 * under what the machine reads and computes. Here each weight panel is read once per call for all rows.
 *
 * Weight layout (packed once by bf16_linear.py after every weight change): panels of PANEL = 48 output columns,
 * each [K2][PANEL][2] bf16 with K2 = ceil(K / 2): the pair (W[n, 2i], W[n, 2i + 1]) is one 32-bit lane, so one
 * vdpbf16ps multiplies sixteen columns' pairs by one row's x pair (broadcast) and adds both products to fp32 sums.
 * Columns past N and the k past an odd K are zeros. A task is one panel: its TILE_ROWS x 3 zmm sums stay in
 * registers over all of K for each block of rows. Threads split the panels (OpenMP, torch's thread count).
 *
 * Outside AVX-512-BF16 builds the functions exist and refuse (bf16_linear_supported() == 0): the caller then keeps
 * oneDNN / F.linear. Summation order: pairs in k order per lane, each pair as the hardware's vdpbf16ps sums it.
 */
#include <stdint.h>
#include <string.h>

#define PANEL 48     /* output columns of one panel: three zmm of sixteen fp32 sums */
#define TILE_ROWS 8  /* rows whose sums are held together: 8 x 3 = 24 zmm accumulators */

int bf16_linear_supported(void);
int bf16_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads);

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

int bf16_linear_supported(void) { return 1; }

static inline __m512 bias_columns(const float *bias, int64_t c, __mmask16 mask) {
    return bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
}

static inline __mmask16 column_mask(int64_t c, int64_t n) {
    int64_t left = n - c;
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* Sums of `count` rows (a compile-time constant after inlining) against one panel, stored to y[:, c0:c0 + 48). */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, int64_t x_stride, int count,
                                                       const uint16_t *panel, int64_t k, int64_t c0, int64_t n,
                                                       const float *bias, void *y, int64_t y_stride, int out_fp32) {
    __m512 acc[TILE_ROWS][3];
    for (int r = 0; r < count; r++)
        acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
    int64_t pairs = k / 2;
    for (int64_t i = 0; i < pairs; i++) {
        const uint16_t *w = panel + i * (2 * PANEL);
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + 32);
        __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64);
        for (int r = 0; r < count; r++) {
            int32_t pair;
            memcpy(&pair, x + r * x_stride + 2 * i, sizeof pair);
            __m512bh xr = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xr, w2);
        }
    }
    if (k & 1) {  /* the last k alone: its pair's high half is zero in x (and in the packed weight) */
        const uint16_t *w = panel + pairs * (2 * PANEL);
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + 32);
        __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64);
        for (int r = 0; r < count; r++) {
            __m512bh xr = (__m512bh)_mm512_set1_epi32((int32_t)x[r * x_stride + k - 1]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xr, w2);
        }
    }
    for (int j = 0; j < 3; j++) {
        int64_t c = c0 + 16 * j;
        __mmask16 mask = column_mask(c, n);
        if (!mask)
            break;
        __m512 b = bias_columns(bias, c, mask);
        for (int r = 0; r < count; r++) {
            __m512 v = _mm512_add_ps(acc[r][j], b);
            if (out_fp32)
                _mm512_mask_storeu_ps((float *)y + r * y_stride + c, mask, v);
            else  /* round to nearest even, once */
                _mm256_mask_storeu_epi16((uint16_t *)y + r * y_stride + c, mask, (__m256i)_mm512_cvtneps_pbh(v));
        }
    }
}

/* Every row of x against panel p (rows in blocks of TILE_ROWS; the last block's size picks a specialised tile). */
static void panel_rows(const uint16_t *x, int64_t rows, int64_t k, int64_t x_stride, const uint16_t *panel,
                       int64_t c0, int64_t n, const float *bias, void *y, int64_t y_stride, int out_fp32) {
    int64_t elem = out_fp32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const uint16_t *xr = x + r0 * x_stride;
        void *yr = (char *)y + r0 * y_stride * elem;
        switch (rows - r0 < TILE_ROWS ? (int)(rows - r0) : TILE_ROWS) {
#define TILE_CASE(R) case R: tile(xr, x_stride, R, panel, k, c0, n, bias, yr, y_stride, out_fp32); break;
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
#undef TILE_CASE
        }
    }
}

int bf16_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads) {
    if (rows < 0 || k <= 0 || n <= 0 || x_stride < k || y_stride < n)
        return -1;
    int64_t panels = (n + PANEL - 1) / PANEL, panel_size = (k + 1) / 2 * 2 * PANEL;
    if (threads > panels)
        threads = (int)panels;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t p = 0; p < panels; p++)
        panel_rows((const uint16_t *)x, rows, k, x_stride, (const uint16_t *)packed + p * panel_size, p * PANEL, n,
                   bias, y, y_stride, out_fp32);
    return 0;
}

#else  /* no AVX-512-BF16 in this build: the caller keeps oneDNN / F.linear */

int bf16_linear_supported(void) { return 0; }

int bf16_linear(const void *x, int64_t rows, int64_t k, int64_t x_stride, const void *packed, int64_t n,
                const float *bias, void *y, int64_t y_stride, int out_fp32, int threads) {
    (void)x, (void)rows, (void)k, (void)x_stride, (void)packed, (void)n, (void)bias, (void)y, (void)y_stride;
    (void)out_fp32, (void)threads;
    return -1;
}

#endif
