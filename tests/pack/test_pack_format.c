/*
 * test_pack_format.c - the kernel pack format (runtime/cache/pack.c) and a
 * context's packs (runtime/cache/pack_set.c), without any compiler: packs
 * of made-up entries written through runtime/pack.c, then read back,
 * searched, damaged and refused. Runs against the ASan+UBSan library: it
 * parses damaged files.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "testutil.h"
#include "gen/request_key.h"
#include "runtime/cache/pack.h"
#include "runtime/pack.h"

#include <stdlib.h>
#include <string.h>

static w16_key_t key_of(int i)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_u64(&kr, (uint64_t)i);
    return w16_keyer_done(&kr);
}

typedef struct fixture {
    w16_pack_item_t items[40];
    unsigned char data[40][300];
    char names[40][32];
    int n;
} fixture_t;

/* n entries: request i, target cpu, arch x86-64-v3 or -v4 by parity,
 * bytes i-dependent (entry 0 empty). */
static void make_items(fixture_t *f, int n)
{
    f->n = n;
    for (int i = 0; i < n; i++) {
        size_t size = (size_t)(i * 7) % 300;
        for (size_t b = 0; b < size; b++)
            f->data[i][b] = (unsigned char)(i * 31 + (int)b);
        snprintf(f->names[i], sizeof f->names[i], "kernel_%d", i);
        f->items[i] = (w16_pack_item_t){
            .request = key_of(i), .name = f->names[i], .symbol = f->names[i],
            .target = "cpu", .arch = i % 2 ? "x86-64-v4" : "x86-64-v3",
            .family = i < n / 2 ? "first" : "second", .data = f->data[i],
            .size = size};
    }
}

static const char *write_pack(wna16_context_t *ctx, const char *dir,
                              const char *name, const fixture_t *f,
                              const char *generator)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    wna16_error_t err;
    uint64_t bytes = 0;
    TU_OK(w16_pack_write(ctx, path, "test", generator, "none", f->items,
                         (size_t)f->n, &bytes, &err), &err);
    TU_CHECK(bytes > W16_PACK_HEADER_SIZE);
    return path;
}

static void test_roundtrip(wna16_context_t *ctx, const char *dir)
{
    fixture_t f;
    make_items(&f, 33);
    const char *path = write_pack(ctx, dir, "a.w16pack", &f,
                                  w16_generator_version());
    w16_pack_t *p = NULL;
    wna16_error_t err;
    TU_OK(w16_pack_open(path, &p, &err), &err);
    if (!p)
        return;
    w16_pack_info_t in;
    w16_pack_get_info(p, &in);
    TU_CHECK(in.entries == 33 && in.format_version == W16_PACK_FORMAT_VERSION);
    TU_CHECK(strcmp(in.generator, w16_generator_version()) == 0);
    TU_CHECK(strcmp(in.name, "test") == 0 && strcmp(in.compilers, "none") == 0);
    /* sorted, and each item found with its own bytes */
    for (uint32_t i = 1; i < in.entries; i++) {
        w16_pack_entry_t a, b;
        w16_pack_entry(p, i - 1, &a);
        w16_pack_entry(p, i, &b);
        TU_CHECK(a.key.hi < b.key.hi || (a.key.hi == b.key.hi && a.key.lo < b.key.lo));
    }
    for (int i = 0; i < f.n; i++) {
        uint32_t at;
        w16_key_t k = w16_pack_entry_key(f.items[i].request, "cpu",
                                         f.items[i].arch);
        TU_CHECK(w16_pack_find(p, k, &at));
        w16_pack_entry_t e;
        w16_pack_entry(p, at, &e);
        TU_CHECK(e.size == f.items[i].size &&
                 memcmp(e.data, f.data[i], e.size) == 0);
        TU_CHECK(((uintptr_t)e.data % W16_PACK_ALIGN) == 0);
        TU_CHECK(strcmp(e.name, f.names[i]) == 0 &&
                 strcmp(e.arch, f.items[i].arch) == 0 &&
                 strcmp(e.family, f.items[i].family) == 0);
        TU_CHECK(w16_pack_entry_intact(p, at));
        /* the other architecture's key is absent */
        uint32_t none;
        TU_CHECK(!w16_pack_find(p, w16_pack_entry_key(f.items[i].request,
                                                      "cpu", "x86-64"), &none));
    }
    w16_pack_close(p);
}

/* The same entries in another order, and repeated, give the same bytes. */
static void test_deterministic(wna16_context_t *ctx, const char *dir)
{
    fixture_t f, g;
    make_items(&f, 20);
    make_items(&g, 20);
    for (int i = 0; i < 20; i++) /* reversed, and entry 3 twice */
        g.items[i] = f.items[19 - i];
    const char *pa = write_pack(ctx, dir, "d1.w16pack", &f, "gen");
    char a[4096];
    snprintf(a, sizeof a, "%s", pa);
    fixture_t h = g;
    h.items[h.n++] = f.items[3];
    const char *pb = write_pack(ctx, dir, "d2.w16pack", &h, "gen");
    size_t na, nb;
    void *da = tu_read_file(a, &na), *db = tu_read_file(pb, &nb);
    TU_CHECK(da && db && na == nb && memcmp(da, db, na) == 0);
    free(da);
    free(db);
}

/* Damage of every kind is refused with a message naming the file. */
static void test_damage(wna16_context_t *ctx, const char *dir)
{
    fixture_t f;
    make_items(&f, 10);
    const char *path = write_pack(ctx, dir, "good.w16pack", &f, "gen");
    size_t n;
    unsigned char *good = tu_read_file(path, &n);
    TU_CHECK(good != NULL);
    if (!good)
        return;
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/bad.w16pack", dir);
    wna16_error_t err;
    w16_pack_t *p = NULL;
    struct {
        const char *what;
        size_t at;       /* byte flipped, or SIZE_MAX */
        size_t len;      /* bytes written */
        const char *msg; /* expected in the message */
    } cases[] = {
        {"magic", 0, n, "not a wna16 kernel pack"},
        {"version", 8, n, "pack format version"},
        {"truncated", SIZE_MAX, n - 1, "truncated"},
        {"header only", SIZE_MAX, 100, "truncated"},
        {"index", W16_PACK_HEADER_SIZE + 20, n, "damaged"},
        {"strings", W16_PACK_HEADER_SIZE + 10 * W16_PACK_ENTRY_SIZE + 2, n,
         "damaged"},
        {"empty", SIZE_MAX, 0, "empty file"},
    };
    unsigned char *copy = malloc(n);
    for (size_t c = 0; copy && c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(copy, good, n);
        if (cases[c].at != SIZE_MAX)
            copy[cases[c].at] ^= 0x40;
        TU_CHECK(tu_write_file(bad, copy, cases[c].len) == 0);
        wna16_status_t st = w16_pack_open(bad, &p, &err);
        TU_CHECK_MSG(st == WNA16_EFORMAT && p == NULL, "%s: %d", cases[c].what,
                     (int)st);
        TU_CHECK_MSG(strstr(err.message, cases[c].msg) &&
                     strstr(err.message, bad), "%s: %s", cases[c].what,
                     err.message);
    }
    /* a damaged payload opens; the entry alone is refused */
    memcpy(copy, good, n);
    copy[n - 1] ^= 1; /* the last entry's last byte */
    TU_CHECK(tu_write_file(bad, copy, n) == 0);
    TU_OK(w16_pack_open(bad, &p, &err), &err);
    int intact = 0;
    for (uint32_t i = 0; p && i < w16_pack_count(p); i++)
        intact += w16_pack_entry_intact(p, i);
    TU_CHECK(intact == 9);
    w16_pack_close(p);
    /* not a file, not there */
    TU_CHECK(w16_pack_open(dir, &p, &err) == WNA16_EIO &&
             strstr(err.message, "directory"));
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/missing.w16pack", dir);
    TU_CHECK(w16_pack_open(missing, &p, &err) == WNA16_ENOTFOUND &&
             strstr(err.message, missing));
    free(copy);
    free(good);
    (void)ctx;
}

/* ---- a context's packs ---------------------------------------------------- */

typedef struct logs {
    int info, warn;
    char last[1024];
} logs_t;

static void log_fn(void *user, wna16_log_level_t level, const char *msg)
{
    logs_t *l = user;
    if (level == WNA16_LOG_INFO)
        l->info++;
    if (level == WNA16_LOG_WARN)
        l->warn++;
    snprintf(l->last, sizeof l->last, "%s", msg);
}

static void test_set(const char *dir)
{
    fixture_t f;
    make_items(&f, 12);
    wna16_context_t *ctx = NULL;
    logs_t logs = {0};
    wna16_context_options_t o = {.log = log_fn, .log_user = &logs,
                                 .log_level = WNA16_LOG_INFO,
                                 .log_level_set = true};
    wna16_error_t err;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    char mine[4096], other[4096];
    snprintf(mine, sizeof mine, "%s", write_pack(ctx, dir, "mine.w16pack", &f,
                                                 w16_generator_version()));
    snprintf(other, sizeof other, "%s", write_pack(ctx, dir, "old.w16pack",
                                                   &f, "0.0.1+gen.0"));
    unsetenv("WNA16_PACK_PATH");
    /* a pack of another generator: kept, skipped, said once */
    TU_OK(wna16_context_add_pack(ctx, other, &err), &err);
    TU_CHECK(logs.warn == 1 && strstr(logs.last, "0.0.1+gen.0") &&
             strstr(logs.last, "skipped"));
    w16_pack_hit_t hit;
    bool found = true;
    const char *v4[] = {"x86-64-v4", "x86-64-v3"}, *v3[] = {"x86-64-v3"};
    TU_OK(w16_packs_find(ctx, f.items[1].request, "cpu", v4, 2, &hit, &found,
                         &err), &err);
    TU_CHECK(!found);
    TU_CHECK(!w16_packs_have(ctx, "cpu"));
    TU_OK(wna16_context_add_pack(ctx, mine, &err), &err);
    TU_CHECK(w16_packs_have(ctx, "cpu") && !w16_packs_have(ctx, "cuda"));
    /* entry 1 is for v4: found with v4 first, the arch of the hit */
    TU_OK(w16_packs_find(ctx, f.items[1].request, "cpu", v4, 2, &hit, &found,
                         &err), &err);
    TU_CHECK(found && strcmp(hit.entry.arch, "x86-64-v4") == 0 &&
             strcmp(hit.pack_path, mine) == 0);
    /* a CPU without v4: not found, and the skipped entries said once */
    int info = logs.info;
    TU_OK(w16_packs_find(ctx, f.items[1].request, "cpu", v3, 1, &hit, &found,
                         &err), &err);
    TU_CHECK(!found && logs.info == info + 1 &&
             strstr(logs.last, "6 cpu entries for x86-64-v4 are skipped"));
    TU_OK(w16_packs_find(ctx, f.items[3].request, "cpu", v3, 1, &hit, &found,
                         &err), &err);
    TU_CHECK(!found && logs.info == info + 1);
    TU_OK(w16_packs_find(ctx, f.items[2].request, "cpu", v3, 1, &hit, &found,
                         &err), &err);
    TU_CHECK(found && strcmp(hit.entry.arch, "x86-64-v3") == 0);
    /* not a pack: a clear error, nothing added */
    char junk[4096];
    snprintf(junk, sizeof junk, "%s/junk.w16pack", dir);
    TU_CHECK(tu_write_file(junk, "not a pack at all, just text\n", 29) == 0);
    TU_CHECK(wna16_context_add_pack(ctx, junk, &err) == WNA16_EFORMAT &&
             strstr(err.message, "not a wna16 kernel pack"));
    TU_CHECK(wna16_context_add_pack(ctx, NULL, &err) == WNA16_EINVAL);
    wna16_context_destroy(ctx);

    /* WNA16_PACK_PATH: read at the first lookup; a path in it that is not a
     * pack fails every lookup, naming the variable and the file */
    char env[9000];
    snprintf(env, sizeof env, "%s::%s", mine, junk);
    setenv("WNA16_PACK_PATH", env, 1);
    TU_OK(wna16_context_create(NULL, &ctx, &err), &err);
    for (int i = 0; ctx && i < 2; i++) {
        TU_CHECK(w16_packs_find(ctx, f.items[2].request, "cpu", v3, 1, &hit,
                                &found, &err) == WNA16_EFORMAT);
        TU_CHECK(strstr(err.message, "WNA16_PACK_PATH") &&
                 strstr(err.message, junk));
    }
    wna16_context_destroy(ctx);
    snprintf(env, sizeof env, "%s", mine);
    setenv("WNA16_PACK_PATH", env, 1);
    TU_OK(wna16_context_create(NULL, &ctx, &err), &err);
    TU_OK(w16_packs_find(ctx, f.items[2].request, "cpu", v3, 1, &hit, &found,
                         &err), &err);
    TU_CHECK(found);
    wna16_context_destroy(ctx);
    unsetenv("WNA16_PACK_PATH");
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    const char *d = tu_tempdir("pack_format");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", d);
    test_roundtrip(ctx, dir);
    test_deterministic(ctx, dir);
    test_damage(ctx, dir);
    test_set(dir);
    wna16_context_destroy(ctx);
    return tu_finish("pack_format");
}
