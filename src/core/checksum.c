/*
 * checksum.c - CRC-32C and SHA-256, written from their specifications, for files that must be
 * recognised as intact and as belonging to one model (the kv-disk cache files, docs/FORMAT.md).
 *
 * CRC-32C (Castagnoli; RFC 3720 appendix B.4): the reflected polynomial 0x82F63B78, initial
 * value and final xor 0xFFFFFFFF, one table of 256 entries built on first use. It detects every
 * burst error up to 32 bits and is the checksum iSCSI, ext4 and Btrfs use for the same job;
 * a byte at a time runs at several hundred MB/s, which is far above the disk it checks.
 *
 * SHA-256 (FIPS 180-4, sections 4.1.2, 4.2.2, 5.1.1, 5.3.3 and 6.2): a digest, not a
 * checksum, for identities (the hash of a config and the weights' headers), where two
 * different inputs must not meet by accident.
 */
#include <pthread.h>
#include <string.h>

#include "core/core.h"

/* ------------------------------------------------------------------ CRC-32C */

static uint32_t       crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dsv4_crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_table_init);
    const uint8_t *s = p;
    crc              = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ s[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------ SHA-256 */

/* The first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

/* One 64-byte block into the state h[8] (FIPS 180-4 6.2.2). */
static void sha_block(uint32_t h[8], const uint8_t *blk)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)blk[4 * t] << 24 | (uint32_t)blk[4 * t + 1] << 16 | (uint32_t)blk[4 * t + 2] << 8 | blk[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t]        = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void dsv4_sha256(const void *p, size_t n, uint8_t out[32])
{
    /* The first 32 bits of the fractional parts of the square roots of the first 8 primes. */
    uint32_t       h[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    const uint8_t *s    = p;
    size_t         full = n / 64;
    for (size_t i = 0; i < full; i++) sha_block(h, s + 64 * i);
    /* Padding (5.1.1): a 1 bit, zeros, then the length in bits as 64 bits big-endian, in one
     * block or two when fewer than 9 bytes are left after the message. */
    uint8_t tail[128] = { 0 };
    size_t  rest      = n - 64 * full;
    memcpy(tail, s + 64 * full, rest);
    tail[rest]         = 0x80;
    size_t   tail_len  = rest + 9 <= 64 ? 64 : 128;
    uint64_t bits      = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[tail_len - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t off = 0; off < tail_len; off += 64) sha_block(h, tail + off);
    for (int i = 0; i < 8; i++) {
        out[4 * i]     = (uint8_t)(h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(h[i] >> 8);
        out[4 * i + 3] = (uint8_t)h[i];
    }
}
