/*
 * pack_set.c - the packs a context searches (see pack.h): those of
 * $WNA16_PACK_PATH, read at the first lookup, then those added with
 * wna16_context_add_pack, each mapped once for the context's life, and
 * the memory table of kernels loaded from them. Lookups take one mutex
 * and a binary search per pack and architecture: well under a
 * microsecond for packs of thousands of entries.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, strdup */
#include "runtime/cache/cache.h"
#include "runtime/cache/pack.h"
#include "gen/request_key.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct set_pack {
    w16_pack_t *pack;
    w16_pack_info_t info;
    bool skipped; /* another generator or hash: never searched */
    /* targets whose other-architecture entries were already counted */
    char noted[8][16];
    int n_noted;
} set_pack_t;

typedef struct w16_pack_set {
    pthread_mutex_t mu;
    set_pack_t *packs;
    int n, cap;
    bool env_read;
    wna16_error_t env_err; /* WNA16_PACK_PATH's failure, sticky */
    w16_cache_t *loaded;
    /* w16_pack_arch_key of the (target, arch) pairs looked up so far */
    struct {
        char target[16], arch[24];
        w16_key_t key;
    } arch_keys[32];
    int n_arch_keys;
} w16_pack_set_t;

/* The key of (target, arch), remembered (under s->mu). */
static w16_key_t arch_key(w16_pack_set_t *s, const char *target,
                          const char *arch)
{
    for (int i = 0; i < s->n_arch_keys; i++)
        if (strcmp(s->arch_keys[i].arch, arch) == 0 &&
            strcmp(s->arch_keys[i].target, target) == 0)
            return s->arch_keys[i].key;
    w16_key_t k = w16_pack_arch_key(target, arch);
    if (s->n_arch_keys < 32 && strlen(target) < 16 && strlen(arch) < 24) {
        int i = s->n_arch_keys++;
        strcpy(s->arch_keys[i].target, target);
        strcpy(s->arch_keys[i].arch, arch);
        s->arch_keys[i].key = k;
    }
    return k;
}

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

static w16_pack_set_t *set_get(wna16_context_t *ctx)
{
    pthread_mutex_lock(&init_mu);
    w16_pack_set_t *s = ctx->packs;
    if (!s && (s = calloc(1, sizeof *s)) != NULL) {
        pthread_mutex_init(&s->mu, NULL);
        ctx->packs = s;
    }
    pthread_mutex_unlock(&init_mu);
    return s;
}

/* Adds an open pack (under s->mu). */
static wna16_status_t set_push(wna16_context_t *ctx, w16_pack_set_t *s,
                               w16_pack_t *p, wna16_error_t *err)
{
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 4;
        set_pack_t *np = realloc(s->packs, sizeof *np * (size_t)nc);
        if (!np) {
            w16_pack_close(p);
            return w16_err_nomem(err, "adding a kernel pack");
        }
        s->packs = np;
        s->cap = nc;
    }
    set_pack_t *sp = &s->packs[s->n++];
    *sp = (set_pack_t){.pack = p};
    w16_pack_get_info(p, &sp->info);
    char key[600];
    if (sp->info.hash_algo != w16_hash_algo()) {
        sp->skipped = true;
        snprintf(key, sizeof key, "pack_hash:%s", sp->info.path);
        w16_log_once(ctx, WNA16_LOG_WARN, key, "kernel pack %s: its %u "
                     "entries are skipped: built with hash algorithm %d, "
                     "this library uses %d (%s)", sp->info.path,
                     sp->info.entries, sp->info.hash_algo, w16_hash_algo(),
                     w16_hash_name());
    } else if (strcmp(sp->info.generator, w16_generator_version()) != 0) {
        sp->skipped = true;
        snprintf(key, sizeof key, "pack_gen:%s", sp->info.path);
        w16_log_once(ctx, WNA16_LOG_WARN, key, "kernel pack %s: its %u "
                     "entries are skipped: built by generator %s, this "
                     "library is %s (rebuild the pack with this wna16)",
                     sp->info.path, sp->info.entries, sp->info.generator,
                     w16_generator_version());
    }
    return WNA16_OK;
}

static wna16_status_t read_env(wna16_context_t *ctx, w16_pack_set_t *s,
                               wna16_error_t *err)
{
    if (s->env_read)
        return s->env_err.status == WNA16_OK
                   ? WNA16_OK
                   : w16_err(err, s->env_err.status, "%s", s->env_err.message);
    s->env_read = true;
    const char *v = getenv("WNA16_PACK_PATH");
    if (!v || !*v)
        return WNA16_OK;
    char *copy = strdup(v), *save = NULL;
    if (!copy)
        return w16_err_nomem(err, "reading WNA16_PACK_PATH");
    wna16_status_t st = WNA16_OK;
    for (char *tok = strtok_r(copy, ":", &save); tok && st == WNA16_OK;
         tok = strtok_r(NULL, ":", &save)) {
        w16_pack_t *p = NULL;
        st = w16_pack_open(tok, &p, &s->env_err);
        if (st == WNA16_OK)
            st = set_push(ctx, s, p, &s->env_err);
    }
    free(copy);
    if (st != WNA16_OK) {
        char msg[WNA16_ERROR_MESSAGE_MAX];
        snprintf(msg, sizeof msg, "%s", s->env_err.message);
        w16_err(&s->env_err, st, "WNA16_PACK_PATH: %s", msg);
        return w16_err(err, st, "%s", s->env_err.message);
    }
    return WNA16_OK;
}

wna16_status_t w16_packs_add(wna16_context_t *ctx, const char *path,
                             wna16_error_t *err)
{
    w16_pack_set_t *s = set_get(ctx);
    if (!s)
        return w16_err_nomem(err, "adding a kernel pack");
    w16_pack_t *p = NULL;
    wna16_status_t st = w16_pack_open(path, &p, err);
    if (st != WNA16_OK)
        return st;
    pthread_mutex_lock(&s->mu);
    st = set_push(ctx, s, p, err);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Says once per pack and target which architectures of its entries this
 * device cannot use (under s->mu). */
static void note_other_arches(wna16_context_t *ctx, set_pack_t *sp,
                              const char *target, const char *const *arches,
                              int n_arches)
{
    for (int i = 0; i < sp->n_noted; i++)
        if (strcmp(sp->noted[i], target) == 0)
            return;
    if (sp->n_noted < 8)
        snprintf(sp->noted[sp->n_noted++], sizeof sp->noted[0], "%s", target);
    char key[700];
    snprintf(key, sizeof key, "pack_arch:%s:%s", sp->info.path, target);
    /* w16_log_once remembers the key; build the message only once */
    char others[300] = "";
    uint32_t count = 0;
    for (uint32_t i = 0; i < sp->info.entries; i++) {
        w16_pack_entry_t e;
        w16_pack_entry(sp->pack, i, &e);
        if (strcmp(e.target, target) != 0)
            continue;
        bool usable = false;
        for (int a = 0; a < n_arches && !usable; a++)
            usable = strcmp(e.arch, arches[a]) == 0;
        if (usable)
            continue;
        count++;
        if (!strstr(others, e.arch) && strlen(others) + strlen(e.arch) + 3 <
                                           sizeof others)
            snprintf(others + strlen(others), sizeof others - strlen(others),
                     "%s%s", others[0] ? ", " : "", e.arch);
    }
    if (!count)
        return;
    char usable[200] = "";
    for (int a = 0; a < n_arches; a++)
        snprintf(usable + strlen(usable), sizeof usable - strlen(usable),
                 "%s%s", a ? ", " : "", arches[a]);
    w16_log_once(ctx, WNA16_LOG_INFO, key, "kernel pack %s: %u %s entries "
                 "for %s are skipped: this %s runs %s", sp->info.path, count,
                 target, others, target, usable[0] ? usable : "none");
}

wna16_status_t w16_packs_find(wna16_context_t *ctx, w16_key_t request,
                              const char *target, const char *const *arches,
                              int n_arches, w16_pack_hit_t *hit, bool *found,
                              wna16_error_t *err)
{
    *found = false;
    w16_pack_set_t *s = set_get(ctx);
    if (!s)
        return w16_err_nomem(err, "looking up kernel packs");
    pthread_mutex_lock(&s->mu);
    wna16_status_t st = read_env(ctx, s, err);
    for (int i = 0; st == WNA16_OK && i < s->n && !*found; i++) {
        set_pack_t *sp = &s->packs[i];
        if (sp->skipped)
            continue;
        for (int a = 0; a < n_arches && !*found; a++) {
            w16_key_t ak = arch_key(s, target, arches[a]);
            w16_key_t k = {.lo = request.lo ^ ak.lo, .hi = request.hi ^ ak.hi};
            uint32_t idx;
            if (w16_pack_find(sp->pack, k, &idx)) {
                *found = true;
                hit->pack = sp->pack;
                hit->pack_path = sp->info.path;
                hit->index = idx;
                w16_pack_entry(sp->pack, idx, &hit->entry);
            }
        }
        if (!*found)
            note_other_arches(ctx, sp, target, arches, n_arches);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

bool w16_packs_have(wna16_context_t *ctx, const char *target)
{
    w16_pack_set_t *s = set_get(ctx);
    if (!s)
        return false;
    bool have = false;
    pthread_mutex_lock(&s->mu);
    wna16_error_t e;
    if (read_env(ctx, s, &e) == WNA16_OK)
        for (int i = 0; i < s->n && !have; i++) {
            if (s->packs[i].skipped)
                continue;
            for (uint32_t j = 0; j < s->packs[i].info.entries && !have; j++) {
                w16_pack_entry_t en;
                w16_pack_entry(s->packs[i].pack, j, &en);
                have = strcmp(en.target, target) == 0;
            }
        }
    pthread_mutex_unlock(&s->mu);
    return have;
}

wna16_status_t w16_packs_loaded(wna16_context_t *ctx, w16_cache_t **out,
                                wna16_error_t *err)
{
    w16_pack_set_t *s = set_get(ctx);
    if (!s)
        return w16_err_nomem(err, "looking up kernel packs");
    pthread_mutex_lock(&s->mu);
    if (!s->loaded) {
        w16_cache_options_t o = {.memory_only = true};
        s->loaded = w16_cache_create(ctx, &o, err);
    }
    *out = s->loaded;
    pthread_mutex_unlock(&s->mu);
    return *out ? WNA16_OK : (err ? err->status : WNA16_ENOMEM);
}

void w16_packs_free(wna16_context_t *ctx)
{
    w16_pack_set_t *s = ctx->packs;
    if (!s)
        return;
    w16_cache_destroy(s->loaded);
    for (int i = 0; i < s->n; i++)
        w16_pack_close(s->packs[i].pack);
    free(s->packs);
    pthread_mutex_destroy(&s->mu);
    free(s);
    ctx->packs = NULL;
}

wna16_status_t w16_pack_hit_fetch(wna16_context_t *ctx,
                                  const w16_pack_hit_t *hit, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    const w16_pack_entry_t *e = &hit->entry;
    if (!w16_pack_entry_intact(hit->pack, hit->index))
        return w16_err(err, WNA16_EFORMAT, "kernel pack %s: entry %s (%s %s) "
                       "is damaged (checksum mismatch)", hit->pack_path,
                       e->name, e->target, e->arch);
    w16_pack_hit_t *h = w16_alloc(ctx, sizeof *h);
    if (!h)
        return w16_err_nomem(err, "loading a packed kernel");
    *h = *hit;
    *blob = h;
    *size = sizeof *h;
    return WNA16_OK;
}
