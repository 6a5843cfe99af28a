/* The small ops of a decode or verification pass, in C (paradec.models.native).

A torch pass of SmolLM2 spends more time in ~45 small ops a layer (norms, RoPE, the KV writes,
the attention, residual adds, SiLU) than in its linears: each op is a few microseconds of
dispatch for little arithmetic. Here they are three calls a layer, between the linears (torch's
kernels, or for quantized layers native_mm.c's), or steps of one call a pass (native_layers.c):
each splits its work over the threads of the OpenMP region it runs in (``omp for``).

Every result for a token is computed by the same sequence of operations whatever the pass's
shape (how many tokens, rows, visible keys), so an `ar` step and a verified tree agree bit for
bit: the attention sums its visible keys in slot order, one query at a time, and nothing is
reassociated (built without -ffast-math and without FMA contraction). Tensors are bf16 (dt = 1)
or fp32 (dt = 0), computed in fp32, rounded to the model's dtype where torch's path rounds.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* x [rows, dim] += delta [rows, dim] (rounded; skipped when delta is NULL), then
   out [rows, dim] = w * rms_norm(x): normalized in fp32, rounded, then scaled and rounded
   (out NULL: the add alone). Rows split over the region's threads. */
void pd_norm_rows(void* x, const void* delta, const void* w, void* out, int64_t rows, int64_t dim, float eps, int dt) {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t o = r * dim;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* eight running sums, lane i takes elements i mod 8 */
    for (int64_t i = 0; i < dim; ++i) {
      float v = ld(x, o + i, dt);
      if (delta) {
        v = rnd(v + ld(delta, o + i, dt), dt);
        st(x, o + i, v, dt);
      }
      acc[i & 7] += v * v;
    }
    float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    if (!out) continue;
    for (int64_t i = 0; i < dim; ++i) st(out, o + i, ld(w, i, dt) * rnd(ld(x, o + i, dt) * inv, dt), dt);
  }
}

void pd_add_norm(void* x, const void* delta, const void* w, void* out, int64_t rows, int64_t dim, float eps,
                 int dt) {
  pd_norm_rows(x, delta, w, out, rows, dim, eps, dt); /* outside a region: one thread */
}

#define SILU_CHUNK 256 /* elements of a row a thread takes at a time: a 1-row pass splits too */

/* gu [rows, 2 * inter] (gate | up) -> out [rows, inter] = silu(gate) * up, each rounded. */
void pd_silu_rows(const void* gu, void* out, int64_t rows, int64_t inter, int dt) {
  const int64_t chunks = (inter + SILU_CHUNK - 1) / SILU_CHUNK;
#pragma omp for schedule(static)
  for (int64_t u = 0; u < rows * chunks; ++u) {
    const int64_t r = u / chunks, i0 = (u % chunks) * SILU_CHUNK;
    const int64_t i1 = i0 + SILU_CHUNK < inter ? i0 + SILU_CHUNK : inter;
    for (int64_t i = i0; i < i1; ++i) {
      float g = ld(gu, r * 2 * inter + i, dt);
      float s = rnd(g / (1.0f + expf(-g)), dt);
      st(out, r * inter + i, s * ld(gu, r * 2 * inter + inter + i, dt), dt);
    }
  }
}

void pd_silu_mul(const void* gu, void* out, int64_t rows, int64_t inter, int dt) { pd_silu_rows(gu, out, rows, inter, dt); }

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PD_AVX2 1
#endif

/* 1 where the attention's kernels are vectorized (AVX2 + FMA); elsewhere scalar fmaf loops,
   the same bits but slower than torch's path, which then runs instead. */
int pd_vectorized(void) {
#ifdef PD_AVX2
  return 1;
#else
  return 0;
#endif
}

/* e^x for x <= 0 (a softmax's shifted scores): Cephes' expf polynomial, every step an explicit
   fmaf or product, so the 8-lane version below gives the scalar one's bits. */
static inline float pd_exp(float x) {
  if (x < -87.0f) return 0.0f;
  float n = rintf(x * 1.44269504088896341f);
  float r = fmaf(-n, 0.693359375f, x);
  r = fmaf(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  float y = fmaf(p, r * r, r) + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, 4);
  return y * scale;
}

#ifdef PD_AVX2
static inline __m256 pd_exp8(__m256 x) {
  __m256 dead = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), n), _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), n), _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(dead, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}
#endif

/* scores [rows, end] = q [rows, hd] . keys [hd, end] (row d at kt + d * ks): each score a chain of
   fmaf over d in order, whichever rows and keys share a block. Defined for fp32 and bf16 keys. */
#define PD_SCORES(NAME, T, LOAD8, LD)                                                                      \
  static void NAME(const float* q, int64_t rows, const T* kt, int64_t ks, int64_t hd, int64_t end, float* out) { \
    int64_t r = 0;                                                                                         \
    PD_SCORES_AVX2(T, LOAD8)                                                                               \
    for (; r < rows; ++r)                                                                                  \
      for (int64_t j = 0; j < end; ++j) {                                                                  \
        float a = 0.0f;                                                                                    \
        for (int64_t d = 0; d < hd; ++d) a = fmaf(q[r * hd + d], LD(kt + d * ks + j), a);                  \
        out[r * end + j] = a;                                                                              \
      }                                                                                                    \
  }

#ifdef PD_AVX2
/* Four queries score 16 keys at once (8 chains: an FMA's result feeds the next of its chain 4
   cycles later), prefetching each key row ahead; one query runs d outermost (below). Either way
   each score is the same chain over d, in order, so the bits do not depend on the path. */
#define PD_SCORES_AVX2(T, LOAD8)                                                           \
  for (; r + 4 <= rows; r += 4) {                                                          \
    const float* q0 = q + r * hd;                                                          \
    int64_t j = 0;                                                                         \
    for (; j + 16 <= end; j += 16) {                                                       \
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
      for (int64_t d = 0; d < hd; ++d) {                                                   \
        _mm_prefetch((const char*)(kt + d * ks + j + 64), _MM_HINT_T0); /* rows stride: no hardware prefetch */ \
        __m256 k = LOAD8(kt + d * ks + j), l = LOAD8(kt + d * ks + j + 8);                 \
        __m256 x0 = _mm256_set1_ps(q0[d]), x1 = _mm256_set1_ps(q0[hd + d]);                \
        __m256 x2 = _mm256_set1_ps(q0[2 * hd + d]), x3 = _mm256_set1_ps(q0[3 * hd + d]);   \
        a0 = _mm256_fmadd_ps(x0, k, a0);                                                   \
        a1 = _mm256_fmadd_ps(x1, k, a1);                                                   \
        a2 = _mm256_fmadd_ps(x2, k, a2);                                                   \
        a3 = _mm256_fmadd_ps(x3, k, a3);                                                   \
        b0 = _mm256_fmadd_ps(x0, l, b0);                                                   \
        b1 = _mm256_fmadd_ps(x1, l, b1);                                                   \
        b2 = _mm256_fmadd_ps(x2, l, b2);                                                   \
        b3 = _mm256_fmadd_ps(x3, l, b3);                                                   \
      }                                                                                    \
      _mm256_storeu_ps(out + r * end + j, a0);                                             \
      _mm256_storeu_ps(out + (r + 1) * end + j, a1);                                       \
      _mm256_storeu_ps(out + (r + 2) * end + j, a2);                                       \
      _mm256_storeu_ps(out + (r + 3) * end + j, a3);                                       \
      _mm256_storeu_ps(out + r * end + j + 8, b0);                                         \
      _mm256_storeu_ps(out + (r + 1) * end + j + 8, b1);                                   \
      _mm256_storeu_ps(out + (r + 2) * end + j + 8, b2);                                   \
      _mm256_storeu_ps(out + (r + 3) * end + j + 8, b3);                                   \
    }                                                                                      \
    for (; j + 8 <= end; j += 8) {                                                         \
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                          \
      for (int64_t d = 0; d < hd; ++d) {                                                   \
        __m256 k = LOAD8(kt + d * ks + j);                                                 \
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(q0[d]), k, a0);                                \
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(q0[hd + d]), k, a1);                           \
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(q0[2 * hd + d]), k, a2);                       \
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(q0[3 * hd + d]), k, a3);                       \
      }                                                                                    \
      _mm256_storeu_ps(out + r * end + j, a0);                                             \
      _mm256_storeu_ps(out + (r + 1) * end + j, a1);                                       \
      _mm256_storeu_ps(out + (r + 2) * end + j, a2);                                       \
      _mm256_storeu_ps(out + (r + 3) * end + j, a3);                                       \
    }                                                                                      \
    for (; j < end; ++j)                                                                   \
      for (int64_t x = 0; x < 4; ++x) {                                                    \
        float a = 0.0f;                                                                    \
        for (int64_t d = 0; d < hd; ++d) a = fmaf(q0[x * hd + d], LD_OF(T)(kt + d * ks + j), a); \
        out[(r + x) * end + j] = a;                                                        \
      }                                                                                    \
  }                                                                                        \
  for (; r < rows; ++r) { /* d outermost: each key row streams in order (d innermost, every  \
                            8 keys' FMA waited on a line of another 4-KB-strided row) */   \
    const float* qr = q + r * hd;                                                          \
    float* o = out + r * end;                                                              \
    const int64_t full = end - end % 8;                                                    \
    for (int64_t d = 0; d < hd; ++d) {                                                     \
      const T* kd = kt + d * ks;                                                           \
      __m256 x = _mm256_set1_ps(qr[d]);                                                    \
      if (d == 0)                                                                          \
        for (int64_t j = 0; j < full; j += 8)                                              \
          _mm256_storeu_ps(o + j, _mm256_fmadd_ps(x, LOAD8(kd + j), _mm256_setzero_ps())); \
      else                                                                                 \
        for (int64_t j = 0; j < full; j += 8)                                              \
          _mm256_storeu_ps(o + j, _mm256_fmadd_ps(x, LOAD8(kd + j), _mm256_loadu_ps(o + j))); \
    }                                                                                      \
    for (int64_t j = full; j < end; ++j) {                                                 \
      float a = 0.0f;                                                                      \
      for (int64_t d = 0; d < hd; ++d) a = fmaf(qr[d], LD_OF(T)(kt + d * ks + j), a);      \
      o[j] = a;                                                                            \
    }                                                                                      \
  }
static inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
#else
#define PD_SCORES_AVX2(T, LOAD8)
#endif
static inline float ld_f32(const float* p) { return *p; }
static inline float ld_bf16(const uint16_t* p) { return from_bf16(*p); }
#define LD_OF(T) LD_OF_##T
#define LD_OF_float ld_f32
#define LD_OF_uint16_t ld_bf16
PD_SCORES(pd_scores_f32, float, load8_f32, ld_f32)
PD_SCORES(pd_scores_bf16, uint16_t, load8_bf16, ld_bf16)

/* e [count] = exp(x - top) for x [count]; returns their sum, eight running sums by index mod 8. */
static float pd_softmax_weights(float* x, int64_t count, float top) {
  int64_t c = 0;
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef PD_AVX2
  __m256 sum = _mm256_setzero_ps();
  for (; c + 8 <= count; c += 8) {
    __m256 e = pd_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), _mm256_set1_ps(top)));
    _mm256_storeu_ps(x + c, e);
    sum = _mm256_add_ps(sum, e);
  }
  _mm256_storeu_ps(part, sum);
#endif
  for (; c < count; ++c) {
    x[c] = pd_exp(x[c] - top);
    part[c & 7] += x[c];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* acc [hd] = sum over c of e[c] * v[seen[c], :] (row j at v + j * hd), in c's order for every
   element. Defined for fp32 and bf16 values. */
#ifdef PD_AVX2
/* N * 8 elements at a time, N chains (64 where the head has them, then 32): with 4 chains, each
   waits on its last FMA and the units run at half their rate. The loops over k unroll at -O3. */
#define PD_WV_BLOCK(LOAD8, N)                                                         \
  for (; d0 + 8 * (N) <= hd; d0 += 8 * (N)) {                                         \
    __m256 a[N];                                                                      \
    for (int k = 0; k < (N); ++k) a[k] = _mm256_setzero_ps();                         \
    for (int64_t c = 0; c < count; ++c) {                                             \
      const __typeof__(v) vj = v + PD_SLOT(c) * hd + d0;                              \
      __m256 w = _mm256_set1_ps(e[c]);                                                \
      for (int k = 0; k < (N); ++k) a[k] = _mm256_fmadd_ps(w, LOAD8(vj + 8 * k), a[k]); \
    }                                                                                 \
    for (int k = 0; k < (N); ++k) _mm256_storeu_ps(acc + d0 + 8 * k, a[k]);           \
  }
#define PD_WV_AVX2(LOAD8) PD_WV_BLOCK(LOAD8, 8) PD_WV_BLOCK(LOAD8, 4)
#else
#define PD_WV_AVX2(LOAD8)
#endif
/* the c-th visible slot: seen[c], or c where every slot is visible (seen NULL) */
#define PD_SLOT(c) (seen ? seen[c] : (c))
#define PD_WV(NAME, T, LOAD8, LD)                                                                          \
  static void NAME(const float* e, const int64_t* seen, int64_t count, const T* v, int64_t hd, float* acc) { \
    int64_t d0 = 0;                                                                                        \
    PD_WV_AVX2(LOAD8)                                                                                      \
    for (; d0 < hd; ++d0) {                                                                                \
      float a = 0.0f;                                                                                      \
      for (int64_t c = 0; c < count; ++c) a = fmaf(e[c], LD(v + PD_SLOT(c) * hd + d0), a);                 \
      acc[d0] = a;                                                                                         \
    }                                                                                                      \
  }
PD_WV(pd_values_f32, float, load8_f32, ld_f32)
PD_WV(pd_values_bf16, uint16_t, load8_bf16, ld_bf16)

/* e [count] = x [count] * scale -> their largest. */
static float pd_scale_max(const float* x, int64_t count, float scale, float* e) {
  int64_t c = 0;
  float top = -INFINITY;
#ifdef PD_AVX2
  __m256 s8 = _mm256_set1_ps(scale), t8 = _mm256_set1_ps(-INFINITY);
  for (; c + 8 <= count; c += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + c), s8);
    _mm256_storeu_ps(e + c, v);
    t8 = _mm256_max_ps(t8, v);
  }
  float part[8];
  _mm256_storeu_ps(part, t8);
  for (int k = 0; k < 8; ++k) top = part[k] > top ? part[k] : top;
#endif
  for (; c < count; ++c) {
    e[c] = x[c] * scale;
    top = e[c] > top ? e[c] : top;
  }
  return top;
}

#define PD_CHUNK 4 /* tokens a unit of the attention takes: one head's queries for them score in one blocked call */

/* RoPE, and the K/V writes, for a pass of n tokens in each of b rows (the tokens split over the
   region's threads): qkv [b, n, (heads + 2 kvh) * hd], the tokens' projections; cos, sin
   [b, n, hd]: RoPE tables, sin's first half negated (x * cos + roll(x, hd / 2) * sin). Keys go to
   kc (row r at kc + r * k_row: [kvh, hd, max_len], transposed) and values to vc (row r at
   vc + r * v_row: [kvh, max_len, hd]) at slot idx[r, i] [b, n]; the rotated queries to
   q [b, n, heads, hd] fp32. */
void pd_rope_rows(const void* qkv, const void* cos, const void* sin, void* kc, int64_t k_row, void* vc, int64_t v_row,
                  const int64_t* idx, float* q, int64_t b, int64_t n, int64_t heads, int64_t kvh, int64_t hd,
                  int64_t max_len, int dt) {
  const int64_t width = (heads + 2 * kvh) * hd, half = hd / 2, es = dt ? 2 : 4;
#pragma omp for schedule(static)
  for (int64_t t = 0; t < b * n; ++t) {
    const int64_t r = t / n, slot = idx[t];
    char* kr = (char*)kc + r * k_row * es;
    char* vr = (char*)vc + r * v_row * es;
    for (int64_t h = 0; h < heads + kvh; ++h) {
      int64_t base = t * width + h * hd;
      for (int64_t d = 0; d < hd; ++d) {
        float c = ld(cos, t * hd + d, dt), sn = ld(sin, t * hd + d, dt);
        float x = ld(qkv, base + d, dt), y = ld(qkv, base + (d + half) % hd, dt);
        float rot = rnd(rnd(x * c, dt) + rnd(y * sn, dt), dt);
        if (h < heads)
          q[(t * heads + h) * hd + d] = rot;
        else
          st(kr, ((h - heads) * hd + d) * max_len + slot, rot, dt);
      }
    }
    for (int64_t g = 0; g < kvh; ++g)
      for (int64_t d = 0; d < hd; ++d)
        st(vr, (g * max_len + slot) * hd + d, ld(qkv, t * width + (heads + kvh + g) * hd + d, dt), dt);
  }
}

/* What one thread's attention units need, for passes of n tokens a row over up to ``end`` slots:
   a unit's queries, their scores, one head's weights and the visible slots' indices. */
typedef struct {
  float *qg, *s, *e;
  int64_t* seen;
} pd_scratch;

void* pd_attend_scratch(int64_t n, int64_t hd, int64_t end) {
  const int64_t chunk = n < PD_CHUNK ? n : PD_CHUNK;
  const int64_t floats = chunk * hd + chunk * end + end;
  pd_scratch* sc = malloc(sizeof(pd_scratch) + sizeof(float) * (size_t)floats + sizeof(int64_t) * (size_t)end);
  if (!sc) return NULL;
  sc->seen = (int64_t*)(sc + 1);
  sc->qg = (float*)(sc->seen + end);
  sc->s = sc->qg + chunk * hd;
  sc->e = sc->s + chunk * end;
  return sc;
}

/* Each query attends over the slots [0, end) its mask row shows (mask [b, n, mask_span] bytes,
   NULL: all of them) -> out [b, n, heads * hd]; q and the caches as ``pd_rope_rows`` left them.
   The (row, head, PD_CHUNK tokens) units split over the region's threads (``scratch``: the
   calling thread's ``pd_attend_scratch``): a unit's result does not depend on which thread, or
   which other units, there are. (Units of a KV group's heads together read its keys once, but
   at one token a row there are 3 of them for 2 threads: a head a unit runs a 1-token pass of
   SmolLM2 ~3 % faster.) */
void pd_attend_units(const float* q, const void* kc, int64_t k_row, const void* vc, int64_t v_row,
                     const uint8_t* mask, int64_t mask_span, void* out, int64_t b, int64_t n, int64_t heads, int64_t kvh,
                     int64_t hd, int64_t max_len, int64_t end, int dt, void* scratch) {
  const int64_t rep = heads / kvh, es = dt ? 2 : 4;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t chunks = (n + PD_CHUNK - 1) / PD_CHUNK, units = b * heads * chunks;
  pd_scratch* sc = scratch;
  float *qg = sc->qg, *s = sc->s, *e = sc->e;
  int64_t* seen = sc->seen;
  float acc[512];
#pragma omp for schedule(static)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t r = u / (heads * chunks), h = (u / chunks) % heads, g = h / rep, i0 = (u % chunks) * PD_CHUNK;
    const int64_t i1 = i0 + PD_CHUNK < n ? i0 + PD_CHUNK : n;
    const char* kg = (const char*)kc + r * k_row * es + g * hd * max_len * es; /* [hd, max_len] */
    const char* vg = (const char*)vc + r * v_row * es + g * max_len * hd * es; /* [max_len, hd] */
    for (int64_t i = i0; i < i1; ++i) /* the head's queries, token i at (i - i0) * hd */
      memcpy(qg + (i - i0) * hd, q + ((r * n + i) * heads + h) * hd, sizeof(float) * (size_t)hd);
    if (dt)
      pd_scores_bf16(qg, i1 - i0, (const uint16_t*)kg, max_len, hd, end, s);
    else
      pd_scores_f32(qg, i1 - i0, (const float*)kg, max_len, hd, end, s);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = r * n + i;
      const uint8_t* m = mask ? mask + t * mask_span : NULL;
      const float* sh = s + (i - i0) * end;
      int64_t count = 0;
      float top = -INFINITY;
      if (m) {
        for (int64_t j = 0; j < end; ++j)
          if (j < mask_span && m[j]) seen[count++] = j;
        for (int64_t c = 0; c < count; ++c) {
          e[c] = sh[seen[c]] * scale;
          top = e[c] > top ? e[c] : top;
        }
      } else { /* every slot visible (an `ar` step): the same products, and the max is exact in any order */
        count = end;
        top = pd_scale_max(sh, end, scale, e);
      }
      const int64_t* at = m ? seen : NULL;
      float total = pd_softmax_weights(e, count, top);
      if (dt)
        pd_values_bf16(e, at, count, (const uint16_t*)vg, hd, acc);
      else
        pd_values_f32(e, at, count, (const float*)vg, hd, acc);
      int64_t o = t * heads * hd + h * hd;
      for (int64_t d = 0; d < hd; ++d) st(out, o + d, acc[d] / total, dt);
    }
  }
}

/* One layer's attention for a pass of n tokens in each of b rows: ``pd_rope_rows`` then
   ``pd_attend_units``, on ``threads`` OpenMP threads. */
void pd_attend(const void* qkv, const void* cos, const void* sin, void* kc, int64_t k_row, void* vc, int64_t v_row,
               const int64_t* idx, const uint8_t* mask, int64_t mask_span, void* out, int64_t b, int64_t n,
               int64_t heads, int64_t kvh, int64_t hd, int64_t max_len, int64_t end, int dt, int threads) {
  float* q = malloc(sizeof(float) * (size_t)(b * n * heads * hd)); /* the rotated queries [b, n, heads, hd] */
#pragma omp parallel num_threads(threads)
  {
    pd_rope_rows(qkv, cos, sin, kc, k_row, vc, v_row, idx, q, b, n, heads, kvh, hd, max_len, dt);
    void* scratch = pd_attend_scratch(n, hd, end);
    pd_attend_units(q, kc, k_row, vc, v_row, mask, mask_span, out, b, n, heads, kvh, hd, max_len, end, dt, scratch);
    free(scratch);
  }
  free(q);
}
