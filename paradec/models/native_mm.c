/* The quantized linears of a decode or verification pass, in C (paradec.models.native).

torch's int4 CPU kernel takes bf16 activations and spends most of its time decoding 4-bit weights
to floats; at 8 rows it costs 3.5x one row (2 cores of an AVX2 EPYC). Here, as in llama.cpp's
Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products, each row of activations is quantized to int8 in
blocks of 32 (one fp32 scale a block), and a block's dot product is exact integer arithmetic
(vpmaddubsw + vpmaddwd), scaled into an fp32 sum:

  int4 (w = d q + m, q in 0..15):  y = sum_b d_b dx_b (q_b . qx_b) + m_b sx_b,  sx_b = dx_b sum(qx_b)
  int8 (w = s q, q in -127..127):  y = s sum_b dx_b (q_b . qx_b)

Every output element is the same sequence of fp32 operations whatever the row count, the tile it
falls in or the thread that computes it: blocks are summed in order into 8 lanes, the lanes
reduced in one fixed tree. So a row's result never depends on the pass's shape, and an `ar` step
and a verified tree agree bit for bit. Built with the small ops (-O3 -march=native
-ffp-contract=off), with OpenMP where the compiler has it (the process's own runtime: torch's).
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define QB 32 /* activations and int4 weights: one scale per block of 32 along the input */
#define NCHUNK 16 /* output columns a thread takes at a time */

/* x [rows, k] (bf16 if dt, else fp32) -> qx [rows, k] int8, dx [rows, k / 32] (the blocks'
   scales: max |x| / 127) and sx [rows, k / 32] (dx * the sum of the block's qx). Rounded to nearest
   even; the same bits as the scalar loop (max, one product, one conversion). */
static void quantize_rows(const void* x, int64_t rows, int64_t k, int dt, int8_t* qx, float* dx, float* sx) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < k / QB; ++b) {
      int64_t o = r * k + b * QB;
      __m256 v[4];
      for (int i = 0; i < 4; ++i) {
        if (dt) {
          __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)x + o + 8 * i));
          v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        } else {
          v[i] = _mm256_loadu_ps((const float*)x + o + 8 * i);
        }
      }
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      float amax = _mm_cvtss_f32(h);
      float d = amax / 127.0f, inv = d > 0.0f ? 127.0f / amax : 0.0f;
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
      __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      /* |x * inv| <= 127: no clamping; pack 32 int32 to 32 int8 in order */
      __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
      __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i*)(qx + o), p8);
      dx[r * (k / QB) + b] = d;
      sx[r * (k / QB) + b] = d * (float)_mm_cvtsi128_si32(s4);
    }
}

static inline float hsum8(__m256 a) { /* one fixed reduction tree */
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

/* The 32 4-bit weights of one block, 16 bytes (byte j: weight j low, weight j + 16 high), as
   32 unsigned bytes in order. */
static inline __m256i q4_block(const uint8_t* p) {
  __m128i b = _mm_loadu_si128((const __m128i*)p);
  __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* sum_b a[b] * c[b] over n values: 8 lanes (b mod 8) in order, then the tail in order. */
static inline float dot_blocks(const float* a, const float* c, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= n; b += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + b), _mm256_loadu_ps(c + b), acc);
  float s = hsum8(acc);
  for (; b < n; ++b) s = fmaf(a[b], c[b], s);
  return s;
}

/* int4: y[r, n + c] for the MB rows at qx and the NB columns from n; every (r, c) its own chain:
   acc += float(q . qx) * dx * d, block by block, then + sum_b m_b sx_b. */
static inline __attribute__((always_inline)) void q4_tile(const int8_t* qx, const float* dx, const float* sx,
                                                          int64_t k, const uint8_t* q, const float* d,
                                                          const float* m, int64_t n, void* y, int64_t ny, int dt,
                                                          const int MB, const int NB) {
  const int64_t nb = k / QB;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4][4];
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < NB; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[4];
    __m256 wd[4];
    for (int c = 0; c < NB; ++c) {
      w[c] = q4_block(q + (n + c) * (k / 2) + b * (QB / 2));
      wd[c] = _mm256_set1_ps(d[(n + c) * nb + b]);
    }
    for (int r = 0; r < MB; ++r) {
      __m256i xv = _mm256_loadu_si256((const __m256i*)(qx + r * k + b * QB));
      __m256 xd = _mm256_set1_ps(dx[r * nb + b]);
      for (int c = 0; c < NB; ++c) {
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[c], xv), ones);
        acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), xd), wd[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < NB; ++c)
      st(y, r * ny + n + c, hsum8(acc[r][c]) + dot_blocks(m + (n + c) * nb, sx + r * nb, nb), dt);
}

/* int8: as q4_tile, the weights signed bytes [n, k] with one scale a column. */
static inline __attribute__((always_inline)) void q8_tile(const int8_t* qx, const float* dx, int64_t k,
                                                          const int8_t* q, const float* scale, int64_t n, void* y,
                                                          int64_t ny, int dt, const int MB, const int NB) {
  const int64_t nb = k / QB;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4][4];
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < NB; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[4];
    for (int c = 0; c < NB; ++c) w[c] = _mm256_loadu_si256((const __m256i*)(q + (n + c) * k + b * QB));
    for (int r = 0; r < MB; ++r) {
      __m256i xv = _mm256_loadu_si256((const __m256i*)(qx + r * k + b * QB));
      __m256i ax = _mm256_sign_epi8(xv, xv); /* |x|: unsigned for vpmaddubsw, the sign moved to w */
      __m256 xd = _mm256_set1_ps(dx[r * nb + b]);
      for (int c = 0; c < NB; ++c) {
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w[c], xv)), ones);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), xd, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < NB; ++c) st(y, r * ny + n + c, scale[n + c] * hsum8(acc[r][c]), dt);
}

/* Tiles of up to 4 rows x (16 / rows, at most 4) columns over columns [n0, n1). */
#define OVER_ROWS(TILE, ...)                                                                \
  for (int64_t r = 0; r < rows; r += 4) {                                                   \
    int64_t left = rows - r, n = n0;                                                        \
    if (left >= 4) {                                                                        \
      for (; n + 2 <= n1; n += 2) TILE(r, n, 4, 2, __VA_ARGS__);                            \
      for (; n < n1; ++n) TILE(r, n, 4, 1, __VA_ARGS__);                                    \
    } else if (left == 3) {                                                                 \
      for (; n + 2 <= n1; n += 2) TILE(r, n, 3, 2, __VA_ARGS__);                            \
      for (; n < n1; ++n) TILE(r, n, 3, 1, __VA_ARGS__);                                    \
    } else if (left == 2) {                                                                 \
      for (; n + 4 <= n1; n += 4) TILE(r, n, 2, 4, __VA_ARGS__);                            \
      for (; n < n1; ++n) TILE(r, n, 2, 1, __VA_ARGS__);                                    \
    } else {                                                                                \
      for (; n + 4 <= n1; n += 4) TILE(r, n, 1, 4, __VA_ARGS__);                            \
      for (; n < n1; ++n) TILE(r, n, 1, 1, __VA_ARGS__);                                    \
    }                                                                                       \
  }

/* y's columns in chunks of NCHUNK over the region's threads, each chunk OVER_ROWS. */
#define OVER_COLUMNS(TILE)                                                      \
  const int64_t es = dt ? 2 : 4, chunks = (cols + NCHUNK - 1) / NCHUNK;         \
  _Pragma("omp for schedule(static)")                                           \
  for (int64_t ch = 0; ch < chunks; ++ch) {                                     \
    int64_t n0 = ch * NCHUNK, n1 = n0 + NCHUNK < cols ? n0 + NCHUNK : cols;     \
    OVER_ROWS(TILE)                                                             \
  }

#define Q4(r, n, MB, NB, ...) \
  q4_tile(qx + (r) * k, dx + (r) * (k / QB), sx + (r) * (k / QB), k, q, d, m, n, (char*)y + (r) * cols * es, cols, dt, MB, NB)
#define Q8(r, n, MB, NB, ...) \
  q8_tile(qx + (r) * k, dx + (r) * (k / QB), k, q, scale, n, (char*)y + (r) * cols * es, cols, dt, MB, NB)

/* y [rows, cols] = the int8 rows qx (scales dx, sums sx) @ w.T for int4 w = d q + m. */
static void q4_columns(const int8_t* qx, const float* dx, const float* sx, int64_t rows, int64_t k, const uint8_t* q,
                       const float* d, const float* m, void* y, int64_t cols, int dt) {
  OVER_COLUMNS(Q4)
}

/* y [rows, cols] = the int8 rows qx (scales dx) @ w.T for int8 w = scale q. */
static void q8_columns(const int8_t* qx, const float* dx, int64_t rows, int64_t k, const int8_t* q, const float* scale,
                       void* y, int64_t cols, int dt) {
  OVER_COLUMNS(Q8)
}

/* The int8 form of rows x k activations in ``scratch``: qx [rows, k], then dx and sx [rows, k / 32]
   64-byte aligned. */
int64_t pd_linear_scratch(int64_t rows, int64_t k) { return rows * k + 2 * rows * (k / QB) * (int64_t)sizeof(float) + 64; }

static void split_scratch(void* scratch, int64_t rows, int64_t k, int8_t** qx, float** dx, float** sx) {
  int64_t blocks = rows * (k / QB);
  *dx = (float*)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  *sx = *dx + blocks;
  *qx = (int8_t*)(*sx + blocks);
}

/* The activations' int8 form, per calling thread, grown as needed (ctypes calls run without the GIL). */
static __thread void* own_scratch = NULL;
static __thread int64_t own_bytes = 0;

static int quantized_input(const void* x, int64_t rows, int64_t k, int dt, int8_t** qx, float** dx, float** sx) {
  int64_t need = pd_linear_scratch(rows, k);
  if (need > own_bytes) {
    free(own_scratch);
    own_scratch = malloc((size_t)need);
    own_bytes = own_scratch ? need : 0;
    if (!own_scratch) return 0;
  }
  split_scratch(own_scratch, rows, k, qx, dx, sx);
  quantize_rows(x, rows, k, dt, *qx, *dx, *sx);
  return 1;
}

/* y [rows, cols] = x [rows, k] @ w.T for int4 w = d q + m: q [cols, k / 2] (see q4_block), d and m
   [cols, k / 32] fp32; x and y bf16 if dt, else fp32. Returns 0 if out of memory. */
int pd_q4_linear(const void* x, int64_t rows, int64_t k, const uint8_t* q, const float* d, const float* m, void* y,
                 int64_t cols, int dt, int threads) {
  int8_t* qx;
  float *dx, *sx;
  if (!quantized_input(x, rows, k, dt, &qx, &dx, &sx)) return 0;
#pragma omp parallel num_threads(threads)
  q4_columns(qx, dx, sx, rows, k, q, d, m, y, cols, dt);
  return 1;
}

/* y [rows, cols] = x [rows, k] @ w.T for int8 w = scale q: q [cols, k], scale [cols] fp32. */
int pd_q8_linear(const void* x, int64_t rows, int64_t k, const int8_t* q, const float* scale, void* y, int64_t cols,
                 int dt, int threads) {
  int8_t* qx;
  float *dx, *sx;
  if (!quantized_input(x, rows, k, dt, &qx, &dx, &sx)) return 0;
#pragma omp parallel num_threads(threads)
  q8_columns(qx, dx, rows, k, q, scale, y, cols, dt);
  return 1;
}

/* y [rows, n_out] = x [rows, n_in] @ w.T (+ bias, rounded as torch's add), the rows quantized
   into ``scratch`` (``pd_linear_scratch``), every step split over the region's threads: the
   same bits as ``pd_q4_linear`` / ``pd_q8_linear`` and torch's ``y + bias``. */
void pd_linear_rows(const pd_linear* w, const void* x, int64_t rows, void* y, int dt, void* scratch) {
  const int64_t k = w->n_in, cols = w->n_out, es = dt ? 2 : 4;
  int8_t* qx;
  float *dx, *sx;
  split_scratch(scratch, rows, k, &qx, &dx, &sx);
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    quantize_rows((const char*)x + r * k * es, 1, k, dt, qx + r * k, dx + r * (k / QB), sx + r * (k / QB));
  if (w->kind == 4)
    q4_columns(qx, dx, sx, rows, k, (const uint8_t*)w->q, w->d, w->m, y, cols, dt);
  else
    q8_columns(qx, dx, rows, k, (const int8_t*)w->q, w->d, y, cols, dt);
  if (w->bias) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) st(y, r * cols + c, ld(y, r * cols + c, dt) + ld(w->bias, c, dt), dt);
  }
}

int pd_quantized(void) { return 1; }
#else
int pd_quantized(void) { return 0; } /* the small ops' library runs only where this is 1 */
#endif
