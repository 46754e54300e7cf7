/*
 * x86_amx_i16.c - projections on interleaved 16-row tiles (repack.c) with AMX (TDPBF16PS).
 *
 * The tiles of repack.c are already AMX's "B" layout: for each input pair the 16 rows of a
 * group side by side, so 16 consecutive pairs of one group (32 inputs x 16 rows, 1 KiB as
 * bf16) are one B tile register. The activations (bf16, one row per token) are the "A" tile
 * (16 tokens x 32 inputs) and the f32 sums the "C" tile (16 tokens x 16 rows). Registers:
 *   C: 0, 1 = tokens [t0, t0+16) x groups g, g+1;  2, 3 = tokens [t0+16, t0+32)
 *   A: 4 (first 16 tokens), 5 (next 16);  B: 6 (group g), 7 (group g+1)
 * A step of 32 inputs is 4 TDPBF16PS (16 x 16 x 32 each, 16 cycles on Sapphire Rapids class
 * cores: ~3.5 TFLOP/s a core at 16 tokens, about 30x this machine's VDPBF16PS).
 *
 * Numerics: TDPBF16PS does not round like a chain of VDPBF16PS (measured on an Intel Xeon
 * with AMX-BF16: nearly every sum differs from the avx512bf16 kernels in its last bits, and
 * from f32 sums of the products in pairs, per instruction or in order), so this level has its
 * own bits. They do not depend on the token count: every output is its C lane accumulated
 * over the steps of 32 inputs in order from zero, the same B tiles (decoded exactly, as in
 * x86_i16_tiles.h) for any number of tokens, and a token's row of C depends only on its own
 * row of A. So the GEMV and GEMM paths below give the same bits, and the forward pass stays
 * chunk- and batch-invariant at this level (test_kernels, test_forward).
 *
 * Shapes as in cpu.h; o0 and w->row_off are multiples of 16. The tile state is configured
 * and released in every call, so callers (pool threads) need nothing beyond the process's
 * XTILEDATA permission, which dsv4_cpu_detect asks for.
 */
#include "backend/cpu/x86_i16_tiles.h"

/* The tile configuration of palette 1 (Intel SDM, LDTILECFG): 64 bytes. */
struct amx_cfg {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
};

/* Token blocks of ra and rb (0..16; rb = 0: one block) tokens; B tiles are 16 pairs. */
static void amx_config(int ra, int rb)
{
    struct amx_cfg c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    int rows[8] = { ra, ra, rb, rb, ra, rb, 16, 16 };
    for (int i = 0; i < 8; i++)
        if (rows[i]) {
            c.rows[i]  = (uint8_t)rows[i];
            c.colsb[i] = 64;
        }
    _tile_loadconfig(&c);
}

/* Group g's 16 pairs of input block b (32 inputs) as a B tile into out[16][32]. */
static inline __attribute__((always_inline)) void decode_block(int kind, const struct dsv4_linear *w, int g, int b,
                                                               uint16_t *out)
{
    size_t  P    = (size_t)w->n_in / 2;
    __m512i adds = block_adds(kind, w, g, b);
    for (size_t j = 0; j < 16; j++) {
        size_t p = (size_t)b * 16 + j;
        if (((p * tile_bytes(kind)) & 63) == 0)
            _mm_prefetch((const char *)dsv4_i16_w(w) + ((size_t)g * P + p) * tile_bytes(kind) + I16_PF, _MM_HINT_T0);
        _mm512_storeu_si512(out + j * 32, tile_bf16(kind, dsv4_i16_w(w), P, g, p, adds));
    }
}

/*
 * C tiles of NB token blocks x NG groups from g over all inputs, the B tiles from the decoded
 * panel (panel != NULL: i16_panel's [p][2][32]), read in place (BF16) or decoded a block at a
 * time into buf (2 x 1 KiB, stays in L1).
 */
static inline __attribute__((always_inline)) void sweep(int kind, int NG, int NB, const struct dsv4_linear *w, int g,
                                                        const uint16_t *x, int ldx, const uint16_t *panel,
                                                        uint16_t *buf)
{
    size_t P = (size_t)w->n_in / 2, xs = (size_t)ldx * 2;
    _tile_zero(0);
    if (NG == 2) _tile_zero(1);
    if (NB == 2) _tile_zero(2);
    if (NG == 2 && NB == 2) _tile_zero(3);
    for (int b = 0; b < w->n_in / 32; b++) {
        const void *b0, *b1;
        size_t      bs = 64;
        if (panel) {
            b0 = panel + (size_t)b * 16 * 64;
            b1 = (const uint16_t *)b0 + 32;
            bs = 128;
        } else if (kind == I16_BF16) {
            const uint8_t *t0 = (const uint8_t *)dsv4_i16_w(w) + ((size_t)g * P + (size_t)b * 16) * 64;
            b0 = t0;
            b1 = t0 + P * 64;
            /* in-place B tiles stream from memory: keep each group's next lines coming */
            for (int l = 0; l < 16; l++) {
                _mm_prefetch((const char *)t0 + I16_PF + 64 * l, _MM_HINT_T0);
                if (NG == 2) _mm_prefetch((const char *)t0 + P * 64 + I16_PF + 64 * l, _MM_HINT_T0);
            }
        } else {
            decode_block(kind, w, g, b, buf);
            if (NG == 2) decode_block(kind, w, g + 1, b, buf + 512);
            b0 = buf;
            b1 = buf + 512;
        }
        _tile_loadd(6, b0, bs);
        if (NG == 2) _tile_loadd(7, b1, bs);
        _tile_loadd(4, x + (size_t)b * 32, xs);
        if (NB == 2) _tile_loadd(5, x + (size_t)16 * (size_t)ldx + (size_t)b * 32, xs);
        _tile_dpbf16ps(0, 4, 6);
        if (NG == 2) _tile_dpbf16ps(1, 4, 7);
        if (NB == 2) _tile_dpbf16ps(2, 5, 6);
        if (NG == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
}

/* C tile `tile` (rows tokens of group g) to y: in place when all 16 rows of the group are
 * outputs of [o0, o1), else through tmp for the rows that are. */
#define STORE_C(tile, g_, t_, rows_)                                                                             \
    do {                                                                                                         \
        int o = (g_) * 16 - w->row_off, n_ = o1 - o < 16 ? o1 - o : 16;                                         \
        float *yt = y + (size_t)(t_) * (size_t)ldy + o;                                                         \
        if (n_ == 16) _tile_stored(tile, yt, (size_t)ldy * 4);                                                   \
        else {                                                                                                   \
            _tile_stored(tile, tmp, 64);                                                                         \
            for (int r_ = 0; r_ < (rows_); r_++) memcpy(yt + (size_t)r_ * (size_t)ldy, tmp + r_ * 16, 4 * (size_t)n_); \
        }                                                                                                        \
    } while (0)

static inline __attribute__((always_inline)) void amx_rows(int kind, const struct dsv4_linear *w, int o0, int o1,
                                                           int nt, const uint16_t *x, int ldx, float *y, int ldy,
                                                           uint16_t *panel)
{
    _Alignas(64) uint16_t buf[2 * 512];
    _Alignas(64) float    tmp[16 * 16];
    int g_end = (o1 + w->row_off + 15) / 16, cfg_a = -1, cfg_b = -1;
    /* decode into the panel once for all tokens only when more than one pass of 32 reads it */
    bool use_panel = panel && kind != I16_BF16 && nt > 32;
    for (int g = (o0 + w->row_off) / 16; g < g_end; g += 2) {
        int ng = g_end - g >= 2 ? 2 : 1;
        if (use_panel) i16_panel(kind, w, g, ng, panel);
        const uint16_t *pn = use_panel ? panel : NULL;
        for (int t0 = 0; t0 < nt; t0 += 32) {
            int n = nt - t0 < 32 ? nt - t0 : 32, ra = n < 16 ? n : 16, rb = n - ra;
            if (ra != cfg_a || rb != cfg_b) {
                amx_config(ra, rb);
                cfg_a = ra;
                cfg_b = rb;
            }
            const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
            if (ng == 2) {
                if (rb) sweep(kind, 2, 2, w, g, xt, ldx, pn, buf);
                else sweep(kind, 2, 1, w, g, xt, ldx, pn, buf);
            } else {
                if (rb) sweep(kind, 1, 2, w, g, xt, ldx, pn, buf);
                else sweep(kind, 1, 1, w, g, xt, ldx, pn, buf);
            }
            STORE_C(0, g, t0, ra);
            if (ng == 2) STORE_C(1, g + 1, t0, ra);
            if (rb) {
                STORE_C(2, g, t0 + 16, rb);
                if (ng == 2) STORE_C(3, g + 1, t0 + 16, rb);
            }
        }
    }
    _tile_release();
}

static void rows_any(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy,
                     uint16_t *panel)
{
    if (nt <= 0 || o1 <= o0) return;
    switch (kind_of(w)) {
    case I16_FP8: amx_rows(I16_FP8, w, o0, o1, nt, x, ldx, y, ldy, panel); break;
    case I16_FP4: amx_rows(I16_FP4, w, o0, o1, nt, x, ldx, y, ldy, panel); break;
    default: amx_rows(I16_BF16, w, o0, o1, nt, x, ldx, y, ldy, panel); break;
    }
}

void dsv4_amx_dotb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy)
{
    rows_any(w, o0, o1, nt, x, ldx, y, ldy, NULL);
}

void dsv4_amx_gemmb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                        int ldy, uint16_t *panel)
{
    rows_any(w, o0, o1, nt, x, ldx, y, ldy, panel);
}

/* n passes of 4 independent 16 x 16 x 32 TDPBF16PS (16 tokens, two groups, two blocks). */
double dsv4_amx_peak(long n)
{
    _Alignas(64) uint16_t ones[16 * 32];
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3f80; /* bf16 1.0 */
    n /= 8;                                             /* a pass is ~6x the work of a VDPBF16PS pass */
    amx_config(16, 16);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (long j = 0; j < n; j++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _Alignas(64) float sink[16 * 16];
    _tile_stored(0, sink, 64);
    _tile_release();
    volatile float s = sink[0];
    (void)s;
    return 4.0 * 16 * 16 * 32 * 2 * (double)n;
}
