/* The decode-step kernels of teamrl.engines.cpu_attention: compiled on first use, loaded with ctypes.

   decode_attention_*: attention of one query token per row over a row's cached keys and values.
   rope_attention_*:   the same after rotating the step's queries and keys and writing the keys and
                       values into the cache (one call for what is otherwise six torch calls).
   add_rms_norm_*:     the residual add and the next RMSNorm of a decode step.
   silu_mul_*:         silu(gate) * up of a gated MLP.
   Each rounds to the tensor dtype where torch's operations would (bf16), in the same order. */
#include <stdint.h>
#include <math.h>

static inline float bf2f(uint16_t x) { union { uint32_t u; float f; } v; v.u = (uint32_t)x << 16; return v.f; }
static inline uint16_t f2bf(float f) {  /* round to nearest even, as torch does */
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
static inline float id_f(float x) { return x; }
#define KEEP(x) (x)

#define MAXG 16
#define MAXD 256
#ifndef PF
#define PF 8
#endif

/* Softmax attention of G query heads qf (scaled, fp32) over the n first columns of one kv head's keys kb and
   values vb ([C, D]); writes G * D outputs to o. One pass over blocks of CB columns (an online softmax: each
   block's keys, then its values, while both are in cache; the running sums rescaled when the maximum grows). */
/* DIRECT: T is float, and keys and values are read in place (no converted copy of each row). DN: the head
   dimension as a constant the compiler unrolls for (0: D, as given). */
#define CB 16  /* columns per block of the online softmax */
#define ATTEND(NAME, T, LOAD, STORE, DIRECT, DN)                                                  \
static void NAME(float qf[MAXG][MAXD], const T *kb, const T *vb, int64_t n, int64_t G, int64_t Dg, \
                 T *o) {                                                                          \
    const int64_t D = DN ? DN : Dg;                                                               \
    float acc[MAXG][MAXD], buf[MAXD], mx[MAXG], z[MAXG], s[MAXG][CB];                             \
    for (int64_t g = 0; g < G; ++g) {                                                             \
        z[g] = 0.f;                                                                               \
        for (int64_t d = 0; d < D; ++d) acc[g][d] = 0.f;                                          \
    }                                                                                             \
    for (int64_t c0 = 0; c0 < n; c0 += CB) {                                                      \
        const int64_t cn = n - c0 < CB ? n - c0 : CB;                                             \
        for (int64_t j = 0; j < cn; ++j) {                                                        \
            const int64_t c = c0 + j;                                                             \
            for (int64_t d = 0; d < D * (int64_t)sizeof(T); d += 64) {                            \
                __builtin_prefetch((const char *)(kb + (c + PF) * D) + d);                        \
                __builtin_prefetch((const char *)(vb + (c + PF) * D) + d);                        \
            }                                                                                     \
            const float *row = DIRECT ? (const float *)(const void *)(kb + c * D) : buf;           \
            if (!DIRECT) for (int64_t d = 0; d < D; ++d) buf[d] = LOAD(kb[c * D + d]);           \
            for (int64_t g = 0; g < G; ++g) {                                                     \
                float t = 0.f;                                                                    \
                for (int64_t d = 0; d < D; ++d) t += qf[g][d] * row[d];                           \
                s[g][j] = t;                                                                      \
            }                                                                                     \
        }                                                                                         \
        for (int64_t g = 0; g < G; ++g) {                                                         \
            float bm = s[g][0];                                                                   \
            for (int64_t j = 1; j < cn; ++j) bm = s[g][j] > bm ? s[g][j] : bm;                    \
            if (c0 == 0) mx[g] = bm;                                                              \
            else if (bm > mx[g]) {                                                                \
                const float r = expf(mx[g] - bm);                                                 \
                z[g] *= r;                                                                        \
                for (int64_t d = 0; d < D; ++d) acc[g][d] *= r;                                   \
                mx[g] = bm;                                                                       \
            }                                                                                     \
            for (int64_t j = 0; j < cn; ++j) { s[g][j] = expf(s[g][j] - mx[g]); z[g] += s[g][j]; } \
        }                                                                                         \
        for (int64_t j = 0; j < cn; ++j) {                                                        \
            const int64_t c = c0 + j;                                                             \
            const float *row = DIRECT ? (const float *)(const void *)(vb + c * D) : buf;           \
            if (!DIRECT) for (int64_t d = 0; d < D; ++d) buf[d] = LOAD(vb[c * D + d]);           \
            for (int64_t g = 0; g < G; ++g) {                                                     \
                const float p = s[g][j];                                                          \
                for (int64_t d = 0; d < D; ++d) acc[g][d] += p * row[d];                          \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    for (int64_t g = 0; g < G; ++g)                                                               \
        for (int64_t d = 0; d < D; ++d) o[g * D + d] = STORE(acc[g][d] / z[g]);                   \
}
ATTEND(attend_bf16_any, uint16_t, bf2f, f2bf, 0, 0)
ATTEND(attend_bf16_64, uint16_t, bf2f, f2bf, 0, 64)
ATTEND(attend_bf16_128, uint16_t, bf2f, f2bf, 0, 128)
ATTEND(attend_f32_any, float, id_f, id_f, 1, 0)
ATTEND(attend_f32_64, float, id_f, id_f, 1, 64)
ATTEND(attend_f32_128, float, id_f, id_f, 1, 128)

/* The attention of one kv head, for the head dimension at hand (64 and 128 unrolled). */
#define ATTEND_ANY(NAME, T, SUFFIX)                                                               \
static void NAME(float qf[MAXG][MAXD], const T *kb, const T *vb, int64_t n, int64_t G, int64_t D,   \
                 T *o) {                                                                          \
    if (D == 64) attend_##SUFFIX##_64(qf, kb, vb, n, G, D, o);                                    \
    else if (D == 128) attend_##SUFFIX##_128(qf, kb, vb, n, G, D, o);                             \
    else attend_##SUFFIX##_any(qf, kb, vb, n, G, D, o);                                           \
}
ATTEND_ANY(attend_bf16, uint16_t, bf16)
ATTEND_ANY(attend_f32, float, f32)

/* q: row b, kv head h, query g at q[b * q_row + (h * G + g) * D]; k, v: [rows, H, C, D] (batch
   row b = cache row b); lens[b] >= 1 visible columns of row b; out: [B, H, G, D] contiguous.
   G <= 16, D <= 256. */
#define KERNEL(NAME, ATT, T, LOAD)                                                                \
void NAME(const T *q, int64_t q_row, const T *k, const T *v, T *out, const int64_t *lens,        \
          int64_t B, int64_t H, int64_t G, int64_t D, int64_t C, float scale, int threads) {       \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                             \
    for (int64_t bh = 0; bh < B * H; ++bh) {                                                       \
        const int64_t b = bh / H, h = bh % H;                                                      \
        float qf[MAXG][MAXD];                                                                      \
        for (int64_t g = 0; g < G; ++g)                                                            \
            for (int64_t d = 0; d < D; ++d) qf[g][d] = LOAD(q[b * q_row + (h * G + g) * D + d]) * scale; \
        ATT(qf, k + bh * C * D, v + bh * C * D, lens[b], G, D, out + bh * G * D);                 \
    }                                                                                              \
}
KERNEL(decode_attention_bf16, attend_bf16, uint16_t, bf2f)
KERNEL(decode_attention_f32, attend_f32, float, id_f)

/* x * cos + roll(x, D/2) * ssin at index d (ssin: sin with its first half negated), each product and the sum
   rounded to T as torch's (x * cos).add_(x.roll(D // 2, -1) * ssin) rounds them. */
#define ROT(x, cb, sb, d, other, LOAD, STORE) \
    STORE(LOAD(STORE(LOAD((x)[d]) * LOAD((cb)[d]))) + LOAD(STORE(LOAD((x)[other]) * LOAD((sb)[d]))))
/* out[d] = ROT(x, d) for d < D: roll(x, D/2)[d] is x[d + D/2] in the first half and x[d - D/2] in the second. */
#define ROTATE(out, x, cb, sb, half, LOAD, STORE, CONVERT)                                        \
    do {                                                                                          \
        for (int64_t d = 0; d < (half); ++d) (out)[d] = CONVERT(ROT(x, cb, sb, d, d + (half), LOAD, STORE)); \
        for (int64_t d = (half); d < 2 * (half); ++d)                                             \
            (out)[d] = CONVERT(ROT(x, cb, sb, d, d - (half), LOAD, STORE));                       \
    } while (0)

/* qkv: row b's queries (H * G heads), keys (H) and values (H), D each, at qkv + b * qkv_row; cs, sn: [B, D]
   cos and ssin of each row's position; k, v: one layer's cache [rows, H, C, D]; pos[b]: the column row b
   writes its key and value at (it then attends over columns 0 .. pos[b]); out [B, H, G, D]. */
#define ROPE_KERNEL(NAME, ATT, T, LOAD, STORE)                                                    \
void NAME(const T *qkv, int64_t qkv_row, const T *cs, const T *sn, T *k, T *v, const int64_t *pos, \
          T *out, int64_t B, int64_t H, int64_t G, int64_t D, int64_t C, float scale, int threads) { \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                             \
    for (int64_t bh = 0; bh < B * H; ++bh) {                                                       \
        const int64_t b = bh / H, h = bh % H, p = pos[b], half = D / 2;                            \
        const T *x = qkv + b * qkv_row, *cb = cs + b * D, *sb = sn + b * D;                        \
        const T *xk = x + (H * G + h) * D, *xv = x + (H * G + H + h) * D;                          \
        T *kb = k + bh * C * D, *vb = v + bh * C * D;                                              \
        float qf[MAXG][MAXD];                                                                      \
        ROTATE(kb + p * D, xk, cb, sb, half, LOAD, STORE, KEEP);                                   \
        for (int64_t d = 0; d < D; ++d) vb[p * D + d] = xv[d];                                     \
        for (int64_t g = 0; g < G; ++g) {                                                          \
            ROTATE(qf[g], x + (h * G + g) * D, cb, sb, half, LOAD, STORE, LOAD);                   \
            for (int64_t d = 0; d < D; ++d) qf[g][d] *= scale;                                     \
        }                                                                                          \
        ATT(qf, kb, vb, p + 1, G, D, out + bh * G * D);                                           \
    }                                                                                              \
}
ROPE_KERNEL(rope_attention_bf16, attend_bf16, uint16_t, bf2f, f2bf)
ROPE_KERNEL(rope_attention_f32, attend_f32, float, id_f, id_f)

/* Rows of h [B, N]: h += d (unless d is NULL; the sum rounded to T), then x = w * T(h * rsqrt(mean(h^2) + eps))
   with the statistics in fp32 (torch: _fused_rms_norm in fp32, rounded to T, times the weight in T). */
#define ADD_NORM(NAME, T, LOAD, STORE)                                                            \
void NAME(T *h, const T *d, const T *w, T *x, int64_t B, int64_t N, float eps, int threads) {     \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if(B * N >= 65536)")          \
    for (int64_t b = 0; b < B; ++b) {                                                              \
        T *hb = h + b * N, *xb = x + b * N;                                                        \
        float ss = 0.f;                                                                            \
        if (d) {                                                                                   \
            const T *db = d + b * N;                                                               \
            for (int64_t j = 0; j < N; ++j) {                                                      \
                const T t = STORE(LOAD(hb[j]) + LOAD(db[j]));                                      \
                hb[j] = t;                                                                         \
                ss += LOAD(t) * LOAD(t);                                                           \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t j = 0; j < N; ++j) ss += LOAD(hb[j]) * LOAD(hb[j]);                       \
        }                                                                                          \
        const float r = 1.f / sqrtf(ss / (float)N + eps);                                          \
        for (int64_t j = 0; j < N; ++j) xb[j] = STORE(LOAD(w[j]) * LOAD(STORE(LOAD(hb[j]) * r)));  \
    }                                                                                              \
}
ADD_NORM(add_rms_norm_bf16, uint16_t, bf2f, f2bf)
ADD_NORM(add_rms_norm_f32, float, id_f, id_f)

/* out [B, I] = T(silu(gate)) * up, gate and up the halves of row b of gu (at gu + b * gu_row). */
#define SILU_MUL(NAME, T, LOAD, STORE)                                                            \
void NAME(const T *gu, int64_t gu_row, T *out, int64_t B, int64_t I, int threads) {               \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if(B * I >= 16384)")          \
    for (int64_t b = 0; b < B; ++b) {                                                              \
        const T *g = gu + b * gu_row, *u = g + I;                                                  \
        T *ob = out + b * I;                                                                       \
        for (int64_t j = 0; j < I; ++j) {                                                          \
            const float x = LOAD(g[j]);                                                            \
            ob[j] = STORE(LOAD(STORE(x / (1.f + expf(-x)))) * LOAD(u[j]));                         \
        }                                                                                          \
    }                                                                                              \
}
SILU_MUL(silu_mul_bf16, uint16_t, bf2f, f2bf)
SILU_MUL(silu_mul_f32, float, id_f, id_f)
