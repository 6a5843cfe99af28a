/* What the decode path's C files share (paradec.models.native): bf16 <-> fp32, and loads and
stores of a tensor that is bf16 (dt = 1) or fp32 (dt = 0). */
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

#endif
