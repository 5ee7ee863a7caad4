/*
 * testutil.c - see testutil.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

int tu_failures;
int tu_checks;

int tu_finish(const char *suite)
{
    if (tu_failures) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", suite, tu_failures,
                tu_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", suite, tu_checks);
    return 0;
}

void tu_skip(const char *why)
{
    printf("SKIP: %s\n", why);
    fflush(stdout);
    exit(77);
}

void tu_rng_seed(tu_rng_t *r, uint64_t seed)
{
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!r->s)
        r->s = 1;
}

uint64_t tu_rng_next(tu_rng_t *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

uint32_t tu_rng_below(tu_rng_t *r, uint32_t n)
{
    return n ? (uint32_t)((tu_rng_next(r) >> 32) % n) : 0;
}

const char *tu_tempdir(const char *tag)
{
    static char path[4096];
    static unsigned counter;
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    snprintf(path, sizeof path, "%s/wna16-test-%s-%ld-%u", base, tag,
             (long)getpid(), counter++);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    return path;
}

void *tu_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    void *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        ((char *)buf)[n] = '\0';
        *size = (size_t)n;
    }
    return buf;
}

int tu_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || w != size)
        return -1;
    return 0;
}

int tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

wna16_context_t *tu_context(void)
{
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR};
    if (wna16_context_create(&o, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "context: %s\n", err.message);
        exit(1);
    }
    return ctx;
}
