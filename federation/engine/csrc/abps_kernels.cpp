// Fused element-wise CPU kernels of the stacked engine's training step (federation/kernels.py).
//
// Plain C++17, no PyTorch headers; built on first use by federation.kernels.build() into the
// per-user cache and loaded with ctypes. "abps_kernels.h" is generated at build time from the one
// signature table in federation/kernels.py (SIGNATURES): it declares every exported function, so a
// definition here that drifts from the table the Python side calls with is a compile error
// ("conflicting declaration of C function"), never a silent mismatch of arguments.
//
// Rounding: built with -ffp-contract=off, so every product and sum is a separately rounded float op
// (no fused multiply-add) and the element-wise values equal PyTorch's eager ones bit for bit; the
// sums (bias gradients, logits, output-weight gradient) run in their own order.

#include <cstdint>
#include <cstring>

#include "abps_kernels.h"

extern "C" {

// sum_j a[j] * b[j] in 16 independent lanes (vectorises without reassociation), then the lanes in order.
static inline float dot16(const float* a, const float* b, int64_t h) {
  float acc[16] = {0.f};
  int64_t j = 0;
  for (; j + 16 <= h; j += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[j + l] * b[j + l];
  for (int l = 0; j < h; ++j, ++l) acc[l] += a[j] * b[j];
  float t = 0.f;
  for (int l = 0; l < 16; ++l) t += acc[l];
  return t;
}

// z [c, w, h] float32 contiguous, in place: z = relu(z + b) * keep, keep = bits >= thr (1.0 / 0.0).
// b [c, h]; bits: int16 at (center i, row r, unit j) = bits[i * cs + r * rs + j], or null (no dropout).
// logits (optional, [c, w]) = lb[i] + sum_j z_new[i, r, j] * lw[i, j]  (the output layer, lw [c, h], lb [c]).
void abps_bias_relu_drop(float* z, const float* b, const int16_t* bits, int64_t c, int64_t w, int64_t h,
                         int64_t cs, int64_t rs, int32_t thr, float* logits, const float* lw, const float* lb,
                         int32_t nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    const float* bi = b + i * h;
    for (int64_t r = 0; r < w; ++r) {
      float* zr = z + (i * w + r) * h;
      if (bits) {
        const int16_t* br = bits + i * cs + r * rs;
        for (int64_t j = 0; j < h; ++j) {
          float v = zr[j] + bi[j];
          v = v < 0.f ? 0.f : v;               // relu, NaN passes (as clamp_min)
          zr[j] = v * (br[j] >= thr ? 1.f : 0.f);
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          float v = zr[j] + bi[j];
          zr[j] = v < 0.f ? 0.f : v;
        }
      }
      if (logits) logits[i * w + r] = lb[i] + dot16(zr, lw + i * h, h);
    }
  }
}

// q [c, w, h] (output) = (hact <= 0 ? 0 : dl[i, r] * v[i, j]); gb [c, h] (output) = sum_r q / s;
// gw (optional, [c, h]) = s * sum_r hact[i, r, j] * dl[i, r]  (the output layer's weight gradient).
void abps_outer_relu_grad(float* q, float* gb, const float* dl, const float* v, const float* hact,
                          int64_t c, int64_t w, int64_t h, float s, float* gw, int32_t nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    float* g = gb + i * h;
    float* g3 = gw ? gw + i * h : nullptr;
    const float* vi = v + i * h;
    for (int64_t j = 0; j < h; ++j) g[j] = 0.f;
    if (g3) for (int64_t j = 0; j < h; ++j) g3[j] = 0.f;
    for (int64_t r = 0; r < w; ++r) {
      const float d = dl[i * w + r];
      const float* hr = hact + (i * w + r) * h;
      float* qr = q + (i * w + r) * h;
      for (int64_t j = 0; j < h; ++j) {
        float x = hr[j] <= 0.f ? 0.f : d * vi[j];
        qr[j] = x;
        g[j] += x;
      }
      if (g3) for (int64_t j = 0; j < h; ++j) g3[j] += hr[j] * d;
    }
    for (int64_t j = 0; j < h; ++j) g[j] = g[j] / s;
    if (g3) for (int64_t j = 0; j < h; ++j) g3[j] = g3[j] * s;
  }
}

// g [c, w, h] in place: g = (hact <= 0 ? 0 : g); gb [c, h] (output) = sum_r g.
void abps_relu_grad(float* g, float* gb, const float* hact, int64_t c, int64_t w, int64_t h, int32_t nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    float* acc = gb + i * h;
    for (int64_t j = 0; j < h; ++j) acc[j] = 0.f;
    for (int64_t r = 0; r < w; ++r) {
      const float* hr = hact + (i * w + r) * h;
      float* gr = g + (i * w + r) * h;
      for (int64_t j = 0; j < h; ++j) {
        float x = hr[j] <= 0.f ? 0.f : gr[j];
        gr[j] = x;
        acc[j] += x;
      }
    }
  }
}

// PCG64 (XSL-RR 128/64, NumPy's ``PCG64.random_raw``): state <- state * M + inc, then output.
void abps_pcg64_fill(uint64_t* out, int64_t n, uint64_t state_hi, uint64_t state_lo, uint64_t inc_hi,
                     uint64_t inc_lo) {
  typedef unsigned __int128 u128;
  const u128 mult = ((u128)0x2360ED051FC65DA4ULL << 64) | 0x4385DF649FCCF645ULL;
  u128 st = ((u128)state_hi << 64) | state_lo;
  const u128 inc = ((u128)inc_hi << 64) | inc_lo;
  for (int64_t k = 0; k < n; ++k) {
    st = st * mult + inc;
    const uint64_t x = (uint64_t)(st >> 64) ^ (uint64_t)st;
    const unsigned rot = (unsigned)(st >> 122);
    out[k] = (x >> rot) | (x << ((64u - rot) & 63u));
  }
}

int32_t abps_kernels_version() { return 3; }
}
