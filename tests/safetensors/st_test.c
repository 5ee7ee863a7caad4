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
