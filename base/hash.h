/*
 * hash.h - 128-bit content keys and their builder, the hash behind them,
 * and little-endian byte helpers. Every layer names what it builds by a
 * key (spec contents, kernels, cache entries), so this sits in base/.
 */
#ifndef W16_HASH_H
#define W16_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- keys ------------------------------------------------------------------ */

/* A 128-bit content hash (XXH3-128, or the built-in fallback; see
 * w16_hash_name). Printed as 32 lowercase hex digits, hi first. */
typedef struct w16_key {
    uint64_t lo, hi;
} w16_key_t;

#define W16_KEY_HEX_SIZE 33 /* 32 hex digits and the NUL */

/* Streaming key builder. Every call adds one self-delimiting field (a type
 * tag, the length, then the bytes), so field boundaries are part of the key:
 * str("ab") + str("c") differs from str("a") + str("bc"), and u64(5)
 * differs from bytes of the same 8 bytes. Lives on the stack (the storage
 * is 64-byte aligned as XXH3's state requires; do not memcpy it into
 * malloc'd memory). No allocation, no failure. */
typedef struct w16_keyer {
    _Alignas(64) unsigned char opaque_[640];
} w16_keyer_t;

void w16_keyer_init(w16_keyer_t *k);
void w16_keyer_bytes(w16_keyer_t *k, const void *data, size_t n);
/* NULL is a field of its own, distinct from "". */
void w16_keyer_str(w16_keyer_t *k, const char *s);
void w16_keyer_u64(w16_keyer_t *k, uint64_t v);
/* The key; the keyer must be re-initialized before reuse. */
w16_key_t w16_keyer_done(w16_keyer_t *k);

void w16_key_hex(w16_key_t key, char out[W16_KEY_HEX_SIZE]);
bool w16_key_equal(w16_key_t a, w16_key_t b);

/* "xxh3" when built with xxHash, "builtin" otherwise (MurmurHash3_x64_128,
 * see hash.c). Keys and disk entries of the two builds never match. */
const char *w16_hash_name(void);

/* The built-in 128-bit hash (MurmurHash3_x64_128, seed 0) in one shot;
 * exported so tests check it against the reference vectors even in builds
 * that use XXH3. lo = h1, hi = h2 of the reference implementation. */
w16_key_t w16_hash_builtin128(const void *data, size_t n);

/* A 64-bit hash of `n` bytes with the same algorithm (checksums of disk
 * entries), and that algorithm's number as stored in them: 1 for XXH3,
 * 2 for the built-in hash. */
uint64_t w16_hash64(const void *p, size_t n);
int w16_hash_algo(void);

/* ---- little-endian bytes ------------------------------------------------------ */

static inline void w16_put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void w16_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t w16_get_le32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t w16_get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#endif /* W16_HASH_H */
