/*
 * hash.c - the 128-bit content hash behind every cache key (XXH3-128 when
 * built with xxHash, else MurmurHash3_x64_128) and the key builder that
 * frames fields so that their boundaries are part of the key. Lives in base/
 * because every layer names what it builds by a key: spec contents (spec/),
 * kernels (gen/, runtime/) and the disk cache's checksums.
 */
#include "base/hash.h"

#include <string.h>

/* W16_HASH_BUILTIN forces the fallback (to test it in a build that
 * has xxHash). */
#if defined(WNA16_HAVE_XXHASH) && !defined(W16_HASH_BUILTIN)
#define W16_USE_XXH3 1
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#else
#define W16_USE_XXH3 0
#endif

/* ---- the built-in hash: MurmurHash3_x64_128 (Austin Appleby, public
 * domain), seed 0, made streaming by buffering a partial 16-byte block.
 * Used when xxHash is absent; it is well studied and as good as XXH3 for
 * telling kernels apart, only slower. ---------------------------------------- */

typedef struct mm3 {
    uint64_t h1, h2, total;
    unsigned char buf[16];
    size_t nbuf;
} mm3_t;

static const uint64_t MM3_C1 = 0x87c37b91114253d5ull;
static const uint64_t MM3_C2 = 0x4cf5ad432745937full;

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static uint64_t mm3_k1(uint64_t k1) { return rotl64(k1 * MM3_C1, 31) * MM3_C2; }
static uint64_t mm3_k2(uint64_t k2) { return rotl64(k2 * MM3_C2, 33) * MM3_C1; }

static void mm3_block(mm3_t *m, const unsigned char *p)
{
    m->h1 ^= mm3_k1(w16_get_le64(p));
    m->h1 = rotl64(m->h1, 27) + m->h2;
    m->h1 = m->h1 * 5 + 0x52dce729;
    m->h2 ^= mm3_k2(w16_get_le64(p + 8));
    m->h2 = rotl64(m->h2, 31) + m->h1;
    m->h2 = m->h2 * 5 + 0x38495ab5;
}

static void mm3_init(mm3_t *m) { memset(m, 0, sizeof *m); }

static void mm3_update(mm3_t *m, const void *data, size_t n)
{
    const unsigned char *p = data;
    m->total += n;
    if (m->nbuf) {
        size_t take = 16 - m->nbuf < n ? 16 - m->nbuf : n;
        memcpy(m->buf + m->nbuf, p, take);
        m->nbuf += take;
        p += take;
        n -= take;
        if (m->nbuf < 16)
            return;
        mm3_block(m, m->buf);
        m->nbuf = 0;
    }
    for (; n >= 16; p += 16, n -= 16)
        mm3_block(m, p);
    if (n) /* p may be NULL for an empty input */
        memcpy(m->buf, p, n);
    m->nbuf = n;
}

static w16_key_t mm3_final(const mm3_t *m)
{
    uint64_t h1 = m->h1, h2 = m->h2, k1 = 0, k2 = 0;
    for (size_t i = m->nbuf; i > 8; i--)
        k2 = (k2 << 8) | m->buf[i - 1];
    for (size_t i = m->nbuf < 8 ? m->nbuf : 8; i > 0; i--)
        k1 = (k1 << 8) | m->buf[i - 1];
    if (m->nbuf > 8)
        h2 ^= mm3_k2(k2);
    if (m->nbuf > 0)
        h1 ^= mm3_k1(k1);
    h1 ^= m->total;
    h2 ^= m->total;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    return (w16_key_t){.lo = h1, .hi = h2};
}

w16_key_t w16_hash_builtin128(const void *data, size_t n)
{
    mm3_t m;
    mm3_init(&m);
    mm3_update(&m, data, n);
    return mm3_final(&m);
}

/* ---- the hash in use --------------------------------------------------------- */

#if W16_USE_XXH3
typedef XXH3_state_t hstate_t;
static void h_init(hstate_t *s)
{
    XXH3_INITSTATE(s);
    XXH3_128bits_reset(s);
}
static void h_update(hstate_t *s, const void *p, size_t n)
{
    XXH3_128bits_update(s, p, n);
}
static w16_key_t h_final(const hstate_t *s)
{
    XXH128_hash_t h = XXH3_128bits_digest(s);
    return (w16_key_t){.lo = h.low64, .hi = h.high64};
}
uint64_t w16_hash64(const void *p, size_t n) { return XXH3_64bits(p, n); }
int w16_hash_algo(void) { return 1; }
#else
typedef mm3_t hstate_t;
static void h_init(hstate_t *s) { mm3_init(s); }
static void h_update(hstate_t *s, const void *p, size_t n)
{
    mm3_update(s, p, n);
}
static w16_key_t h_final(const hstate_t *s) { return mm3_final(s); }
uint64_t w16_hash64(const void *p, size_t n)
{
    return w16_hash_builtin128(p, n).lo;
}
int w16_hash_algo(void) { return 2; }
#endif

_Static_assert(sizeof(hstate_t) <= sizeof(((w16_keyer_t *)0)->opaque_),
               "w16_keyer_t too small for the hash state");
_Static_assert(_Alignof(hstate_t) <= 64, "w16_keyer_t under-aligned");

const char *w16_hash_name(void)
{
    return W16_USE_XXH3 ? "xxh3" : "builtin";
}

/* ---- keys ------------------------------------------------------------------------ */

/* Field tags: a field is tag, u64 length (LE), bytes. The tag keeps a
 * string and a number of the same bytes apart. */
enum { FIELD_BYTES = 'b', FIELD_STR = 's', FIELD_NULL = 'n', FIELD_U64 = 'u' };

/* Fed first: changing how keys are framed must change every key. */
static const char KEY_DOMAIN[] = "wna16 kernel key v1";

static hstate_t *keyer_state(w16_keyer_t *k) { return (hstate_t *)k->opaque_; }

static void keyer_field(w16_keyer_t *k, int tag, const void *data, size_t n)
{
    unsigned char head[9];
    head[0] = (unsigned char)tag;
    w16_put_le64(head + 1, n);
    h_update(keyer_state(k), head, sizeof head);
    if (n)
        h_update(keyer_state(k), data, n);
}

void w16_keyer_init(w16_keyer_t *k)
{
    h_init(keyer_state(k));
    keyer_field(k, FIELD_STR, KEY_DOMAIN, sizeof KEY_DOMAIN - 1);
}

void w16_keyer_bytes(w16_keyer_t *k, const void *data, size_t n)
{
    keyer_field(k, FIELD_BYTES, data, n);
}

void w16_keyer_str(w16_keyer_t *k, const char *s)
{
    if (s)
        keyer_field(k, FIELD_STR, s, strlen(s));
    else
        keyer_field(k, FIELD_NULL, NULL, 0);
}

void w16_keyer_u64(w16_keyer_t *k, uint64_t v)
{
    unsigned char b[8];
    w16_put_le64(b, v);
    keyer_field(k, FIELD_U64, b, sizeof b);
}

w16_key_t w16_keyer_done(w16_keyer_t *k) { return h_final(keyer_state(k)); }

void w16_key_hex(w16_key_t key, char out[W16_KEY_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[i] = digits[(key.hi >> (60 - 4 * i)) & 15];
        out[16 + i] = digits[(key.lo >> (60 - 4 * i)) & 15];
    }
    out[32] = '\0';
}

bool w16_key_equal(w16_key_t a, w16_key_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}
