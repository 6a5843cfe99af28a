/* What the decode path's C files share (paradec.models.native): bf16 <-> fp32, loads and stores
of a tensor that is bf16 (dt = 1) or fp32 (dt = 0), and the steps of a layer that a whole pass in
one call (native_layers.c) runs inside one OpenMP region. Each step splits its work with orphaned
`omp for` loops: inside a parallel region the threads share it, outside one thread does it all,
and either way every output element is the same sequence of operations. */
#ifndef PARADEC_NATIVE_H
#define PARADEC_NATIVE_H
#include <stdint.h>
#include <string.h>

static inline float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t to_bf16(float f) { /* round to nearest even, as torch */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float ld(const void* p, int64_t i, int dt) {
  return dt ? from_bf16(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

static inline void st(void* p, int64_t i, float v, int dt) {
  if (dt)
    ((uint16_t*)p)[i] = to_bf16(v);
  else
    ((float*)p)[i] = v;
}

static inline float rnd(float v, int dt) { return dt ? from_bf16(to_bf16(v)) : v; }

/* One quantized linear: kind 4 (int4: w = d q + m in groups of 8 outputs, q [n_out / 8, n_in / 32,
   128] packed, d and m [n_out / 8, n_in / 32, 8] fp32: ``pack_q4``) or 8 (int8: w = d q, q [n_out, n_in] int8, d [n_out] fp32; m NULL);
   bias [n_out] in the activations' dtype, or NULL. */
typedef struct {
  int64_t kind, n_in, n_out;
  const void* q;
  const float* d;
  const float* m;
  const void* bias;
} pd_linear;

/* One decoder layer of a pass in C: its K/V in the caches' layer ``layer``, its norms' weights
   [hidden] in the activations' dtype, its four linears. */
typedef struct {
  int64_t layer;
  const void* attn_norm;
  const void* mlp_norm;
  double eps;
  pd_linear qkv, wo, gate_up, down;
} pd_layer;

/* native.c */
void pd_norm_rows(void* x, const void* delta, const void* w, void* out, int64_t rows, int64_t dim, float eps, int dt);
void pd_silu_rows(const void* gu, void* out, int64_t rows, int64_t inter, int dt);
void pd_rope_rows(const void* qkv, const void* cos, const void* sin, void* kc, int64_t k_row, void* vc, int64_t v_row,
                  const int64_t* idx, float* q, int64_t b, int64_t n, int64_t heads, int64_t kvh, int64_t hd,
                  int64_t max_len, int dt);
void* pd_attend_scratch(int64_t n, int64_t hd, int64_t end);
void pd_attend_units(const float* q, const void* kc, int64_t k_row, const void* vc, int64_t v_row,
                     const uint8_t* mask, int64_t mask_span, void* out, int64_t b, int64_t n, int64_t heads, int64_t kvh,
                     int64_t hd, int64_t max_len, int64_t end, int dt, void* scratch);
/* native_mm.c: scratch holds the activations' int8 form (``pd_linear_scratch`` bytes) */
int64_t pd_linear_scratch(int64_t rows, int64_t k);
void pd_linear_rows(const pd_linear* w, const void* x, int64_t rows, void* y, int dt, void* scratch);

#endif
