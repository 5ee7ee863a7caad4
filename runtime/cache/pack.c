/*
 * pack.c - the kernel pack format (drawn in pack.h): serializing entries
 * into the file's bytes, and reading a memory-mapped file back with every
 * offset checked before it is followed, so that a truncated or damaged
 * file is an error naming what is wrong, never a read outside the mapping.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "runtime/cache/pack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header fields (pack.h). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_SIZE = 12, H_ENTRY_SIZE = 16,
    H_ENTRIES = 20, H_HASH_ALGO = 24, H_FLAGS = 28, H_INDEX = 32,
    H_STRINGS = 40, H_STRINGS_SIZE = 48, H_PAYLOAD = 56, H_PAYLOAD_SIZE = 64,
    H_FILE_SIZE = 72, H_GENERATOR = 80, H_COMPILERS = 84, H_NAME = 88,
    H_META_SUM = 96,
};
/* Index record fields. */
enum {
    E_KEY_HI = 0, E_KEY_LO = 8, E_OFFSET = 16, E_SIZE = 24, E_SUM = 32,
    E_NAME = 40, E_SYMBOL = 44, E_TARGET = 48, E_ARCH = 52, E_FAMILY = 56,
};

w16_key_t w16_pack_arch_key(const char *target, const char *arch)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 pack entry");
    w16_keyer_str(&kr, target);
    w16_keyer_str(&kr, arch);
    return w16_keyer_done(&kr);
}

w16_key_t w16_pack_entry_key(w16_key_t request, const char *target,
                             const char *arch)
{
    w16_key_t a = w16_pack_arch_key(target, arch);
    return (w16_key_t){.lo = request.lo ^ a.lo, .hi = request.hi ^ a.hi};
}

static int key_cmp(w16_key_t a, w16_key_t b)
{
    if (a.hi != b.hi)
        return a.hi < b.hi ? -1 : 1;
    if (a.lo != b.lo)
        return a.lo < b.lo ? -1 : 1;
    return 0;
}

/* ---- writing ------------------------------------------------------------- */

typedef struct sorted {
    w16_key_t key;
    size_t item; /* index into the caller's items (ties: the first) */
} sorted_t;

static int sorted_cmp(const void *a, const void *b)
{
    const sorted_t *x = a, *y = b;
    int c = key_cmp(x->key, y->key);
    if (c)
        return c;
    return x->item < y->item ? -1 : x->item > y->item;
}

/* The string table: interned in order of first use. */
typedef struct strtab {
    w16_buf_t buf;
} strtab_t;

static uint32_t intern(strtab_t *t, const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    for (size_t off = 0; off < t->buf.len;) {
        size_t m = strlen(t->buf.data + off);
        if (m == n && memcmp(t->buf.data + off, s, n) == 0)
            return (uint32_t)off;
        off += m + 1;
    }
    uint32_t off = (uint32_t)t->buf.len;
    w16_buf_append(&t->buf, s, n);
    w16_buf_putc(&t->buf, '\0');
    return off;
}

static uint64_t align_up(uint64_t v) { return (v + W16_PACK_ALIGN - 1) & ~(uint64_t)(W16_PACK_ALIGN - 1); }

wna16_status_t w16_pack_serialize(wna16_context_t *ctx, const char *pack_name,
                                  const char *generator, const char *compilers,
                                  const w16_pack_item_t *items, size_t n,
                                  void **out, size_t *out_size,
                                  wna16_error_t *err)
{
    *out = NULL;
    *out_size = 0;
    if (n > UINT32_MAX / 2)
        return w16_err(err, WNA16_ELIMIT, "pack %s: %zu entries (at most %u)",
                       pack_name, n, UINT32_MAX / 2);
    sorted_t *s = w16_calloc(ctx, n ? n : 1, sizeof *s);
    if (!s)
        return w16_err_nomem(err, "sorting a pack's entries");
    for (size_t i = 0; i < n; i++)
        s[i] = (sorted_t){w16_pack_entry_key(items[i].request, items[i].target,
                                             items[i].arch), i};
    qsort(s, n, sizeof *s, sorted_cmp);
    size_t m = 0; /* entries kept: the first of each key */
    for (size_t i = 0; i < n; i++)
        if (m == 0 || key_cmp(s[m - 1].key, s[i].key) != 0)
            s[m++] = s[i];

    strtab_t st;
    w16_buf_init(&st.buf, ctx);
    uint32_t gen_off = intern(&st, generator), comp_off = intern(&st, compilers),
             name_off = intern(&st, pack_name);
    uint32_t (*strs)[5] = w16_calloc(ctx, m ? m : 1, sizeof *strs);
    if (!strs) {
        w16_buf_free(&st.buf);
        w16_free(ctx, s, sizeof *s * (n ? n : 1));
        return w16_err_nomem(err, "building a pack's string table");
    }
    for (size_t i = 0; i < m; i++) {
        const w16_pack_item_t *it = &items[s[i].item];
        strs[i][0] = intern(&st, it->name);
        strs[i][1] = intern(&st, it->symbol);
        strs[i][2] = intern(&st, it->target);
        strs[i][3] = intern(&st, it->arch);
        strs[i][4] = intern(&st, it->family);
    }
    wna16_status_t rc = WNA16_OK;
    uint64_t index_off = W16_PACK_HEADER_SIZE;
    uint64_t strings_off = index_off + (uint64_t)m * W16_PACK_ENTRY_SIZE;
    uint64_t strings_size = st.buf.len;
    uint64_t payload_off = align_up(strings_off + strings_size);
    uint64_t payload_size = 0;
    for (size_t i = 0; i < m; i++)
        payload_size = align_up(payload_size) + items[s[i].item].size;
    uint64_t total = payload_off + payload_size;
    unsigned char *b = NULL;
    if (st.buf.failed)
        rc = w16_err_nomem(err, "building a pack's string table");
    else if (strings_size > UINT32_MAX || total > SIZE_MAX)
        rc = w16_err(err, WNA16_ELIMIT, "pack %s: too large", pack_name);
    else if (!(b = w16_calloc(ctx, 1, (size_t)total)))
        rc = w16_err_nomem(err, "building a pack");
    if (rc == WNA16_OK) {
        memcpy(b + H_MAGIC, W16_PACK_MAGIC, 8);
        w16_put_le32(b + H_VERSION, W16_PACK_FORMAT_VERSION);
        w16_put_le32(b + H_HEADER_SIZE, W16_PACK_HEADER_SIZE);
        w16_put_le32(b + H_ENTRY_SIZE, W16_PACK_ENTRY_SIZE);
        w16_put_le32(b + H_ENTRIES, (uint32_t)m);
        w16_put_le32(b + H_HASH_ALGO, (uint32_t)w16_hash_algo());
        w16_put_le32(b + H_FLAGS, 0);
        w16_put_le64(b + H_INDEX, index_off);
        w16_put_le64(b + H_STRINGS, strings_off);
        w16_put_le64(b + H_STRINGS_SIZE, strings_size);
        w16_put_le64(b + H_PAYLOAD, payload_off);
        w16_put_le64(b + H_PAYLOAD_SIZE, payload_size);
        w16_put_le64(b + H_FILE_SIZE, total);
        w16_put_le32(b + H_GENERATOR, gen_off);
        w16_put_le32(b + H_COMPILERS, comp_off);
        w16_put_le32(b + H_NAME, name_off);
        uint64_t off = 0;
        for (size_t i = 0; i < m; i++) {
            const w16_pack_item_t *it = &items[s[i].item];
            unsigned char *e = b + index_off + i * W16_PACK_ENTRY_SIZE;
            off = align_up(off);
            w16_put_le64(e + E_KEY_HI, s[i].key.hi);
            w16_put_le64(e + E_KEY_LO, s[i].key.lo);
            w16_put_le64(e + E_OFFSET, off);
            w16_put_le64(e + E_SIZE, it->size);
            w16_put_le64(e + E_SUM, w16_hash64(it->data, it->size));
            for (int f = 0; f < 5; f++)
                w16_put_le32(e + E_NAME + 4 * f, strs[i][f]);
            if (it->size)
                memcpy(b + payload_off + off, it->data, it->size);
            off += it->size;
        }
        if (strings_size)
            memcpy(b + strings_off, st.buf.data, strings_size);
        w16_put_le64(b + H_META_SUM, w16_hash64(b, (size_t)payload_off));
        *out = b;
        *out_size = (size_t)total;
    }
    w16_free(ctx, strs, sizeof *strs * (m ? m : 1));
    w16_free(ctx, s, sizeof *s * (n ? n : 1));
    w16_buf_free(&st.buf);
    return rc;
}

/* ---- reading ------------------------------------------------------------- */

struct w16_pack {
    char *path;
    const unsigned char *map;
    size_t size;
    uint32_t entries;
    uint64_t index, strings, strings_size, payload, payload_size;
    w16_pack_info_t info;
};

static const char *str_at(const w16_pack_t *p, uint32_t off)
{
    return (const char *)p->map + p->strings + off;
}

static wna16_status_t bad(wna16_error_t *err, const char *path,
                          const char *what)
{
    return w16_err(err, WNA16_EFORMAT, "%s: not a valid wna16 kernel pack: "
                   "%s", path, what);
}

/* Checks everything the readers will follow. */
static wna16_status_t check(w16_pack_t *p, wna16_error_t *err)
{
    const unsigned char *b = p->map;
    const char *path = p->path;
    if (p->size < 8 || memcmp(b, W16_PACK_MAGIC, 8) != 0)
        return w16_err(err, WNA16_EFORMAT, "%s: not a wna16 kernel pack (no "
                       "\"W16PACK\" magic at its start; packs come from "
                       "'wna16 pack build')", path);
    if (p->size < W16_PACK_HEADER_SIZE)
        return bad(err, path, "shorter than its header (truncated?)");
    uint32_t version = w16_get_le32(b + H_VERSION);
    if (version != W16_PACK_FORMAT_VERSION)
        return w16_err(err, WNA16_EFORMAT, "%s: pack format version %u; this "
                       "library (wna16 %s) reads version %d", path, version,
                       WNA16_VERSION_STRING, W16_PACK_FORMAT_VERSION);
    if (w16_get_le32(b + H_HEADER_SIZE) != W16_PACK_HEADER_SIZE ||
        w16_get_le32(b + H_ENTRY_SIZE) != W16_PACK_ENTRY_SIZE)
        return bad(err, path, "unexpected header or index record size");
    if (w16_get_le64(b + H_FILE_SIZE) != p->size)
        return bad(err, path, "its size is not the size its header records "
                   "(truncated or extended)");
    p->entries = w16_get_le32(b + H_ENTRIES);
    p->index = w16_get_le64(b + H_INDEX);
    p->strings = w16_get_le64(b + H_STRINGS);
    p->strings_size = w16_get_le64(b + H_STRINGS_SIZE);
    p->payload = w16_get_le64(b + H_PAYLOAD);
    p->payload_size = w16_get_le64(b + H_PAYLOAD_SIZE);
    uint64_t index_end = p->index + (uint64_t)p->entries * W16_PACK_ENTRY_SIZE;
    if (p->index != W16_PACK_HEADER_SIZE || p->strings != index_end ||
        p->strings_size > p->size || p->strings + p->strings_size > p->payload ||
        p->payload > p->size || p->payload_size != p->size - p->payload ||
        p->payload % W16_PACK_ALIGN)
        return bad(err, path, "its index, strings and payload do not fit the "
                   "file");
    if (p->strings_size == 0 || b[p->strings + p->strings_size - 1] != 0)
        return bad(err, path, "its string table is not terminated");
    /* the meta checksum, computed with its own field zeroed */
    unsigned char *copy = malloc((size_t)p->payload);
    if (!copy)
        return w16_err_nomem(err, "checking a pack");
    memcpy(copy, b, (size_t)p->payload);
    memset(copy + H_META_SUM, 0, 8);
    uint64_t sum = w16_hash64(copy, (size_t)p->payload);
    free(copy);
    int algo = (int)w16_get_le32(b + H_HASH_ALGO);
    if (algo == w16_hash_algo() && sum != w16_get_le64(b + H_META_SUM))
        return bad(err, path, "its header or index is damaged (checksum "
                   "mismatch)");
    const uint32_t str_fields[] = {H_GENERATOR, H_COMPILERS, H_NAME};
    for (int i = 0; i < 3; i++)
        if (w16_get_le32(b + str_fields[i]) >= p->strings_size)
            return bad(err, path, "a header string lies outside the table");
    w16_key_t prev = {0, 0};
    for (uint32_t i = 0; i < p->entries; i++) {
        const unsigned char *e = b + p->index + (uint64_t)i * W16_PACK_ENTRY_SIZE;
        w16_key_t k = {.hi = w16_get_le64(e + E_KEY_HI),
                       .lo = w16_get_le64(e + E_KEY_LO)};
        if (i > 0 && key_cmp(prev, k) >= 0)
            return bad(err, path, "its index is not sorted by key");
        prev = k;
        uint64_t off = w16_get_le64(e + E_OFFSET), size = w16_get_le64(e + E_SIZE);
        if (off % W16_PACK_ALIGN || off > p->payload_size ||
            size > p->payload_size - off)
            return bad(err, path, "an entry lies outside the payload");
        for (int f = 0; f < 5; f++)
            if (w16_get_le32(e + E_NAME + 4 * f) >= p->strings_size)
                return bad(err, path, "an entry's string lies outside the "
                           "table");
    }
    p->info = (w16_pack_info_t){
        .path = p->path, .name = str_at(p, w16_get_le32(b + H_NAME)),
        .generator = str_at(p, w16_get_le32(b + H_GENERATOR)),
        .compilers = str_at(p, w16_get_le32(b + H_COMPILERS)),
        .format_version = version, .entries = p->entries, .hash_algo = algo,
        .file_size = p->size, .payload_size = p->payload_size};
    return WNA16_OK;
}

wna16_status_t w16_pack_open(const char *path, w16_pack_t **out,
                             wna16_error_t *err)
{
    *out = NULL;
    if (!path || !*path)
        return w16_err(err, WNA16_EINVAL, "kernel pack: no path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return w16_err(err, errno == ENOENT ? WNA16_ENOTFOUND : WNA16_EIO,
                       "%s: cannot open the kernel pack: %s", path,
                       strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        close(fd);
        return w16_err(err, WNA16_EIO, "%s: %s", path, S_ISDIR(sb.st_mode)
                       ? "a directory, not a kernel pack" : !S_ISREG(sb.st_mode)
                       ? "not a regular file" : strerror(e));
    }
    w16_pack_t *p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path))) {
        free(p);
        close(fd);
        return w16_err_nomem(err, "opening a kernel pack");
    }
    p->size = (size_t)sb.st_size;
    wna16_status_t st = WNA16_OK;
    if (p->size == 0) {
        st = w16_err(err, WNA16_EFORMAT, "%s: not a wna16 kernel pack (an "
                     "empty file)", path);
    } else {
        void *m = mmap(NULL, p->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            st = w16_err(err, WNA16_EIO, "%s: cannot map the kernel pack: %s",
                         path, strerror(errno));
        else
            p->map = m;
    }
    close(fd);
    if (st == WNA16_OK)
        st = check(p, err);
    if (st != WNA16_OK) {
        w16_pack_close(p);
        return st;
    }
    *out = p;
    return WNA16_OK;
}

void w16_pack_close(w16_pack_t *p)
{
    if (!p)
        return;
    if (p->map)
        munmap((void *)p->map, p->size);
    free(p->path);
    free(p);
}

void w16_pack_get_info(const w16_pack_t *p, w16_pack_info_t *out)
{
    *out = p->info;
}

uint32_t w16_pack_count(const w16_pack_t *p) { return p->entries; }

void w16_pack_entry(const w16_pack_t *p, uint32_t i, w16_pack_entry_t *out)
{
    const unsigned char *e = p->map + p->index + (uint64_t)i * W16_PACK_ENTRY_SIZE;
    out->key = (w16_key_t){.hi = w16_get_le64(e + E_KEY_HI),
                           .lo = w16_get_le64(e + E_KEY_LO)};
    out->offset = w16_get_le64(e + E_OFFSET);
    out->size = w16_get_le64(e + E_SIZE);
    out->checksum = w16_get_le64(e + E_SUM);
    out->data = p->map + p->payload + out->offset;
    out->name = str_at(p, w16_get_le32(e + E_NAME));
    out->symbol = str_at(p, w16_get_le32(e + E_SYMBOL));
    out->target = str_at(p, w16_get_le32(e + E_TARGET));
    out->arch = str_at(p, w16_get_le32(e + E_ARCH));
    out->family = str_at(p, w16_get_le32(e + E_FAMILY));
}

bool w16_pack_find(const w16_pack_t *p, w16_key_t key, uint32_t *i)
{
    uint32_t lo = 0, hi = p->entries;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const unsigned char *e = p->map + p->index +
                                 (uint64_t)mid * W16_PACK_ENTRY_SIZE;
        w16_key_t k = {.hi = w16_get_le64(e + E_KEY_HI),
                       .lo = w16_get_le64(e + E_KEY_LO)};
        int c = key_cmp(k, key);
        if (c == 0) {
            *i = mid;
            return true;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

bool w16_pack_entry_intact(const w16_pack_t *p, uint32_t i)
{
    w16_pack_entry_t e;
    w16_pack_entry(p, i, &e);
    return p->info.hash_algo == w16_hash_algo() &&
           w16_hash64(e.data, (size_t)e.size) == e.checksum;
}
