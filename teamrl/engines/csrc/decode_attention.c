/* The decode-attention kernel of teamrl.engines.cpu_attention: compiled on first use, loaded with ctypes. */
#include <stdint.h>
#include <math.h>

static inline float bf2f(uint16_t x) { union { uint32_t u; float f; } v; v.u = (uint32_t)x << 16; return v.f; }
static inline uint16_t f2bf(float f) {  /* round to nearest even, as torch does */
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* q: row b, kv head h, query g at q[b * q_row + (h * G + g) * D]; k, v: [rows, H, C, D] (batch
   row b = cache row b); lens[b] >= 1 visible columns of row b; out: [B, H, G, D] contiguous;
   work: B * H * G * C floats. G <= 16, D <= 256. */
#define KERNEL(NAME, T, LOAD, STORE)                                                              \
void NAME(const T *q, int64_t q_row, const T *k, const T *v, T *out, const int64_t *lens,        \
          int64_t B, int64_t H, int64_t G, int64_t D, int64_t C, float scale, float *work,         \
          int threads) {                                                                           \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                             \
    for (int64_t bh = 0; bh < B * H; ++bh) {                                                       \
        const int64_t b = bh / H, h = bh % H, n = lens[b];                                         \
        const T *kb = k + bh * C * D, *vb = v + bh * C * D;                                        \
        float *s = work + bh * G * C;                                                              \
        float qf[16][256], acc[16][256], row[256], inv[16];                                       \
        for (int64_t g = 0; g < G; ++g)                                                            \
            for (int64_t d = 0; d < D; ++d) {                                                      \
                qf[g][d] = LOAD(q[b * q_row + (h * G + g) * D + d]) * scale;                       \
                acc[g][d] = 0.f;                                                                   \
            }                                                                                      \
        for (int64_t c = 0; c < n; ++c) {                                                          \
            for (int64_t d = 0; d < D; ++d) row[d] = LOAD(kb[c * D + d]);                          \
            for (int64_t g = 0; g < G; ++g) {                                                      \
                float t = 0.f;                                                                     \
                for (int64_t d = 0; d < D; ++d) t += qf[g][d] * row[d];                            \
                s[g * C + c] = t;                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int64_t g = 0; g < G; ++g) {                                                          \
            float *sg = s + g * C, m = sg[0], z = 0.f;                                             \
            for (int64_t c = 1; c < n; ++c) m = sg[c] > m ? sg[c] : m;                             \
            for (int64_t c = 0; c < n; ++c) { sg[c] = expf(sg[c] - m); z += sg[c]; }              \
            inv[g] = 1.f / z;                                                                      \
        }                                                                                          \
        for (int64_t c = 0; c < n; ++c) {                                                          \
            for (int64_t d = 0; d < D; ++d) row[d] = LOAD(vb[c * D + d]);                          \
            for (int64_t g = 0; g < G; ++g) {                                                      \
                const float p = s[g * C + c];                                                      \
                for (int64_t d = 0; d < D; ++d) acc[g][d] += p * row[d];                           \
            }                                                                                      \
        }                                                                                          \
        for (int64_t g = 0; g < G; ++g)                                                            \
            for (int64_t d = 0; d < D; ++d) out[(bh * G + g) * D + d] = STORE(acc[g][d] * inv[g]);  \
    }                                                                                              \
}

#define ID(x) (x)
KERNEL(decode_attention_bf16, uint16_t, bf2f, f2bf)
KERNEL(decode_attention_f32, float, ID, ID)
