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

/* panel_*: the float32 products of a decode step, y [M, N] = x [M, K] W^T (+ bias) for the few rows of a step
   (M <= a few hundred), over a copy of W packed once into panels of NR output features: Wp [ceil(N/NR)][K][NR].
   Each thread takes whole panels; a panel is multiplied by blocks of MR rows of x (MR x NR outputs held in
   registers, x broadcast, the panel's rows loaded as vectors), so the panel is read from memory once and the
   other row blocks find it in cache. While it computes one panel, a thread prefetches the next into L2, spread
   over the panel's row blocks: memory reads overlap the arithmetic, which at these row counts takes as long. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define PANEL_VEC __m512
#define PANEL_LANES 16
#define PV_LOAD _mm512_loadu_ps
#define PV_STORE _mm512_storeu_ps
#define PV_SET1 _mm512_set1_ps
#define PV_FMA _mm512_fmadd_ps
#define PV_ADD _mm512_add_ps
#define PV_ZERO _mm512_setzero_ps
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PANEL_VEC __m256
#define PANEL_LANES 8
#define PV_LOAD _mm256_loadu_ps
#define PV_STORE _mm256_storeu_ps
#define PV_SET1 _mm256_set1_ps
#define PV_FMA _mm256_fmadd_ps
#define PV_ADD _mm256_add_ps
#define PV_ZERO _mm256_setzero_ps
#endif

#ifdef PANEL_VEC
#define PANEL_NR (2 * PANEL_LANES)
#define PANEL_MR 6
#define PANEL_CHUNK 8  /* k steps between the next panel's prefetches */

/* Output features per panel (0: this build has no panel product). */
int64_t panel_width(void) { return PANEL_NR; }

void panel_pack_f32(const float *W, int64_t N, int64_t K, float *Wp, int threads) {
    const int64_t P = (N + PANEL_NR - 1) / PANEL_NR;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int64_t p = 0; p < P; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t i = 0; i < PANEL_NR; ++i) {
                const int64_t n = p * PANEL_NR + i;
                Wp[(p * K + k) * PANEL_NR + i] = n < N ? W[n * K + k] : 0.f;
            }
}

/* MR rows of x (row stride ldx) times one panel wp [K][NR]: y rows (stride ldy) get nv <= NR outputs each.
   pn: the next panel's lines to prefetch (pf of them, a few per chunk of k), NULL for none. */
#define PANEL_KERNEL(MR)                                                                          \
static inline __attribute__((always_inline)) void panel_kernel_##MR(                             \
        const float *wp, const float *x, int64_t ldx, int64_t K, float *y, int64_t ldy, int64_t nv, \
        const float *bias, const char *pn, int64_t pf) {                                         \
    PANEL_VEC c[MR][2];                                                                           \
    for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = PV_ZERO();                                   \
    const int64_t per = pf > 0 ? (pf + (K + PANEL_CHUNK - 1) / PANEL_CHUNK - 1) /                 \
                                 ((K + PANEL_CHUNK - 1) / PANEL_CHUNK) : 0;                       \
    for (int64_t k0 = 0; k0 < K; k0 += PANEL_CHUNK) {                                             \
        for (int64_t j = 0; j < per && pf > 0; ++j, --pf, pn += 64) _mm_prefetch(pn, _MM_HINT_T1); \
        const int64_t k1 = k0 + PANEL_CHUNK < K ? k0 + PANEL_CHUNK : K;                           \
        _Pragma("GCC unroll 4")                                                                   \
        for (int64_t k = k0; k < k1; ++k) {                                                       \
            const PANEL_VEC b0 = PV_LOAD(wp + k * PANEL_NR), b1 = PV_LOAD(wp + k * PANEL_NR + PANEL_LANES); \
            for (int i = 0; i < MR; ++i) {                                                        \
                const PANEL_VEC a = PV_SET1(x[i * ldx + k]);                                      \
                c[i][0] = PV_FMA(a, b0, c[i][0]);                                                 \
                c[i][1] = PV_FMA(a, b1, c[i][1]);                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    float tail[PANEL_NR], bz[PANEL_NR];                                                           \
    for (int64_t i = 0; i < PANEL_NR; ++i) bz[i] = bias && i < nv ? bias[i] : 0.f;                 \
    const PANEL_VEC bb0 = PV_LOAD(bz), bb1 = PV_LOAD(bz + PANEL_LANES);                           \
    for (int i = 0; i < MR; ++i) {                                                                \
        float *yi = nv == PANEL_NR ? y + i * ldy : tail;                                          \
        PV_STORE(yi, PV_ADD(c[i][0], bb0));                                                       \
        PV_STORE(yi + PANEL_LANES, PV_ADD(c[i][1], bb1));                                         \
        if (nv < PANEL_NR) for (int64_t j = 0; j < nv; ++j) y[i * ldy + j] = tail[j];             \
    }                                                                                             \
}
PANEL_KERNEL(1) PANEL_KERNEL(2) PANEL_KERNEL(3) PANEL_KERNEL(4) PANEL_KERNEL(5) PANEL_KERNEL(6)

/* y [M, N] (contiguous) = x [M, K] (row stride x_row) W^T (+ bias [N] unless NULL), Wp from panel_pack_f32. */
void panel_linear_f32(const float *x, int64_t x_row, int64_t M, int64_t K, const float *Wp, int64_t N,
                      const float *bias, float *y, int threads) {
    const int64_t P = (N + PANEL_NR - 1) / PANEL_NR, R = (M + PANEL_MR - 1) / PANEL_MR;
    const int64_t lines = K * PANEL_NR * (int64_t)sizeof(float) / 64, share = (lines + R - 1) / R;
    _Pragma("omp parallel for schedule(static) num_threads(threads)")
    for (int64_t p = 0; p < P; ++p) {
        const float *wp = Wp + p * K * PANEL_NR, *b = bias ? bias + p * PANEL_NR : 0;
        const int64_t nv = N - p * PANEL_NR < PANEL_NR ? N - p * PANEL_NR : PANEL_NR;
        const char *next = p + 1 < P ? (const char *)(wp + K * PANEL_NR) : 0;
        for (int64_t r = 0; r < R; ++r) {
            const int64_t m = r * PANEL_MR, mr = M - m < PANEL_MR ? M - m : PANEL_MR;
            const int64_t first = r * share, pf = next && first < lines ? (lines - first < share ? lines - first : share) : 0;
            const char *pn = pf ? next + first * 64 : 0;
            const float *xm = x + m * x_row;
            float *ym = y + m * N + p * PANEL_NR;
            switch (mr) {
                case 6: panel_kernel_6(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
                case 5: panel_kernel_5(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
                case 4: panel_kernel_4(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
                case 3: panel_kernel_3(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
                case 2: panel_kernel_2(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
                default: panel_kernel_1(wp, xm, x_row, K, ym, N, nv, b, pn, pf); break;
            }
        }
    }
}
#else
int64_t panel_width(void) { return 0; }
void panel_pack_f32(const float *W, int64_t N, int64_t K, float *Wp, int threads) {
    (void)W; (void)N; (void)K; (void)Wp; (void)threads;
}
void panel_linear_f32(const float *x, int64_t x_row, int64_t M, int64_t K, const float *Wp, int64_t N,
                      const float *bias, float *y, int threads) {
    (void)x; (void)x_row; (void)M; (void)K; (void)Wp; (void)N; (void)bias; (void)y; (void)threads;
}
#endif
