/*
 * spec_registry.c - the context's registry of loaded specs: the built-in
 * specs embedded at build time and those of a spec directory, loaded at
 * w16_specs_init (a later spec replaces an earlier one of the same kind
 * and name); specs loaded from a file or text through the API; lookup by
 * name and the public wna16_spec_* accessors. Parsing and validation are
 * the loader's (spec_load.c), which never calls back into this file.
 */
#define _POSIX_C_SOURCE 200809L
#include "spec/spec_load.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct w16_spec_registry {
    wna16_spec_t **items;
    size_t count, cap;
};

static wna16_status_t registry_add(wna16_context_t *ctx, wna16_spec_t *s,
                                   wna16_error_t *err)
{
    w16_spec_registry_t *r = ctx->specs;
    for (size_t i = 0; i < r->count; i++) {
        if (r->items[i]->kind == s->kind &&
            strcmp(r->items[i]->name, s->name) == 0) {
            /* A later spec with the same name replaces the earlier one. */
            w16_spec_free(r->items[i]);
            r->items[i] = s;
            return WNA16_OK;
        }
    }
    if (r->count == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        wna16_spec_t **n = w16_realloc(ctx, r->items, r->cap * sizeof *n,
                                       cap * sizeof *n);
        if (!n)
            return w16_err_nomem(err, "registering a spec");
        r->items = n;
        r->cap = cap;
    }
    r->items[r->count++] = s;
    return WNA16_OK;
}

static wna16_status_t load_text(wna16_context_t *ctx, const char *origin,
                                const char *text, size_t len, bool check,
                                const wna16_spec_t **out, wna16_error_t *err)
{
    wna16_spec_t *s;
    wna16_status_t st =
        check ? w16_spec_parse(ctx, origin, text, len, &s, err)
              : w16_spec_parse_builtin(ctx, origin, text, len, &s, err);
    if (st != WNA16_OK)
        return st;
    st = registry_add(ctx, s, err);
    if (st != WNA16_OK) {
        w16_spec_free(s);
        return st;
    }
    if (out)
        *out = s;
    return WNA16_OK;
}

wna16_status_t wna16_spec_load_text(wna16_context_t *ctx, const char *origin,
                                    const char *text, size_t len,
                                    const wna16_spec_t **out,
                                    wna16_error_t *err)
{
    if (!ctx || !text || !origin)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_spec_load_text: ctx, origin and text are required");
    return load_text(ctx, origin, text, len, true, out, err);
}

static wna16_status_t read_file(wna16_context_t *ctx, const char *path,
                                char **text, size_t *len, wna16_error_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return w16_err(err, WNA16_EIO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat stt;
    if (fstat(fileno(f), &stt) != 0 || !S_ISREG(stt.st_mode)) {
        fclose(f);
        return w16_err(err, WNA16_EIO, "%s: not a regular file", path);
    }
    if (stt.st_size > (16 << 20)) {
        fclose(f);
        return w16_err(err, WNA16_ESPEC, "%s: larger than 16 MiB", path);
    }
    size_t n = (size_t)stt.st_size;
    char *buf = w16_alloc(ctx, n + 1);
    if (!buf) {
        fclose(f);
        return w16_err_nomem(err, "reading a spec");
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        w16_free(ctx, buf, n + 1);
        return w16_err(err, WNA16_EIO, "%s: short read", path);
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return WNA16_OK;
}

wna16_status_t wna16_spec_load_file(wna16_context_t *ctx, const char *path,
                                    const wna16_spec_t **out,
                                    wna16_error_t *err)
{
    char *text;
    size_t len;
    if (!ctx || !path)
        return w16_err(err, WNA16_EINVAL, "wna16_spec_load_file: ctx and path "
                       "are required");
    wna16_status_t st = read_file(ctx, path, &text, &len, err);
    if (st != WNA16_OK)
        return st;
    st = wna16_spec_load_text(ctx, path, text, len, out, err);
    w16_free(ctx, text, len + 1);
    return st;
}

wna16_status_t wna16_spec_validate_file(wna16_context_t *ctx, const char *path,
                                        wna16_error_t *err)
{
    char *text;
    size_t len;
    if (!ctx || !path)
        return w16_err(err, WNA16_EINVAL, "wna16_spec_validate_file: ctx and "
                       "path are required");
    wna16_status_t st = read_file(ctx, path, &text, &len, err);
    if (st != WNA16_OK)
        return st;
    wna16_spec_t *s;
    st = w16_spec_parse(ctx, path, text, len, &s, err);
    w16_free(ctx, text, len + 1);
    if (st == WNA16_OK) {
        st = w16_spec_check_layouts(s, true, err);
        w16_spec_free(s);
    }
    return st;
}

/* Loads dir/formats/ then dir/backends/, files in name order. A directory
 * that does not exist, or holds neither, is an error: a mistyped path
 * would otherwise run silently on the built-in specs. */
static wna16_status_t load_dir(wna16_context_t *ctx, const char *dir,
                               wna16_error_t *err)
{
    static const char *const subdirs[] = {"formats", "backends"};
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return w16_err(err, errno == ENOENT ? WNA16_ENOTFOUND : WNA16_EIO,
                       "spec directory %s (spec_dir or $WNA16_SPEC_DIR): %s",
                       dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return w16_err(err, WNA16_EINVAL, "spec directory %s (spec_dir or "
                       "$WNA16_SPEC_DIR): not a directory", dir);
    int found = 0;
    for (size_t s = 0; s < 2; s++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, subdirs[s]);
        DIR *d = opendir(path);
        if (!d) {
            if (errno == ENOENT)
                continue;
            return w16_err(err, WNA16_EIO, "%s: cannot open: %s", path,
                           strerror(errno));
        }
        found++;
        char names[256][256];
        int n = 0;
        struct dirent *de;
        while ((de = readdir(d)) && n < 256) {
            size_t l = strlen(de->d_name);
            if (l > 5 && l < 256 && strcmp(de->d_name + l - 5, ".json") == 0)
                memcpy(names[n++], de->d_name, l + 1);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof names[0],
              (int (*)(const void *, const void *))strcmp);
        for (int i = 0; i < n; i++) {
            char file[4096 + 260];
            snprintf(file, sizeof file, "%s/%s", path, names[i]);
            wna16_status_t st = wna16_spec_load_file(ctx, file, NULL, err);
            if (st != WNA16_OK)
                return st;
        }
    }
    if (!found)
        return w16_err(err, WNA16_ENOTFOUND, "spec directory %s (spec_dir or "
                       "$WNA16_SPEC_DIR) holds neither formats/ nor "
                       "backends/", dir);
    return WNA16_OK;
}

wna16_status_t w16_specs_init(wna16_context_t *ctx, bool builtin,
                              const char *dir, wna16_error_t *err)
{
    ctx->specs = w16_calloc(ctx, 1, sizeof *ctx->specs);
    if (!ctx->specs)
        return w16_err_nomem(err, "creating the spec registry");
    if (builtin) {
        for (const w16_embedded_spec_t *e = w16_embedded_specs; e->origin; e++) {
            wna16_status_t st = load_text(ctx, e->origin, e->text, e->len,
                                          false, NULL, err);
            if (st != WNA16_OK)
                return st;
        }
    }
    return dir ? load_dir(ctx, dir, err) : WNA16_OK;
}

void w16_specs_fini(wna16_context_t *ctx)
{
    w16_spec_registry_t *r = ctx->specs;
    if (!r)
        return;
    for (size_t i = 0; i < r->count; i++)
        w16_spec_free(r->items[i]);
    w16_free(ctx, r->items, r->cap * sizeof *r->items);
    w16_free(ctx, r, sizeof *r);
    ctx->specs = NULL;
}

size_t wna16_spec_count(const wna16_context_t *ctx)
{
    return ctx && ctx->specs ? ctx->specs->count : 0;
}

const wna16_spec_t *wna16_spec_at(const wna16_context_t *ctx, size_t index)
{
    return index < wna16_spec_count(ctx) ? ctx->specs->items[index] : NULL;
}

const wna16_spec_t *wna16_spec_find(const wna16_context_t *ctx,
                                    wna16_spec_kind_t kind, const char *name)
{
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *s = ctx->specs->items[i];
        if ((kind == 0 || s->kind == kind) && strcmp(s->name, name) == 0)
            return s;
    }
    return NULL;
}

wna16_spec_kind_t wna16_spec_kind(const wna16_spec_t *s) { return s->kind; }
const char *wna16_spec_name(const wna16_spec_t *s) { return s->name; }
const char *wna16_spec_title(const wna16_spec_t *s) { return s->title; }
const char *wna16_spec_description(const wna16_spec_t *s) { return s->description; }
const char *wna16_spec_origin(const wna16_spec_t *s) { return s->origin; }
