/*
 * st_test.h - helpers shared by the safetensors and checkpoint tests:
 * assembling safetensors bytes from a hand-written header, writing small
 * files and directories, and checking an error's status and message.
 */
#ifndef WNA16_ST_TEST_H
#define WNA16_ST_TEST_H

#include "testutil.h"

#include <stdbool.h>
#include <stddef.h>

/* "<u64 LE length><header><data>" in malloc'd memory; the header is used
 * exactly as given (no padding added). */
unsigned char *stt_build(const char *header, const void *data,
                         size_t data_len, size_t *size);
/* Same with an explicit length field, whatever the header's real size. */
unsigned char *stt_build_len(uint64_t len_field, const char *header,
                             const void *data, size_t data_len, size_t *size);

/* dir + "/" + name in malloc'd memory. */
char *stt_path(const char *dir, const char *name);
/* Writes a NUL-terminated text file dir/name; returns 0 on success. */
int stt_write_text(const char *dir, const char *name, const char *text);
/* Number of entries in a directory other than "." and "..", -1 on error. */
int stt_count_entries(const char *dir);
/* Removes a directory and the files (and empty subdirectories) in it. */
void stt_rmtree(const char *dir);
/* Creates a fresh directory with a unique name under tu_tempdir; malloc'd. */
char *stt_tempdir(const char *tag);

/* An allocator that checks every free/realloc passes the size that was
 * allocated, counts live blocks, and fails every allocation once
 * `countdown` reaches zero (negative: never fails). */
typedef struct stt_alloc {
    long countdown;
    long live;          /* blocks currently allocated */
    long size_mismatch; /* frees/reallocs with a wrong size */
    wna16_allocator_t a;
} stt_alloc_t;
void stt_alloc_init(stt_alloc_t *s);
/* A quiet context using the allocator (no built-in specs: only the
 * safetensors code under test allocates through it). */
wna16_context_t *stt_alloc_context(stt_alloc_t *s);

/* Checks that `st` is `want` and the message holds `needle` (a NULL needle
 * only asks for a non-empty message). Reports the caller's line. */
#define STT_EXPECT_ERR(st, err, want, needle)                                \
    stt_expect_err_at(__FILE__, __LINE__, (st), (err), (want), (needle))
void stt_expect_err_at(const char *file, int line, wna16_status_t st,
                       const wna16_error_t *err, wna16_status_t want,
                       const char *needle);

#endif
