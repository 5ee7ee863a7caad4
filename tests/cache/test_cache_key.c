/*
 * test_cache_key.c - cache keys: hex formatting, field framing (length
 * prefixes and type tags keep field boundaries in the key), pinned values
 * for fixed input (a changed value means every user's cache is silently
 * invalidated: bump it on purpose only), distinct keys for distinct
 * inputs, and the built-in fallback hash against the MurmurHash3_x64_128
 * reference vectors. Built twice: against the library's hash (XXH3 when
 * xxHash is present) and with cache.c compiled in using the built-in hash.
 */
#include "cache_test.h"

#include <stdlib.h>
#include <string.h>

#if defined(WNA16_HAVE_XXHASH)
#include <xxhash.h>
#endif

/* See test_pinned. */
#define PINNED_XXH3 "f8145ba6b116818a894c2fe8cb4f435f"
#define PINNED_BUILTIN "5f9008762bbedf99f174c41b1e82f5af"

static w16_key_t key_strs(const char *a, const char *b)
{
    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_str(&k, a);
    w16_keyer_str(&k, b);
    return w16_keyer_done(&k);
}

static w16_key_t key_bytes2(const char *a, const char *b)
{
    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_bytes(&k, a, strlen(a));
    w16_keyer_bytes(&k, b, strlen(b));
    return w16_keyer_done(&k);
}

static void test_hex(void)
{
    char hex[W16_KEY_HEX_SIZE];
    w16_key_t k = {.lo = 0x0123456789abcdefull, .hi = 0xfedcba9876543210ull};
    w16_key_hex(k, hex);
    TU_CHECK(strcmp(hex, "fedcba98765432100123456789abcdef") == 0);
    w16_key_hex((w16_key_t){0, 0}, hex);
    TU_CHECK(strcmp(hex, "00000000000000000000000000000000") == 0);
}

static void test_framing(void)
{
    TU_CHECK(!w16_key_equal(key_strs("ab", "c"), key_strs("a", "bc")));
    TU_CHECK(!w16_key_equal(key_strs("abc", ""), key_strs("", "abc")));
    TU_CHECK(!w16_key_equal(key_bytes2("ab", "c"), key_bytes2("a", "bc")));
    TU_CHECK(!w16_key_equal(key_strs("ab", "c"), key_bytes2("ab", "c")));
    TU_CHECK(!w16_key_equal(key_strs(NULL, "x"), key_strs("", "x")));
    TU_CHECK(w16_key_equal(key_strs("ab", "c"), key_strs("ab", "c")));

    /* A number and the same 8 bytes as a byte field differ. */
    w16_keyer_t k1, k2;
    w16_keyer_init(&k1);
    w16_keyer_u64(&k1, 0x0807060504030201ull);
    w16_keyer_init(&k2);
    w16_keyer_bytes(&k2, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    TU_CHECK(!w16_key_equal(w16_keyer_done(&k1), w16_keyer_done(&k2)));

    /* An empty keyer is a key too, distinct from one empty field. */
    w16_keyer_init(&k1);
    w16_keyer_init(&k2);
    w16_keyer_str(&k2, "");
    TU_CHECK(!w16_key_equal(w16_keyer_done(&k1), w16_keyer_done(&k2)));
}

/* The framing, spelled out: a keyer must equal the one-shot hash of
 * domain field + fields, each as tag, u64 LE length, bytes. */
static size_t frame(unsigned char *out, char tag, const void *p, size_t n)
{
    out[0] = (unsigned char)tag;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(out + 9, p, n);
    return 9 + n;
}

static w16_key_t oneshot(const void *p, size_t n)
{
#if defined(WNA16_HAVE_XXHASH)
    if (strcmp(w16_hash_name(), "xxh3") == 0) {
        XXH128_hash_t h = XXH3_128bits(p, n);
        return (w16_key_t){.lo = h.low64, .hi = h.high64};
    }
#endif
    return w16_hash_builtin128(p, n);
}

static void test_framing_spelled_out(void)
{
    /* Long fields cross the hashes' internal block and buffer sizes. */
    static unsigned char big[5000], buf[6000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 7 + 3);
    size_t n = frame(buf, 's', "wna16 kernel key v1", 19);
    n += frame(buf + n, 's', "marlin", 6);
    n += frame(buf + n, 'b', big, sizeof big);
    unsigned char le[8] = {42, 0, 0, 0, 0, 0, 0, 0};
    n += frame(buf + n, 'u', le, 8);
    n += frame(buf + n, 'n', "", 0);

    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_str(&k, "marlin");
    w16_keyer_bytes(&k, big, sizeof big);
    w16_keyer_u64(&k, 42);
    w16_keyer_str(&k, NULL);
    TU_CHECK(w16_key_equal(w16_keyer_done(&k), oneshot(buf, n)));
}

/* Fixed input -> fixed key. Changing either value invalidates every disk
 * cache in the field; do it only with intent. */
static void test_pinned(void)
{
    w16_keyer_t k;
    w16_keyer_init(&k);
    w16_keyer_str(&k, "backend marlin");
    w16_keyer_u64(&k, 4);
    w16_keyer_u64(&k, 128);
    w16_keyer_bytes(&k, "\x00\x01\x02\x03", 4);
    w16_keyer_str(&k, "sm_90");
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(w16_keyer_done(&k), hex);
    const char *expect = strcmp(w16_hash_name(), "xxh3") == 0
                             ? PINNED_XXH3
                             : PINNED_BUILTIN;
    TU_CHECK_MSG(strcmp(hex, expect) == 0, "%s key %s, pinned %s",
                 w16_hash_name(), hex, expect);
}

static int cmp_key(const void *a, const void *b)
{
    const w16_key_t *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void test_distinct(void)
{
    enum { N = 20000 };
    w16_key_t *keys = malloc(N * sizeof *keys);
    for (uint64_t i = 0; i < N; i++)
        keys[i] = ct_key(i);
    TU_CHECK(w16_key_equal(keys[7], ct_key(7))); /* deterministic */
    qsort(keys, N, sizeof *keys, cmp_key);
    int dups = 0, same_shard_bits = 0;
    for (size_t i = 1; i < N; i++)
        dups += w16_key_equal(keys[i - 1], keys[i]);
    /* The top 6 bits pick the cache shard: all 64 values must occur. */
    uint64_t seen = 0;
    for (size_t i = 0; i < N; i++)
        seen |= 1ull << (keys[i].hi >> 58);
    same_shard_bits = seen == ~0ull;
    TU_CHECK(dups == 0);
    TU_CHECK(same_shard_bits);
    free(keys);
}

static void check_vector(const char *s, uint64_t lo, uint64_t hi)
{
    w16_key_t k = w16_hash_builtin128(s, strlen(s));
    TU_CHECK_MSG(k.lo == lo && k.hi == hi, "'%s': %016llx %016llx", s,
                 (unsigned long long)k.lo, (unsigned long long)k.hi);
}

/* MurmurHash3_x64_128, seed 0: h1 = lo, h2 = hi. */
static void test_builtin_vectors(void)
{
    check_vector("", 0, 0);
    check_vector("hello", 0xcbd8a7b341bd9b02ull, 0x5b1e906a48ae1d19ull);
    check_vector("The quick brown fox jumps over the lazy dog",
                 0xe34bbc7bbc071b6cull, 0x7a433ca9c49a9347ull);
}

int main(void)
{
    printf("hash: %s\n", w16_hash_name());
    test_hex();
    test_framing();
    test_framing_spelled_out();
    test_pinned();
    test_distinct();
    test_builtin_vectors();
    return tu_finish("test_cache_key");
}
