/* A whole decode or verification pass's layers in one C call (paradec.models.native).

Run layer by layer from Python, a pass of SmolLM2 makes ~240 C calls (four linears and three small
ops a layer), each with a few microseconds of Python and ctypes around it and an OpenMP region to
open and close: about a tenth of a 10 ms `ar` step on 2 AVX2 cores. Where every linear of the
layers is a quantized one in C, ``pd_layers`` runs them all inside one OpenMP region; its steps
(native.h) split their work between the threads, with a barrier after each. Every step computes
each element exactly as the per-layer calls do, so the two agree bit for bit.
*/
#include <stdint.h>
#include <stdlib.h>

#include "native.h"

#if defined(__AVX2__) && defined(__FMA__) /* the quantized linears' kernels (native_mm.c) */

/* x [b, n, hidden] (the residual stream, updated in place) through ``count`` layers: as
   ``native_layers`` in Python does with one call a step. cos, sin [b, n, hd]; the caches' layer l
   at kc + l * k_layer and vc + l * v_layer elements (rows k_row and v_row apart); idx [b, n] the
   tokens' slots, mask [b, n, mask_span] bytes or NULL, over slots [0, end). Returns 0 if out of
   memory (x then unchanged or partly updated: the caller's pass fails). */
int pd_layers(const pd_layer* layers, int64_t count, void* x, const void* cos, const void* sin, void* kc,
              int64_t k_layer, int64_t k_row, void* vc, int64_t v_layer, int64_t v_row, const int64_t* idx,
              const uint8_t* mask, int64_t mask_span, int64_t b, int64_t n, int64_t hidden, int64_t heads,
              int64_t kvh, int64_t hd, int64_t inter, int64_t max_len, int64_t end, int dt, int threads) {
  const int64_t rows = b * n, es = dt ? 2 : 4, width = (heads + 2 * kvh) * hd;
  const int64_t widest = inter > hidden ? inter : hidden; /* the widest linear input */
  int64_t sizes[] = {rows * hidden, rows * width, rows * heads * hd, rows * hidden, rows * 2 * inter, rows * inter};
  int64_t total = 0;
  for (int i = 0; i < 6; ++i) total += sizes[i] * es;
  const int64_t qbytes = pd_linear_scratch(rows, widest > heads * hd ? widest : heads * hd);
  char* mem = malloc((size_t)(total + qbytes + (int64_t)sizeof(float) * rows * heads * hd));
  if (!mem) return 0;
  char* h = mem; /* [rows, hidden]: a norm's output */
  char* qkv = h + sizes[0] * es;
  char* att = qkv + sizes[1] * es;
  char* o = att + sizes[2] * es; /* [rows, hidden]: the attention's or the MLP's output */
  char* gu = o + sizes[3] * es;
  char* act = gu + sizes[4] * es;
  char* quant = act + sizes[5] * es;
  float* q = (float*)(quant + qbytes); /* the rotated queries */
  int ok = 1;
#pragma omp parallel num_threads(threads)
  {
    void* scratch = pd_attend_scratch(n, hd, end);
    if (!scratch) {
#pragma omp atomic write
      ok = 0;
    }
#pragma omp barrier
    if (ok) {
      for (int64_t l = 0; l < count; ++l) {
        const pd_layer* L = layers + l;
        char* kl = (char*)kc + L->layer * k_layer * es;
        char* vl = (char*)vc + L->layer * v_layer * es;
        pd_norm_rows(x, l ? o : NULL, L->attn_norm, h, rows, hidden, (float)L->eps, dt);
        pd_linear_rows(&L->qkv, h, rows, qkv, dt, quant);
        pd_rope_rows(qkv, cos, sin, kl, k_row, vl, v_row, idx, q, b, n, heads, kvh, hd, max_len, dt);
        pd_attend_units(q, kl, k_row, vl, v_row, mask, mask_span, att, b, n, heads, kvh, hd, max_len, end, dt, scratch);
        pd_linear_rows(&L->wo, att, rows, o, dt, quant);
        pd_norm_rows(x, o, L->mlp_norm, h, rows, hidden, (float)L->eps, dt);
        pd_linear_rows(&L->gate_up, h, rows, gu, dt, quant);
        pd_silu_rows(gu, act, rows, inter, dt);
        pd_linear_rows(&L->down, act, rows, o, dt, quant);
      }
      if (count) pd_norm_rows(x, o, NULL, NULL, rows, hidden, 0.0f, dt);
    }
    free(scratch);
  }
  free(mem);
  return ok;
}
#endif
