/*
 * test_safetensors_fuzz.c - deterministic mutation fuzzing of everything
 * that reads untrusted checkpoint bytes: the safetensors header parser (from
 * memory and, for a subset, from a real file), config.json parsing and
 * checkpoint directories with mutated index, config and shard files. Seeds
 * are valid files made by the writer plus small golden files when present;
 * mutations mix byte-level damage (bit flips, interesting bytes, truncation,
 * insertion, deletion, length-field changes, splices of header fragments)
 * with JSON-aware edits (numbers made negative, fractional or huge, dtype
 * changes, duplicated entries and keys, type changes) that get past the
 * JSON parser and exercise the validation behind it. Built with ASan+UBSan:
 * a crash or an out-of-bounds read aborts the test. Every rejection must
 * carry a non-OK status and a message; every acceptance is read in full.
 */
#define _POSIX_C_SOURCE 200809L
#include "st_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ST_CASES 12000    /* safetensors inputs */
#define FILE_EVERY 6      /* every n-th is also opened as a file */
#define CONFIG_CASES 1500 /* config.json inputs */
#define CKPT_CASES 800    /* checkpoint directories */

/* ---- byte vectors --------------------------------------------------------- */

typedef struct vec {
    unsigned char *p;
    size_t n, cap;
} vec_t;

static void vec_reserve(vec_t *v, size_t n)
{
    if (n <= v->cap)
        return;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < n)
        cap *= 2;
    v->p = realloc(v->p, cap);
    if (!v->p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    v->cap = cap;
}

static void vec_set(vec_t *v, const void *p, size_t n)
{
    vec_reserve(v, n + 1);
    if (n)
        memcpy(v->p, p, n);
    v->n = n;
    v->p[n] = 0;
}

static void vec_insert(vec_t *v, size_t at, const void *p, size_t n)
{
    if (at > v->n)
        at = v->n;
    vec_reserve(v, v->n + n + 1);
    memmove(v->p + at + n, v->p + at, v->n - at);
    memcpy(v->p + at, p, n);
    v->n += n;
    v->p[v->n] = 0;
}

static void vec_erase(vec_t *v, size_t at, size_t n)
{
    if (at >= v->n)
        return;
    if (n > v->n - at)
        n = v->n - at;
    memmove(v->p + at, v->p + at + n, v->n - at - n);
    v->n -= n;
    v->p[v->n] = 0;
}

static void vec_replace(vec_t *v, size_t at, size_t n, const char *s)
{
    vec_erase(v, at, n);
    vec_insert(v, at, s, strlen(s));
}

static void vec_free(vec_t *v)
{
    free(v->p);
    v->p = NULL;
    v->n = v->cap = 0;
}

static const char *pick(tu_rng_t *r, const char *const *list, size_t n)
{
    return list[tu_rng_below(r, (uint32_t)n)];
}
#define PICK(r, list) pick((r), (list), sizeof(list) / sizeof((list)[0]))

/* Random position of one of the bytes in `set`, or SIZE_MAX. */
static size_t find_any(tu_rng_t *r, const vec_t *v, const char *set)
{
    size_t count = 0;
    for (size_t i = 0; i < v->n; i++)
        count += v->p[i] && strchr(set, v->p[i]) != NULL;
    if (!count)
        return SIZE_MAX;
    size_t k = tu_rng_below(r, (uint32_t)count);
    for (size_t i = 0; i < v->n; i++)
        if (v->p[i] && strchr(set, v->p[i]) && k-- == 0)
            return i;
    return SIZE_MAX;
}

/* Random occurrence of `needle`, or SIZE_MAX. */
static size_t find_str(tu_rng_t *r, const vec_t *v, const char *needle)
{
    size_t nl = strlen(needle), count = 0;
    for (size_t i = 0; i + nl <= v->n; i++)
        count += memcmp(v->p + i, needle, nl) == 0;
    if (!count)
        return SIZE_MAX;
    size_t k = tu_rng_below(r, (uint32_t)count);
    for (size_t i = 0; i + nl <= v->n; i++)
        if (memcmp(v->p + i, needle, nl) == 0 && k-- == 0)
            return i;
    return SIZE_MAX;
}

/* ---- JSON-aware edits (shared by headers, configs, indexes) --------------- */

static const char *const numbers[] = {
    "-1", "1.5", "1e308", "-1e308", "9007199254740993", "9007199254740991",
    "18446744073709551616", "0", "-0", "1e2", "4294967296", "2147483648",
    "-2147483649", "0.0", "7", "100000000", "1E400", "-", "01", "3.",
};

static void edit_number(tu_rng_t *r, vec_t *v)
{
    size_t at = find_any(r, v, "0123456789");
    if (at == SIZE_MAX)
        return;
    size_t b = at, e = at;
    while (b > 0 && strchr("0123456789-.eE+", v->p[b - 1]))
        b--;
    while (e < v->n && v->p[e] && strchr("0123456789-.eE+", v->p[e]))
        e++;
    char rnd[24];
    const char *s = PICK(r, numbers);
    if (tu_rng_below(r, 4) == 0) {
        snprintf(rnd, sizeof rnd, "%u", tu_rng_below(r, 70000));
        s = rnd;
    }
    vec_replace(v, b, e - b, s);
}

static const char *const values[] = {
    "\"4\"", "null", "true", "false", "[]", "{}", "[1,2]", "{\"a\":1}",
    "\"\"", "-3", "\"group\"", "\"channel\"", "1.25",
    /* longer than any string field of wna16_model_config_t */
    ("\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""),
};

/* Replaces the value after a random ':' with another JSON value. */
static void edit_value(tu_rng_t *r, vec_t *v)
{
    size_t at = find_any(r, v, ":");
    if (at == SIZE_MAX)
        return;
    size_t b = at + 1, e = b;
    int depth = 0;
    bool in_str = false;
    for (; e < v->n; e++) {
        unsigned char c = v->p[e];
        if (in_str) {
            if (c == '\\')
                e++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"')
            in_str = true;
        else if (c == '[' || c == '{')
            depth++;
        else if ((c == ']' || c == '}') && depth-- == 0)
            break;
        else if (c == ',' && depth == 0)
            break;
    }
    vec_replace(v, b, e - b, PICK(r, values));
}

/* Copies a random "key":value fragment next to itself: duplicate keys. */
static void dup_key(tu_rng_t *r, vec_t *v)
{
    size_t at = find_str(r, v, "\":");
    if (at == SIZE_MAX)
        return;
    size_t b = at;
    while (b > 0 && v->p[b - 1] != '"')
        b--;
    if (b == 0)
        return;
    b--; /* opening quote */
    size_t e = at + 2;
    int depth = 0;
    for (; e < v->n; e++) {
        unsigned char c = v->p[e];
        if (c == '[' || c == '{')
            depth++;
        else if ((c == ']' || c == '}') && depth-- == 0)
            break;
        else if (c == ',' && depth == 0)
            break;
    }
    size_t n = e - b;
    unsigned char *frag = malloc(n + 1);
    memcpy(frag, v->p + b, n);
    frag[n] = ',';
    vec_insert(v, b, frag, n + 1);
    free(frag);
}

/* Inserts a fragment of `donor` at a random place. */
static void splice(tu_rng_t *r, vec_t *v, const unsigned char *donor,
                   size_t dn)
{
    if (!dn)
        return;
    size_t b = tu_rng_below(r, (uint32_t)dn);
    size_t n = 1 + tu_rng_below(r, 40);
    if (n > dn - b)
        n = dn - b;
    vec_insert(v, tu_rng_below(r, (uint32_t)v->n + 1), donor + b, n);
}

static const unsigned char interesting[] = {
    0x00, 0xFF, '"', '[', ']', '{', '}', ',', ':', '0', '1', '9', '-', '.',
    'e', ' ', '\\', 0x80, 0xC3, 0x7F, '\n', 'n', 't',
};

/* One byte-level mutation somewhere in [lo, v->n). */
static void byte_mutation(tu_rng_t *r, vec_t *v, size_t lo)
{
    if (v->n <= lo) {
        vec_insert(v, v->n, "{", 1);
        return;
    }
    size_t span = v->n - lo;
    size_t at = lo + tu_rng_below(r, (uint32_t)span);
    switch (tu_rng_below(r, 5)) {
    case 0:
        v->p[at] ^= (unsigned char)(1u << tu_rng_below(r, 8));
        break;
    case 1:
        v->p[at] = interesting[tu_rng_below(r, sizeof interesting)];
        break;
    case 2: { /* insertion */
        unsigned char b[8];
        size_t n = 1 + tu_rng_below(r, 8);
        for (size_t i = 0; i < n; i++)
            b[i] = tu_rng_below(r, 2)
                       ? interesting[tu_rng_below(r, sizeof interesting)]
                       : (unsigned char)tu_rng_next(r);
        vec_insert(v, at, b, n);
        break;
    }
    case 3:
        vec_erase(v, at, 1 + tu_rng_below(r, 16));
        break;
    default:
        v->n = at; /* truncation */
        break;
    }
}

/* ---- safetensors seeds ---------------------------------------------------- */

typedef struct seed {
    vec_t header; /* JSON text as in the file (padding included) */
    vec_t data;
} seed_t;

typedef struct seeds {
    seed_t *items;
    size_t n;
} seeds_t;

static void add_seed_bytes(seeds_t *s, const unsigned char *b, size_t size)
{
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | b[i];
    s->items = realloc(s->items, (s->n + 1) * sizeof *s->items);
    seed_t *sd = &s->items[s->n++];
    memset(sd, 0, sizeof *sd);
    vec_set(&sd->header, b + 8, (size_t)hl);
    vec_set(&sd->data, b + 8 + hl, size - 8 - (size_t)hl);
}

static void add_seed_file(seeds_t *s, const char *path)
{
    size_t size;
    unsigned char *b = tu_read_file(path, &size);
    if (b && size >= 8)
        add_seed_bytes(s, b, size);
    free(b);
}

/* A writer-made file: `n` tensors of assorted dtypes and shapes. */
static void make_seed(wna16_context_t *ctx, seeds_t *s, const char *dir,
                      tu_rng_t *r, int n, bool meta)
{
    char *path = stt_path(dir, "seed.safetensors");
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    if (!w) {
        free(path);
        return;
    }
    if (meta) {
        TU_OK(wna16_safetensors_writer_metadata(w, "format", "pt", &err), &err);
        TU_OK(wna16_safetensors_writer_metadata(w, "num_bits", "4", &err), &err);
    }
    size_t sizes[64];
    for (int i = 0; i < n; i++) {
        char name[48];
        snprintf(name, sizeof name, "model.layers.%d.w%d", i / 3, i);
        wna16_dtype_t dt = (wna16_dtype_t)(1 + tu_rng_below(r, 8));
        int ndim = (int)tu_rng_below(r, 4);
        int64_t shape[3];
        size_t bytes = wna16_dtype_size(dt);
        for (int d = 0; d < ndim; d++) {
            shape[d] = tu_rng_below(r, 5); /* zero-size tensors too */
            bytes *= (size_t)shape[d];
        }
        sizes[i] = bytes;
        TU_OK(wna16_safetensors_writer_declare(w, name, dt, ndim, shape, &err),
              &err);
    }
    unsigned char buf[512];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)tu_rng_next(r);
    for (int i = 0; i < n; i++)
        TU_OK(wna16_safetensors_writer_write(w, buf, sizes[i], &err), &err);
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    add_seed_file(s, path);
    unlink(path);
    free(path);
}

static void build_seeds(wna16_context_t *ctx, seeds_t *s, const char *dir)
{
    tu_rng_t r;
    tu_rng_seed(&r, 7);
    make_seed(ctx, s, dir, &r, 0, false);
    make_seed(ctx, s, dir, &r, 0, true);
    make_seed(ctx, s, dir, &r, 3, true);
    make_seed(ctx, s, dir, &r, 8, false);
    make_seed(ctx, s, dir, &r, 24, true);
    make_seed(ctx, s, dir, &r, 60, false);
    /* hand-made: unpadded, whitespace, zero-size ties, a scalar */
    const char *h = "{ \"a\" : {\"dtype\":\"I32\",\"shape\":[2,0],"
                    "\"data_offsets\":[0,0]}, \"s\":{\"shape\":[],\"dtype\":"
                    "\"F32\",\"data_offsets\":[0,4]},\"__metadata__\":{\"k\":"
                    "\"v\\u00e9\\n\"},\"b\":{\"data_offsets\":[4,6],\"dtype\":"
                    "\"BF16\",\"shape\":[1]}}";
    size_t size;
    unsigned char *b = stt_build(h, "abcdef", 6, &size);
    add_seed_bytes(s, b, size);
    free(b);
    if (!tu_exists(WNA16_GOLDEN_DIR)) {
        printf("note: %s is absent; fuzzing writer-made seeds only\n",
               WNA16_GOLDEN_DIR);
        return;
    }
    add_seed_file(s, WNA16_GOLDEN_DIR "/gptq_b4_gm1/model.safetensors");
    add_seed_file(s, WNA16_GOLDEN_DIR "/gptq_b4_gm1/expected_marlin.safetensors");
    add_seed_file(s, WNA16_GOLDEN_DIR "/awq_b4_g32_pad/model.safetensors");
}

/* ---- safetensors mutation ------------------------------------------------- */

static const char *const dtypes[] = {
    "\"F16\"", "\"BF16\"", "\"F32\"", "\"I32\"", "\"U8\"", "\"I8\"",
    "\"I16\"", "\"I64\"", "\"F8_E4M3\"", "\"BOOL\"", "\"\"", "\"f32\"", "7",
};

/* Dtype swaps that keep the element size: the file stays valid. */
static void swap_same_size(tu_rng_t *r, vec_t *h)
{
    static const char *const groups[][3] = {
        {"\"F16\"", "\"BF16\"", "\"I16\""},
        {"\"F32\"", "\"I32\"", "\"F32\""},
        {"\"U8\"", "\"I8\"", "\"U8\""},
    };
    size_t g = tu_rng_below(r, 3);
    size_t from = tu_rng_below(r, 3), to = tu_rng_below(r, 3);
    size_t at = find_str(r, h, groups[g][from]);
    if (at != SIZE_MAX)
        vec_replace(h, at, strlen(groups[g][from]), groups[g][to]);
}

/* Swaps the first two dims of a random shape: still valid. */
static void swap_dims(tu_rng_t *r, vec_t *h)
{
    size_t at = find_str(r, h, "\"shape\":[");
    if (at == SIZE_MAX)
        return;
    size_t b = at + 9, comma = b, e;
    while (comma < h->n && h->p[comma] != ',' && h->p[comma] != ']')
        comma++;
    if (comma >= h->n || h->p[comma] != ',')
        return;
    for (e = comma + 1; e < h->n && h->p[e] != ',' && h->p[e] != ']'; e++)
        ;
    if (e >= h->n)
        return;
    size_t n1 = comma - b, n2 = e - comma - 1;
    char tmp[64];
    if (n1 + n2 + 1 >= sizeof tmp)
        return;
    memcpy(tmp, h->p + comma + 1, n2);
    tmp[n2] = ',';
    memcpy(tmp + n2 + 1, h->p + b, n1);
    memcpy(h->p + b, tmp, n1 + n2 + 1);
}

static void json_mutation(tu_rng_t *r, vec_t *h, const seeds_t *s)
{
    switch (tu_rng_below(r, 7)) {
    case 0:
        edit_number(r, h);
        break;
    case 1: {
        size_t at = find_str(r, h, "\"dtype\":");
        if (at != SIZE_MAX) {
            size_t b = at + 8, e = b + 1;
            while (e < h->n && h->p[e] != '"' && h->p[e] != ',')
                e++;
            vec_replace(h, b, e + 1 - b, PICK(r, dtypes));
        }
        break;
    }
    case 2:
        dup_key(r, h);
        break;
    case 3:
        edit_value(r, h);
        break;
    case 4: {
        const seed_t *d = &s->items[tu_rng_below(r, (uint32_t)s->n)];
        splice(r, h, d->header.p, d->header.n);
        break;
    }
    case 5:
        swap_same_size(r, h);
        break;
    default:
        swap_dims(r, h);
        break;
    }
}

/* Length-field damage: small, exact-ish, past EOF, huge. */
static void length_mutation(tu_rng_t *r, vec_t *f)
{
    if (f->n < 8)
        return;
    uint64_t hl = 0, size = f->n;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | f->p[i];
    uint64_t choices[] = {
        0, 1, 2, hl - 1, hl + 1, hl + 8, size - 8, size - 7, size,
        WNA16_SAFETENSORS_MAX_HEADER, WNA16_SAFETENSORS_MAX_HEADER + 1ull,
        UINT64_MAX, UINT64_MAX - 7, 1ull << 32, 1ull << 63, tu_rng_next(r),
    };
    uint64_t v = choices[tu_rng_below(r, sizeof choices / sizeof choices[0])];
    for (int i = 0; i < 8; i++)
        f->p[i] = (unsigned char)(v >> (8 * i));
}

/* Builds one mutated file from a seed. */
static void mutate_file(tu_rng_t *r, const seeds_t *s, vec_t *h, vec_t *f)
{
    const seed_t *sd = &s->items[tu_rng_below(r, (uint32_t)s->n)];
    vec_set(h, sd->header.p, sd->header.n);
    uint32_t mode = tu_rng_below(r, 10);
    if (mode == 0) { /* valid-preserving edits only */
        for (uint32_t i = 0; i < 1 + tu_rng_below(r, 3); i++)
            tu_rng_below(r, 2) ? swap_dims(r, h) : swap_same_size(r, h);
    } else if (mode <= 5) {
        for (uint32_t i = 0; i < 1 + tu_rng_below(r, 2); i++)
            json_mutation(r, h, s);
    }
    if (tu_rng_below(r, 2)) /* sometimes pad to 8 as writers do */
        while (h->n % 8)
            vec_insert(h, h->n, " ", 1);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h->n >> (8 * i));
    vec_set(f, len8, 8);
    vec_insert(f, 8, h->p, h->n);
    vec_insert(f, f->n, sd->data.p, sd->data.n);
    if (mode == 0)
        return;
    if (mode > 5 || tu_rng_below(r, 3) == 0) {
        uint32_t k = 1 + tu_rng_below(r, 3);
        for (uint32_t i = 0; i < k; i++) {
            if (tu_rng_below(r, 6) == 0)
                length_mutation(r, f);
            else /* mostly the header: that is where the parser lives */
                byte_mutation(r, f, tu_rng_below(r, 4) ? 0 : f->n / 2);
        }
    }
}

/* ---- checks --------------------------------------------------------------- */

typedef struct tally {
    int accepted, rejected;
} tally_t;

static void check_failure(wna16_status_t s, const wna16_error_t *err,
                          const char *what, int i)
{
    TU_CHECK_MSG(s < 0 && strcmp(wna16_status_name(s), "unknown") != 0,
                 "%s %d: status %d", what, i, (int)s);
    TU_CHECK_MSG(err->message[0] != '\0' && err->status == s,
                 "%s %d: empty message", what, i);
}

/* Reads every byte of every tensor and every metadata string. */
static uint64_t read_all(const wna16_safetensors_t *st)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < wna16_safetensors_count(st); i++) {
        const wna16_tensor_t *t = wna16_safetensors_at(st, i);
        size_t want = wna16_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            want *= (size_t)t->shape[d];
        TU_CHECK(want == t->nbytes);
        TU_CHECK(wna16_safetensors_find(st, t->name) == t);
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const unsigned char *)t->data)[k];
    }
    for (size_t i = 0; i < wna16_safetensors_metadata_count(st); i++) {
        const char *k = wna16_safetensors_metadata_key(st, i);
        const char *v = wna16_safetensors_metadata_get(st, k);
        sum += strlen(k) + (v ? strlen(v) : 0);
    }
    return sum;
}

static void fuzz_safetensors(wna16_context_t *ctx, const seeds_t *s,
                             const char *dir)
{
    tu_rng_t r;
    tu_rng_seed(&r, 0x5afe);
    vec_t h = {0}, f = {0};
    tally_t t = {0, 0};
    int files = 0;
    char *path = stt_path(dir, "fuzz.safetensors");
    for (int i = 0; i < ST_CASES; i++) {
        mutate_file(&r, s, &h, &f);
        /* an exact-size copy so ASan sees any read past the end */
        unsigned char *buf = malloc(f.n ? f.n : 1);
        if (f.n)
            memcpy(buf, f.p, f.n);
        wna16_error_t err;
        wna16_safetensors_t *st = NULL;
        wna16_status_t sm = wna16_safetensors_open_memory(ctx, "fuzz", buf,
                                                          f.n, &st, &err);
        uint64_t sum = 0;
        if (sm == WNA16_OK) {
            t.accepted++;
            sum = read_all(st);
            wna16_safetensors_close(st);
        } else {
            t.rejected++;
            check_failure(sm, &err, "safetensors", i);
            TU_CHECK(st == NULL);
        }
        if (i % FILE_EVERY == 0) { /* the same bytes through mmap */
            files++;
            TU_CHECK(tu_write_file(path, buf, f.n) == 0);
            wna16_status_t sf = wna16_safetensors_open(ctx, path, &st, &err);
            TU_CHECK_MSG(sf == sm, "case %d: file %s, memory %s", i,
                         wna16_status_name(sf), wna16_status_name(sm));
            if (sf == WNA16_OK) {
                TU_CHECK(read_all(st) == sum);
                wna16_safetensors_close(st);
            } else {
                check_failure(sf, &err, "safetensors file", i);
            }
        }
        free(buf);
    }
    unlink(path);
    free(path);
    vec_free(&h);
    vec_free(&f);
    printf("safetensors: %d inputs (%d also as files): %d accepted, %d "
           "rejected\n", ST_CASES, files, t.accepted, t.rejected);
    TU_CHECK(t.accepted > ST_CASES / 50 && t.rejected > ST_CASES / 2);
}

/* ---- config.json ---------------------------------------------------------- */

static const char *const config_seeds[] = {
    "{\"model_type\":\"qwen3_moe\",\"hidden_size\":128,"
    "\"moe_intermediate_size\":160,\"num_experts\":2,\"num_experts_per_tok\":2,"
    "\"num_hidden_layers\":1,\"torch_dtype\":\"float16\",\"quantization_config\":"
    "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,\"desc_act\":false,"
    "\"sym\":true}}",
    "{\"hidden_size\":256,\"intermediate_size\":512,\"num_local_experts\":8,"
    "\"quantization_config\":{\"quant_method\":\"awq\",\"w_bit\":4,"
    "\"q_group_size\":128,\"zero_point\":true,\"version\":\"gemm\"}}",
    "{\"n_routed_experts\":64,\"quantization_config\":{\"quant_method\":"
    "\"compressed-tensors\",\"config_groups\":{\"group_0\":{\"targets\":"
    "[\"Linear\"],\"weights\":{\"num_bits\":4,\"symmetric\":true,\"strategy\":"
    "\"group\",\"group_size\":128,\"actorder\":\"group\"}}}}}",
    "{\"dtype\":\"bfloat16\",\"quantization_config\":{\"quant_method\":"
    "\"moe_wna16\",\"bits\":8,\"group_size\":-1,\"has_zp\":false,"
    "\"linear_quant_method\":\"gptq\"}}",
};

static void mutate_json(tu_rng_t *r, vec_t *v, const vec_t *donor)
{
    uint32_t k = 1 + tu_rng_below(r, 3);
    for (uint32_t i = 0; i < k; i++) {
        switch (tu_rng_below(r, 6)) {
        case 0:
            edit_number(r, v);
            break;
        case 1:
        case 2:
            edit_value(r, v);
            break;
        case 3:
            dup_key(r, v);
            break;
        case 4:
            splice(r, v, donor->p, donor->n);
            break;
        default:
            byte_mutation(r, v, 0);
            break;
        }
    }
}

static void check_config(const wna16_model_config_t *c)
{
    /* every string field NUL-terminated inside its array */
    TU_CHECK(memchr(c->model_type, 0, sizeof c->model_type) != NULL);
    TU_CHECK(memchr(c->torch_dtype, 0, sizeof c->torch_dtype) != NULL);
    TU_CHECK(memchr(c->quant_method, 0, sizeof c->quant_method) != NULL);
    TU_CHECK(memchr(c->actorder, 0, sizeof c->actorder) != NULL);
    TU_CHECK(memchr(c->format_name, 0, sizeof c->format_name) != NULL);
    TU_CHECK(memchr(c->version, 0, sizeof c->version) != NULL);
    TU_CHECK(memchr(c->linear_quant_method, 0,
                    sizeof c->linear_quant_method) != NULL);
}

static void fuzz_configs(const char *dir)
{
    tu_rng_t r;
    tu_rng_seed(&r, 0xc0f1);
    size_t nseeds = sizeof config_seeds / sizeof config_seeds[0];
    vec_t seeds[16] = {{0}};
    for (size_t i = 0; i < nseeds; i++)
        vec_set(&seeds[i], config_seeds[i], strlen(config_seeds[i]));
    if (tu_exists(WNA16_GOLDEN_DIR)) {
        const char *golden[] = {WNA16_GOLDEN_DIR "/awq_b4_g128/config.json",
                                WNA16_GOLDEN_DIR "/gptq_b4_g128_actorder/"
                                "config.json"};
        for (size_t i = 0; i < 2; i++) {
            size_t n;
            char *b = tu_read_file(golden[i], &n);
            if (b)
                vec_set(&seeds[nseeds++], b, n);
            free(b);
        }
    }
    char *path = stt_path(dir, "config.json");
    vec_t v = {0};
    tally_t t = {0, 0};
    for (int i = 0; i < CONFIG_CASES; i++) {
        vec_t *sd = &seeds[tu_rng_below(&r, (uint32_t)nseeds)];
        vec_set(&v, sd->p, sd->n);
        mutate_json(&r, &v, &seeds[tu_rng_below(&r, (uint32_t)nseeds)]);
        TU_CHECK(tu_write_file(path, v.p, v.n) == 0);
        wna16_model_config_t c;
        wna16_error_t err;
        wna16_status_t s = wna16_model_config_load(path, &c, &err);
        if (s == WNA16_OK) {
            t.accepted++;
            check_config(&c);
        } else {
            t.rejected++;
            check_failure(s, &err, "config", i);
        }
    }
    printf("config.json: %d inputs: %d accepted, %d rejected\n", CONFIG_CASES,
           t.accepted, t.rejected);
    TU_CHECK(t.accepted > 0 && t.rejected > 0);
    unlink(path);
    free(path);
    vec_free(&v);
    for (size_t i = 0; i < nseeds; i++)
        vec_free(&seeds[i]);
}

/* ---- checkpoint directories ----------------------------------------------- */

static void write_shard(wna16_context_t *ctx, const char *dir,
                        const char *file, const char *const *names, int n)
{
    char *path = stt_path(dir, file);
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    for (int i = 0; w && i < n; i++) {
        int64_t shape[] = {2, i + 1};
        TU_OK(wna16_safetensors_writer_declare(w, names[i], WNA16_DTYPE_F16, 2,
                                               shape, &err), &err);
    }
    static const unsigned char bytes[64] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; w && i < n; i++)
        TU_OK(wna16_safetensors_writer_write(w, bytes, (size_t)(i + 1) * 4,
                                             &err), &err);
    if (w)
        TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    free(path);
}

static const char *const ck_index =
    "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
    "\"e.0.qweight\":\"model-00001-of-00002.safetensors\","
    "\"e.0.scales\":\"model-00001-of-00002.safetensors\","
    "\"e.1.qweight\":\"model-00002-of-00002.safetensors\","
    "\"e.1.scales\":\"model-00002-of-00002.safetensors\","
    "\"e.1.qzeros\":\"model-00002-of-00002.safetensors\"}}";

static const char *const ck_dirty[] = {
    "../x.safetensors", "a/b.safetensors", "model-00003-of-00003.safetensors",
    "config.json", "model.safetensors.index.json", "..", "",
};

static void fuzz_checkpoints(wna16_context_t *ctx)
{
    char *dir = stt_tempdir("ckfuzz");
    const char *s1[] = {"e.0.qweight", "e.0.scales"};
    const char *s2[] = {"e.1.qweight", "e.1.scales", "e.1.qzeros"};
    write_shard(ctx, dir, "model-00001-of-00002.safetensors", s1, 2);
    write_shard(ctx, dir, "model-00002-of-00002.safetensors", s2, 3);
    char *shard_path = stt_path(dir, "model-00002-of-00002.safetensors");
    size_t shard_size;
    unsigned char *shard = tu_read_file(shard_path, &shard_size);
    vec_t idx_seed = {0}, cfg_seed = {0}, v = {0};
    vec_set(&idx_seed, ck_index, strlen(ck_index));
    vec_set(&cfg_seed, config_seeds[0], strlen(config_seeds[0]));
    tu_rng_t r;
    tu_rng_seed(&r, 0xc4e7);
    tally_t t = {0, 0};
    for (int i = 0; i < CKPT_CASES; i++) {
        uint32_t what = tu_rng_below(&r, 8);
        /* reset the directory to the valid checkpoint */
        TU_CHECK(stt_write_text(dir, "config.json", config_seeds[0]) == 0);
        TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                                ck_index) == 0);
        TU_CHECK(tu_write_file(shard_path, shard, shard_size) == 0);
        const char *file = "model.safetensors.index.json";
        if (what < 4) { /* the index */
            vec_set(&v, idx_seed.p, idx_seed.n);
            if (what == 0) { /* a hostile shard name */
                size_t at = find_str(&r, &v, "\"model-0000");
                if (at != SIZE_MAX) {
                    size_t e = at + 1;
                    while (e < v.n && v.p[e] != '"')
                        e++;
                    char q[64];
                    snprintf(q, sizeof q, "\"%s", PICK(&r, ck_dirty));
                    vec_replace(&v, at, e - at, q);
                }
            } else {
                mutate_json(&r, &v, &cfg_seed);
            }
        } else if (what < 6) { /* config.json */
            file = "config.json";
            vec_set(&v, cfg_seed.p, cfg_seed.n);
            mutate_json(&r, &v, &idx_seed);
        } else { /* a shard */
            file = "model-00002-of-00002.safetensors";
            vec_set(&v, shard, shard_size);
            uint32_t k = 1 + tu_rng_below(&r, 3);
            for (uint32_t m = 0; m < k; m++)
                byte_mutation(&r, &v, tu_rng_below(&r, 2) ? 8 : 0);
        }
        char *p = stt_path(dir, file);
        TU_CHECK(tu_write_file(p, v.p, v.n) == 0);
        free(p);
        wna16_error_t err;
        wna16_checkpoint_t *ck = NULL;
        wna16_status_t s = wna16_checkpoint_open(ctx, dir, &ck, &err);
        if (s == WNA16_OK) {
            t.accepted++;
            uint64_t sum = 0;
            for (size_t k = 0; k < wna16_checkpoint_tensor_count(ck); k++) {
                const wna16_tensor_t *tt = wna16_checkpoint_tensor_at(ck, k);
                TU_CHECK(wna16_checkpoint_find(ck, tt->name) == tt);
                for (size_t b = 0; b < tt->nbytes; b++)
                    sum += ((const unsigned char *)tt->data)[b];
            }
            if (wna16_checkpoint_config(ck))
                check_config(wna16_checkpoint_config(ck));
            (void)sum;
            wna16_checkpoint_close(ck);
        } else {
            t.rejected++;
            check_failure(s, &err, "checkpoint", i);
            TU_CHECK(ck == NULL);
        }
    }
    printf("checkpoints: %d directories: %d accepted, %d rejected\n",
           CKPT_CASES, t.accepted, t.rejected);
    TU_CHECK(t.accepted > 0 && t.rejected > 0);
    free(shard);
    free(shard_path);
    vec_free(&idx_seed);
    vec_free(&cfg_seed);
    vec_free(&v);
    stt_rmtree(dir);
    free(dir);
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    char *dir = stt_tempdir("stfuzz");
    seeds_t seeds = {0};
    build_seeds(ctx, &seeds, dir);
    printf("seeds: %zu files\n", seeds.n);
    fuzz_safetensors(ctx, &seeds, dir);
    fuzz_configs(dir);
    fuzz_checkpoints(ctx);
    for (size_t i = 0; i < seeds.n; i++) {
        vec_free(&seeds.items[i].header);
        vec_free(&seeds.items[i].data);
    }
    free(seeds.items);
    stt_rmtree(dir);
    free(dir);
    wna16_context_destroy(ctx);
    return tu_finish("test_safetensors_fuzz");
}
