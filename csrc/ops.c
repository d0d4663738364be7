#include "ops.h"

#include <math.h>

#include "quant.h"

void qw_rmsnorm(const float *x, const float *w, float eps, int64_t M, int64_t D, float *out) {
#pragma omp parallel for schedule(static) if (M * D > 65536)
    for (int64_t r = 0; r < M; r++) {
        const float *xr = x + r * D;
        float *o = out + r * D;
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
        for (int64_t i = 0; i < D; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

void qw_rope(float *x, int64_t T, int64_t H, int64_t hd, const int64_t *pos, const float *inv_freq) {
    int64_t half = hd / 2;
#pragma omp parallel for schedule(static) if (T * H * hd > 65536)
    for (int64_t t = 0; t < T; t++) {
        float p = (float)pos[t];
        for (int64_t i = 0; i < half; i++) {
            float angle = p * inv_freq[i];
            float c = (float)cos((double)angle), s = (float)sin((double)angle);
            for (int64_t h = 0; h < H; h++) {
                float *v = x + (t * H + h) * hd;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void qw_silu_mul(const float *gate, const float *up, int64_t n, float *out) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void qw_softmax(float *x, int64_t M, int64_t n) {
    for (int64_t r = 0; r < M; r++) {
        float *v = x + r * n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            v[i] = expf(v[i] - mx);
            sum += v[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) v[i] *= inv;
    }
}

void qw_embed(const void *E, int dtype, int64_t D, const int32_t *ids, int64_t T, float *out) {
    size_t stride = qw_row_bytes(dtype, D);
    for (int64_t t = 0; t < T; t++)
        qw_dequant_row(dtype, (const uint8_t *)E + (size_t)ids[t] * stride, out + t * D, D);
}
