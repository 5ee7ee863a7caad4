/*
 * st_test.c - see st_test.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "st_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

unsigned char *stt_build_len(uint64_t len_field, const char *header,
                             const void *data, size_t data_len, size_t *size)
{
    size_t hl = strlen(header);
    *size = 8 + hl + data_len;
    unsigned char *b = malloc(*size ? *size : 1);
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len_field >> (8 * i));
    memcpy(b + 8, header, hl);
    if (data_len)
        memcpy(b + 8 + hl, data, data_len);
    return b;
}

unsigned char *stt_build(const char *header, const void *data,
                         size_t data_len, size_t *size)
{
    return stt_build_len(strlen(header), header, data, data_len, size);
}

char *stt_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int stt_write_text(const char *dir, const char *name, const char *text)
{
    char *p = stt_path(dir, name);
    int rc = tu_write_file(p, text, strlen(text));
    free(p);
    return rc;
}

int stt_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

void stt_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char *p = stt_path(dir, e->d_name);
            if (unlink(p) != 0)
                rmdir(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

char *stt_tempdir(const char *tag)
{
    const char *t = tu_tempdir(tag);
    char *p = malloc(strlen(t) + 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    strcpy(p, t);
    return p;
}

void stt_expect_err_at(const char *file, int line, wna16_status_t st,
                       const wna16_error_t *err, wna16_status_t want,
                       const char *needle)
{
    tu_checks++;
    bool ok = st == want && err->status == want && err->message[0] &&
              (!needle || strstr(err->message, needle));
    if (!ok) {
        tu_failures++;
        fprintf(stderr, "%s:%d: expected %s with \"%s\", got %s: \"%s\"\n",
                file, line, wna16_status_name(want), needle ? needle : "",
                wna16_status_name(st), err->message);
    }
}

/* Each block carries its size in a 16-byte prefix. */
static void *ta_alloc(void *user, size_t size)
{
    stt_alloc_t *s = user;
    if (s->countdown == 0)
        return NULL;
    if (s->countdown > 0)
        s->countdown--;
    unsigned char *p = malloc(size + 16);
    if (!p)
        return NULL;
    memcpy(p, &size, sizeof size);
    s->live++;
    return p + 16;
}

static void ta_free(void *user, void *ptr, size_t size)
{
    stt_alloc_t *s = user;
    if (!ptr)
        return;
    unsigned char *p = (unsigned char *)ptr - 16;
    size_t got;
    memcpy(&got, p, sizeof got);
    if (got != size)
        s->size_mismatch++;
    s->live--;
    free(p);
}

static void *ta_realloc(void *user, void *ptr, size_t old_size,
                        size_t new_size)
{
    stt_alloc_t *s = user;
    if (!ptr)
        return ta_alloc(user, new_size);
    size_t got;
    memcpy(&got, (unsigned char *)ptr - 16, sizeof got);
    if (got != old_size)
        s->size_mismatch++;
    void *n = ta_alloc(user, new_size);
    if (!n)
        return NULL;
    memcpy(n, ptr, old_size < new_size ? old_size : new_size);
    ta_free(user, ptr, old_size);
    return n;
}

void stt_alloc_init(stt_alloc_t *s)
{
    memset(s, 0, sizeof *s);
    s->countdown = -1;
    s->a = (wna16_allocator_t){ta_alloc, ta_realloc, ta_free, s};
}

wna16_context_t *stt_alloc_context(stt_alloc_t *s)
{
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    wna16_context_options_t o = {.allocator = &s->a,
                                 .log_level = WNA16_LOG_ERROR,
                                 .no_builtin_specs = true};
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "context: %s\n", err.message);
        exit(1);
    }
    return ctx;
}
