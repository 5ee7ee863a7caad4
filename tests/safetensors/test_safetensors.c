/*
 * test_safetensors.c - the safetensors reader and writer: a writer->reader
 * round trip over every dtype (scalars, zero-size tensors, metadata with
 * characters that need escaping), the exact bytes of a small known file,
 * one targeted negative case per header validation rule (with the message
 * text checked), the writer's error paths (no partial or temporary file is
 * ever left behind) and the golden vLLM files in WNA16_GOLDEN_DIR.
 */
#define _POSIX_C_SOURCE 200809L
#include "st_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- round trip ----------------------------------------------------------- */

typedef struct rt_tensor {
    const char *name;
    wna16_dtype_t dtype;
    int ndim;
    int64_t shape[WNA16_MAX_DIMS];
} rt_tensor_t;

static const rt_tensor_t rt_tensors[] = {
    {"f16.matrix", WNA16_DTYPE_F16, 2, {3, 5}},
    {"bf16.vector", WNA16_DTYPE_BF16, 1, {7}},
    {"f32.cube", WNA16_DTYPE_F32, 3, {2, 3, 4}},
    {"i32.scalar", WNA16_DTYPE_I32, 0, {0}},
    {"u8.bytes", WNA16_DTYPE_U8, 1, {13}},
    {"i8.empty", WNA16_DTYPE_I8, 2, {0, 4}},
    {"i16.eight_dims", WNA16_DTYPE_I16, 8, {1, 2, 1, 2, 1, 2, 1, 3}},
    {"i64.pair", WNA16_DTYPE_I64, 1, {2}},
    {"weird \"name\" \\ with\nescapes/\xc3\xa9", WNA16_DTYPE_U8, 1, {3}},
    {"zero.last", WNA16_DTYPE_F32, 1, {0}},
    /* the dtypes wna16's kernels never read: passed through as bytes */
    {"bool.mask", WNA16_DTYPE_BOOL, 1, {5}},
    {"u16.v", WNA16_DTYPE_U16, 1, {3}},
    {"u32.v", WNA16_DTYPE_U32, 2, {2, 2}},
    {"u64.v", WNA16_DTYPE_U64, 1, {2}},
    {"f64.v", WNA16_DTYPE_F64, 1, {3}},
    {"c64.v", WNA16_DTYPE_C64, 1, {2}},
    {"fp8.e4m3", WNA16_DTYPE_F8_E4M3, 2, {3, 7}},
    {"fp8.e5m2", WNA16_DTYPE_F8_E5M2, 1, {9}},
    {"fp8.e8m0", WNA16_DTYPE_F8_E8M0, 1, {4}},
    {"fp8.e4m3fnuz", WNA16_DTYPE_F8_E4M3FNUZ, 1, {2}},
    {"fp8.e5m2fnuz", WNA16_DTYPE_F8_E5M2FNUZ, 1, {2}},
    {"fp6.e2m3", WNA16_DTYPE_F6_E2M3, 2, {2, 4}},
    {"fp6.e3m2", WNA16_DTYPE_F6_E3M2, 1, {8}},
    {"fp4.packed", WNA16_DTYPE_F4, 2, {3, 6}},
};
#define RT_N (sizeof rt_tensors / sizeof rt_tensors[0])

static size_t rt_bytes(const rt_tensor_t *t)
{
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        numel *= (uint64_t)t->shape[i];
    size_t n = 0;
    TU_CHECK_MSG(wna16_dtype_nbytes(t->dtype, numel, &n), "%s", t->name);
    return n;
}

/* Writes rt_tensors with random data in random chunk sizes. */
static void rt_write(wna16_context_t *ctx, const char *path,
                     unsigned char **data)
{
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    tu_rng_t rng;
    tu_rng_seed(&rng, 42);
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    if (!w)
        return;
    TU_OK(wna16_safetensors_writer_metadata(w, "format", "pt", &err), &err);
    TU_OK(wna16_safetensors_writer_metadata(w, "quote\"key", "line\nbreak \xe2\x82\xac",
                                            &err), &err);
    for (size_t i = 0; i < RT_N; i++) {
        const rt_tensor_t *t = &rt_tensors[i];
        TU_OK(wna16_safetensors_writer_declare(w, t->name, t->dtype, t->ndim,
                                               t->shape, &err), &err);
    }
    for (size_t i = 0; i < RT_N; i++) {
        size_t n = rt_bytes(&rt_tensors[i]);
        data[i] = malloc(n ? n : 1);
        for (size_t k = 0; k < n; k++)
            data[i][k] = (unsigned char)tu_rng_next(&rng);
        for (size_t off = 0; off < n;) {
            size_t chunk = 1 + tu_rng_below(&rng, 9);
            if (chunk > n - off)
                chunk = n - off;
            TU_OK(wna16_safetensors_writer_write(w, data[i] + off, chunk, &err),
                  &err);
            off += chunk;
        }
    }
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
}

static void rt_check(const wna16_safetensors_t *st, unsigned char **data)
{
    TU_CHECK(wna16_safetensors_count(st) == RT_N);
    for (size_t i = 0; i < RT_N && i < wna16_safetensors_count(st); i++) {
        const rt_tensor_t *want = &rt_tensors[i];
        const wna16_tensor_t *t = wna16_safetensors_at(st, i);
        TU_CHECK_MSG(strcmp(t->name, want->name) == 0, "%zu: %s", i, t->name);
        TU_CHECK(wna16_safetensors_find(st, want->name) == t);
        TU_CHECK(t->dtype == want->dtype);
        TU_CHECK(t->ndim == want->ndim);
        for (int d = 0; d < t->ndim; d++)
            TU_CHECK(t->shape[d] == want->shape[d]);
        TU_CHECK(t->nbytes == rt_bytes(want));
        TU_CHECK(t->nbytes == 0 || memcmp(t->data, data[i], t->nbytes) == 0);
    }
    TU_CHECK(wna16_safetensors_find(st, "absent") == NULL);
    TU_CHECK(wna16_safetensors_metadata_count(st) == 2);
    const char *k0 = wna16_safetensors_metadata_key(st, 0);
    TU_CHECK(k0 && strcmp(k0, "format") == 0);
    const char *v = wna16_safetensors_metadata_get(st, "quote\"key");
    TU_CHECK(v && strcmp(v, "line\nbreak \xe2\x82\xac") == 0);
    TU_CHECK(wna16_safetensors_metadata_get(st, "nope") == NULL);
    TU_CHECK(wna16_safetensors_metadata_key(st, 2) == NULL);
    TU_CHECK(wna16_safetensors_at(st, RT_N) == NULL);
}

static void test_round_trip(wna16_context_t *ctx, const char *dir)
{
    char *path = stt_path(dir, "rt.safetensors");
    unsigned char *data[RT_N] = {0};
    wna16_error_t err;
    rt_write(ctx, path, data);

    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, path, &st, &err), &err);
    if (st) {
        rt_check(st, data);
        TU_CHECK(strcmp(wna16_safetensors_path(st), path) == 0);
        wna16_safetensors_close(st);
    }
    size_t size;
    void *bytes = tu_read_file(path, &size);
    TU_CHECK(bytes != NULL);
    if (bytes) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = (hl << 8) | ((unsigned char *)bytes)[i];
        TU_CHECK(hl % 8 == 0); /* padded: tensor data 8-byte aligned */
        TU_OK(wna16_safetensors_open_memory(ctx, "rt", bytes, size, &st, &err),
              &err);
        if (st) {
            rt_check(st, data);
            wna16_safetensors_close(st);
        }
        free(bytes);
    }

    /* the same tensors through wna16_safetensors_write_set */
    wna16_tensor_set_t *set = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
    for (size_t i = 0; set && i < RT_N; i++) {
        const rt_tensor_t *t = &rt_tensors[i];
        wna16_tensor_t view = {.name = t->name, .dtype = t->dtype,
                               .ndim = t->ndim, .data = data[i],
                               .nbytes = rt_bytes(t)};
        memcpy(view.shape, t->shape, sizeof view.shape);
        TU_OK(wna16_tensor_set_add_view(set, &view, &err), &err);
    }
    const char *keys[] = {"format", "quote\"key"};
    const char *vals[] = {"pt", "line\nbreak \xe2\x82\xac"};
    char *path2 = stt_path(dir, "set.safetensors");
    TU_OK(wna16_safetensors_write_set(ctx, path2, set, 2, keys, vals, &err),
          &err);
    TU_OK(wna16_safetensors_open(ctx, path2, &st, &err), &err);
    if (st) {
        rt_check(st, data);
        wna16_safetensors_close(st);
    }
    /* a view whose byte count disagrees with its shape is refused */
    wna16_tensor_t bad = {.name = "bad", .dtype = WNA16_DTYPE_F32, .ndim = 1,
                          .shape = {4}, .data = data[0], .nbytes = 3};
    TU_OK(wna16_tensor_set_add_view(set, &bad, &err), &err);
    char *path3 = stt_path(dir, "bad_set.safetensors");
    STT_EXPECT_ERR(wna16_safetensors_write_set(ctx, path3, set, 0, NULL, NULL,
                                               &err), &err, WNA16_EINVAL,
                   "tensor 'bad' has 3 bytes but its shape needs 16");
    TU_CHECK(!tu_exists(path3));
    wna16_tensor_set_destroy(set);
    for (size_t i = 0; i < RT_N; i++)
        free(data[i]);
    free(path);
    free(path2);
    free(path3);
}

/* ---- exact bytes ---------------------------------------------------------- */

static void test_exact_bytes(wna16_context_t *ctx, const char *dir)
{
    static const char expected[] =
        "\x90\0\0\0\0\0\0\0"
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"w\":{\"dtype\":\"F16\",\"shape\":[2,1],\"data_offsets\":[0,4]},"
        "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}"
        "     "
        "\x00\x3c\x00\xc0";
    const size_t expected_len = sizeof expected - 1;
    char *path = stt_path(dir, "exact.safetensors");
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    int64_t s21[] = {2, 1}, s0[] = {0};
    uint16_t vals[] = {wna16_f32_to_f16(1.0f), wna16_f32_to_f16(-2.0f)};
    unsigned char le[4] = {(unsigned char)vals[0], (unsigned char)(vals[0] >> 8),
                           (unsigned char)vals[1], (unsigned char)(vals[1] >> 8)};
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    TU_OK(wna16_safetensors_writer_metadata(w, "format", "pt", &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, "w", WNA16_DTYPE_F16, 2, s21,
                                           &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, "z", WNA16_DTYPE_U8, 1, s0, &err),
          &err);
    TU_OK(wna16_safetensors_writer_write(w, le, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    size_t size = 0;
    unsigned char *got = tu_read_file(path, &size);
    TU_CHECK_MSG(got && size == expected_len, "size %zu, want %zu", size,
                 expected_len);
    TU_CHECK(got && size == expected_len &&
             memcmp(got, expected, expected_len) == 0);
    free(got);

    /* no tensors, no metadata: "{}" and six spaces */
    char *path2 = stt_path(dir, "empty.safetensors");
    TU_OK(wna16_safetensors_writer_create(ctx, path2, &w, &err), &err);
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    got = tu_read_file(path2, &size);
    TU_CHECK(got && size == 16 &&
             memcmp(got, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(got);
    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, path2, &st, &err), &err);
    TU_CHECK(st && wna16_safetensors_count(st) == 0 &&
             wna16_safetensors_metadata_count(st) == 0);
    wna16_safetensors_close(st);
    free(path);
    free(path2);
}

/* ---- header validation ---------------------------------------------------- */

typedef struct neg_case {
    const char *header;
    size_t data_len;
    const char *needle;
} neg_case_t;

#define E(dt, shape, offs) "{\"dtype\":\"" dt "\",\"shape\":" shape \
                           ",\"data_offsets\":" offs "}"

static const neg_case_t neg_cases[] = {
    /* JSON and framing */
    {"[]", 0, "does not start with '{'"},
    {" {}", 0, "does not start with '{'"},
    {"{\"a\":", 0, "not valid JSON"},
    {"{}x", 0, "trailing bytes after the JSON object (at byte 2"},
    {"{}  \n", 0, "trailing bytes"},
    {"{} \x01", 0, "header byte 3 (0x01) is not valid in JSON text"},
    {"{\"\xff\":1}", 0, "header byte 2 (0xff)"},
    {"{\"\xc0\x80\":1}", 0, "not valid in JSON text"},
    {"{\"\xed\xa0\x80\":1}", 0, "not valid in JSON text"},
    {"{\"a\tb\":1}", 0, "header byte 3 (0x09) is not valid in JSON text"},
    {"{\"x\":" E("U8", "[01]", "[0,1]") "}", 1,
     "header byte 28: malformed JSON number"},
    {"{\"x\":" E("U8", "[1.]", "[0,1]") "}", 1, "malformed JSON number"},
    {"{\"x\":" E("U8", "[1]", "[0,1e]") "}", 1, "malformed JSON number"},
    {"{\"x\":" E("U8", "[-]", "[0,1]") "}", 1, "malformed JSON number"},
    {"{\"x\\u0000y\":" E("U8", "[1]", "[0,1]") "}", 1,
     "header byte 3: \\u0000 is not allowed in names"},
    /* entry structure */
    {"{\"x\":[1]}", 0, "tensor 'x': expected an object"},
    {"{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],"
     "\"extra\":1}}", 0, "tensor 'x': unknown key 'extra'"},
    {"{\"x\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[0],"
     "\"data_offsets\":[0,0]}}", 0, "tensor 'x': duplicate key 'dtype'"},
    {"{\"x\":{\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
     "tensor 'x': missing key 'dtype'"},
    {"{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,0]}}", 0,
     "tensor 'x': missing key 'shape'"},
    {"{\"x\":{\"dtype\":\"U8\",\"shape\":[0]}}", 0,
     "tensor 'x': missing key 'data_offsets'"},
    /* dtype */
    {"{\"x.w\":" E("F8_E4M3FN", "[1]", "[0,1]") "}", 1,
     "tensor 'x.w': unsupported dtype 'F8_E4M3FN'"},
    {"{\"x\":" E("F4", "[3]", "[0,2]") "}", 1,
     "tensor 'x': shape: the elements of a sub-byte dtype are not a whole "
     "number of bytes"},
    {"{\"x\":" E("F6_E2M3", "[2]", "[0,2]") "}", 1,
     "not a whole number of bytes"},
    {"{\"x\":" E("f16", "[1]", "[0,2]") "}", 2, "unsupported dtype 'f16'"},
    {"{\"x\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     "tensor 'x': dtype: expected a string"},
    /* shape */
    {"{\"x\":" E("U8", "[1.5]", "[0,1]") "}", 1,
     "tensor 'x': shape[0]: expected a non-negative integer"},
    {"{\"x\":" E("U8", "[2,-1]", "[0,1]") "}", 1, "shape[1]: expected"},
    {"{\"x\":" E("U8", "[9007199254740993]", "[0,1]") "}", 1,
     "shape[0]: expected a non-negative integer below 2^53"},
    {"{\"x\":" E("U8", "[\"4\"]", "[0,1]") "}", 1, "shape[0]"},
    {"{\"x\":" E("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1,
     "shape has more than 8 dimensions"},
    {"{\"x\":" E("U8", "4", "[0,4]") "}", 4,
     "shape: expected an array of integers"},
    {"{\"x\":" E("U8", "[4294967296,4294967296]", "[0,1]") "}", 1,
     "element count overflows"},
    {"{\"x\":" E("I64", "[4294967296,1073741824]", "[0,1]") "}", 1,
     "byte size overflows"},
    /* data_offsets */
    {"{\"x\":" E("U8", "[1]", "[0]") "}", 1, "data_offsets: expected [begin, end]"},
    {"{\"x\":" E("U8", "[1]", "[0,1,2]") "}", 1, "expected [begin, end]"},
    {"{\"x\":" E("U8", "[1]", "{}") "}", 1, "expected [begin, end]"},
    {"{\"x\":" E("U8", "[1]", "[0.5,1]") "}", 1,
     "data_offsets: expected two non-negative integers"},
    {"{\"x\":" E("U8", "[1]", "[-1,0]") "}", 1, "two non-negative integers"},
    {"{\"x\":" E("U8", "[0]", "[1,0]") "}", 1,
     "data_offsets [1, 0] end before they begin"},
    {"{\"x\":" E("U8", "[2]", "[0,2]") "}", 1,
     "data_offsets [0, 2] run past the data section (1 bytes)"},
    {"{\"x\":" E("U8", "[2]", "[0,18446744073709551615]") "}", 2,
     "two non-negative integers"},
    {"{\"x\":" E("F32", "[2]", "[0,4]") "}", 4,
     "data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8"},
    /* coverage */
    {"{\"a\":" E("U8", "[2]", "[0,2]") ",\"b\":" E("U8", "[2]", "[1,3]") "}",
     3, "tensor 'b': data_offsets [1, 3] overlap tensor 'a'"},
    {"{\"a\":" E("U8", "[1]", "[0,1]") ",\"b\":" E("U8", "[1]", "[2,3]") "}",
     3, "tensor 'b': data_offsets [2, 3] leave a gap of 1 unused bytes"},
    {"{\"a\":" E("U8", "[1]", "[1,2]") "}", 2, "gap of 1 unused bytes"},
    {"{\"a\":" E("U8", "[1]", "[0,1]") "}", 4,
     "3 bytes of the data section (4 bytes) belong to no tensor"},
    {"{}", 1, "1 bytes of the data section (1 bytes) belong to no tensor"},
    {"{\"a\":" E("U8", "[2]", "[0,2]") ",\"z\":" E("U8", "[0]", "[1,1]") "}",
     2, "tensor 'z': data_offsets [1, 1] overlap tensor 'a'"},
    /* duplicate names */
    {"{\"a\":" E("U8", "[1]", "[0,1]") ",\"a\":" E("U8", "[1]", "[1,2]") "}",
     2, "duplicate tensor 'a'"},
    {"{\"a\":" E("U8", "[1]", "[0,1]") ",\"a\":" E("U8", "[1]", "[0,1]") "}",
     1, "duplicate tensor 'a'"},
    /* __metadata__ */
    {"{\"__metadata__\":[]}", 0, "__metadata__: expected an object of strings"},
    {"{\"__metadata__\":{\"k\":1}}", 0,
     "__metadata__: key 'k': expected a string value"},
    {"{\"__metadata__\":{\"k\":null}}", 0, "key 'k': expected a string"},
    {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0,
     "__metadata__: duplicate key 'k'"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0,
     "duplicate key '__metadata__'"},
};

/* Valid headers: zero-size tensors (several at one offset), a scalar,
 * JSON whitespace inside the object and space padding after it. */
static const struct {
    const char *header;
    size_t data_len;
} pos_cases[] = {
    {"{}", 0},
    {"{}      ", 0},
    {"{\"__metadata__\":{}}", 0},
    {"{\"z\":" E("I32", "[2,0]", "[0,0]") "}", 0},
    {"{\"a\":" E("I32", "[2,0]", "[0,0]") ",\"b\":" E("I32", "[0]", "[0,0]")
     ",\"c\":" E("U8", "[3]", "[0,3]") ",\"d\":" E("U8", "[]", "[3,4]")
     ",\"e\":" E("I32", "[0,5]", "[4,4]") "}   ", 4},
    {"{\n\t\"a\" : " E("U8", "[4]", "[0,4]") "\r\n}", 4},
};

static void test_header_rules(wna16_context_t *ctx)
{
    static const unsigned char zeros[64];
    wna16_error_t err;
    for (size_t i = 0; i < sizeof neg_cases / sizeof neg_cases[0]; i++) {
        const neg_case_t *c = &neg_cases[i];
        size_t size;
        unsigned char *b = stt_build(c->header, zeros, c->data_len, &size);
        wna16_safetensors_t *st = (wna16_safetensors_t *)1;
        wna16_status_t s = wna16_safetensors_open_memory(ctx, "t.safetensors",
                                                         b, size, &st, &err);
        STT_EXPECT_ERR(s, &err, WNA16_EFORMAT, c->needle);
        TU_CHECK(st == NULL);
        TU_CHECK(strncmp(err.message, "t.safetensors: ", 15) == 0);
        free(b);
    }
    for (size_t i = 0; i < sizeof pos_cases / sizeof pos_cases[0]; i++) {
        size_t size;
        unsigned char *b = stt_build(pos_cases[i].header, zeros,
                                     pos_cases[i].data_len, &size);
        wna16_safetensors_t *st = NULL;
        TU_OK(wna16_safetensors_open_memory(ctx, "pos", b, size, &st, &err),
              &err);
        if (st && i == 4) {
            /* offset order; zero-size ties keep header order */
            static const char *order[] = {"a", "b", "c", "d", "e"};
            TU_CHECK(wna16_safetensors_count(st) == 5);
            for (size_t k = 0; k < 5 && k < wna16_safetensors_count(st); k++)
                TU_CHECK(strcmp(wna16_safetensors_at(st, k)->name, order[k]) == 0);
            const wna16_tensor_t *d = wna16_safetensors_find(st, "d");
            TU_CHECK(d && d->ndim == 0 && d->nbytes == 1 &&
                     d->data == b + size - 1);
            const wna16_tensor_t *e = wna16_safetensors_find(st, "e");
            TU_CHECK(e && e->nbytes == 0 && wna16_tensor_numel(e) == 0);
        }
        wna16_safetensors_close(st);
        free(b);
    }
}

/* The example from the documentation, character for character. */
static void test_exact_message(wna16_context_t *ctx)
{
    static const unsigned char zeros[16];
    size_t size;
    unsigned char *b = stt_build("{\"x.qweight\":" E("I32", "[4,4]", "[0,10]")
                                 "}", zeros, 10, &size);
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    wna16_status_t s = wna16_safetensors_open_memory(ctx, "model.safetensors",
                                                     b, size, &st, &err);
    TU_CHECK(s == WNA16_EFORMAT);
    TU_CHECK_MSG(strcmp(err.message, "model.safetensors: tensor 'x.qweight': "
                        "data_offsets [0, 10] hold 10 bytes but shape [4, 4] "
                        "of I32 needs 64") == 0, "%s", err.message);
    free(b);
}

static void test_length_field(wna16_context_t *ctx)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    size_t size;
    unsigned char *b;

    b = stt_build_len(1, "{}", NULL, 0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT, "header length 1 is too small");
    free(b);
    b = stt_build_len(0, "{}", NULL, 0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT, "header length 0 is too small");
    free(b);
    b = stt_build_len(3, "{}", NULL, 0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT,
                   "header length 3 runs past the end of the file (2 bytes");
    free(b);
    b = stt_build_len((uint64_t)WNA16_SAFETENSORS_MAX_HEADER + 1, "{}", NULL,
                      0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT, "exceeds the limit of 100000000 bytes");
    free(b);
    b = stt_build_len(UINT64_MAX, "{}", NULL, 0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT, "header length 18446744073709551615");
    free(b);
    /* shorter header length than the JSON: the object is cut */
    b = stt_build_len(2, "{\"a\":1}", NULL, 0, &size);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", b, size, &st, &err),
                   &err, WNA16_EFORMAT, NULL);
    free(b);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", "\2\0\0\0\0\0\0",
                                                 7, &st, &err),
                   &err, WNA16_EFORMAT, "7 bytes is too short");
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", "", 0, &st, &err),
                   &err, WNA16_EFORMAT, "0 bytes is too short");
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", NULL, 4, &st, &err),
                   &err, WNA16_EINVAL, NULL);
    STT_EXPECT_ERR(wna16_safetensors_open_memory(ctx, "m", "", 0, NULL, &err),
                   &err, WNA16_EINVAL, NULL);
}

static void test_file_errors(wna16_context_t *ctx, const char *dir)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    char *missing = stt_path(dir, "missing.safetensors");
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, missing, &st, &err), &err,
                   WNA16_EIO, "missing.safetensors: cannot open");
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, dir, &st, &err), &err,
                   WNA16_EIO, "is a directory");
    char *empty = stt_path(dir, "empty_file.safetensors");
    TU_CHECK(tu_write_file(empty, "", 0) == 0);
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, empty, &st, &err), &err,
                   WNA16_EFORMAT, "0 bytes is too short");
    char *shortf = stt_path(dir, "short.safetensors");
    TU_CHECK(tu_write_file(shortf, "\x02\0\0\0\0", 5) == 0);
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, shortf, &st, &err), &err,
                   WNA16_EFORMAT, "5 bytes is too short");
    char *bad = stt_path(dir, "bad.safetensors");
    size_t size;
    unsigned char *b = stt_build("{\"x\":" E("I4", "[1]", "[0,1]") "}",
                                 "\1", 1, &size);
    TU_CHECK(tu_write_file(bad, b, size) == 0);
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, bad, &st, &err), &err,
                   WNA16_EFORMAT, "bad.safetensors: tensor 'x': unsupported "
                   "dtype 'I4'");
    TU_CHECK(st == NULL);
    free(b);
    /* a FIFO must be refused, not waited on */
    char *fifo = stt_path(dir, "fifo.safetensors");
    TU_CHECK(mkfifo(fifo, 0600) == 0);
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, fifo, &st, &err), &err,
                   WNA16_EIO, "not a regular file");
    unlink(fifo);
    free(fifo);
    STT_EXPECT_ERR(wna16_safetensors_open(ctx, NULL, &st, &err), &err,
                   WNA16_EINVAL, NULL);
    free(missing);
    free(empty);
    free(shortf);
    free(bad);
}

/* ---- writer errors -------------------------------------------------------- */

static wna16_safetensors_writer_t *writer_with(wna16_context_t *ctx,
                                               const char *path)
{
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    int64_t s4[] = {4}, s2[] = {2};
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, "a", WNA16_DTYPE_U8, 1, s4,
                                           &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, "b", WNA16_DTYPE_F16, 1, s2,
                                           &err), &err);
    return w;
}

static void test_writer_errors(wna16_context_t *ctx)
{
    char *dir = stt_tempdir("stwriter");
    char *path = stt_path(dir, "out.safetensors");
    wna16_error_t err;
    wna16_safetensors_writer_t *w;
    const unsigned char bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8};

    /* a chunk that runs past the current tensor */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 3, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_write(w, bytes, 2, &err), &err,
                   WNA16_EINVAL, "tensor 'a': write of 2 bytes but only 1 of "
                   "its 4 bytes are left");
    TU_CHECK(stt_count_entries(dir) == 0); /* temp file gone at once */
    STT_EXPECT_ERR(wna16_safetensors_writer_write(w, bytes, 1, &err), &err,
                   WNA16_EINVAL, "an earlier call failed");
    STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                   WNA16_EINVAL, "an earlier call failed");
    TU_CHECK(!tu_exists(path));

    /* past the last tensor */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 4, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_write(w, bytes, 1, &err), &err,
                   WNA16_EINVAL, "after every tensor is complete");
    wna16_safetensors_writer_abort(w);

    /* finishing with incomplete tensors */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 1, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                   WNA16_EINVAL, "tensor 'b' is incomplete: 1 of 4 bytes "
                   "written");
    TU_CHECK(!tu_exists(path));
    w = writer_with(ctx, path);
    STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                   WNA16_EINVAL, "tensor 'a' is incomplete: 0 of 4");

    /* abort leaves nothing, and never touches an existing file at path */
    TU_CHECK(tu_write_file(path, "keep", 4) == 0);
    w = writer_with(ctx, path);
    TU_CHECK(stt_count_entries(dir) == 2); /* path + its temp file */
    TU_OK(wna16_safetensors_writer_write(w, bytes, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 2, &err), &err);
    wna16_safetensors_writer_abort(w);
    TU_CHECK(stt_count_entries(dir) == 1);
    size_t size;
    char *kept = tu_read_file(path, &size);
    TU_CHECK(kept && size == 4 && memcmp(kept, "keep", 4) == 0);
    free(kept);
    /* ...while finish replaces it */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, bytes + 4, 4, &err), &err);
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, path, &st, &err), &err);
    TU_CHECK(st && wna16_safetensors_count(st) == 2);
    wna16_safetensors_close(st);
    unlink(path);

    /* declarations */
    int64_t s4[] = {4}, neg[] = {-1}, big[] = {INT64_MAX, 2};
    int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    w = writer_with(ctx, path);
    STT_EXPECT_ERR(wna16_safetensors_writer_declare(w, "a", WNA16_DTYPE_U8, 1,
                                                    s4, &err), &err,
                   WNA16_EINVAL, "duplicate tensor 'a'");
    wna16_safetensors_writer_abort(w);
    struct {
        const char *name;
        wna16_dtype_t dtype;
        int ndim;
        const int64_t *shape;
        wna16_status_t status;
        const char *needle;
    } decl[] = {
        {"x", WNA16_DTYPE_INVALID, 1, s4, WNA16_EINVAL, "tensor 'x': invalid dtype"},
        {"x", (wna16_dtype_t)99, 1, s4, WNA16_EINVAL, "invalid dtype 99"},
        {"x", WNA16_DTYPE_U8, 1, neg, WNA16_EINVAL, "dimension 0 is -1"},
        {"x", WNA16_DTYPE_U8, 9, s9, WNA16_EINVAL, "9 dimensions"},
        {"x", WNA16_DTYPE_U8, -1, s4, WNA16_EINVAL, "-1 dimensions"},
        {"x", WNA16_DTYPE_U8, 1, NULL, WNA16_EINVAL, "with a shape"},
        {"x", WNA16_DTYPE_U8, 2, big, WNA16_EINVAL, "dimension 0"},
        {"", WNA16_DTYPE_U8, 1, s4, WNA16_EINVAL, "tensor without a name"},
        {NULL, WNA16_DTYPE_U8, 1, s4, WNA16_EINVAL, "tensor without a name"},
        {"__metadata__", WNA16_DTYPE_U8, 1, s4, WNA16_EINVAL, "reserved"},
        {"bad\xff", WNA16_DTYPE_U8, 1, s4, WNA16_EINVAL, "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof decl / sizeof decl[0]; i++) {
        w = NULL;
        TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
        STT_EXPECT_ERR(wna16_safetensors_writer_declare(
                           w, decl[i].name, decl[i].dtype, decl[i].ndim,
                           decl[i].shape, &err),
                       &err, decl[i].status, decl[i].needle);
        STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                       decl[i].status, "an earlier call failed");
    }
    /* a product that overflows int64 */
    int64_t huge[] = {(int64_t)1 << 40, (int64_t)1 << 40};
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_declare(w, "h", WNA16_DTYPE_U8, 2,
                                                    huge, &err),
                   &err, WNA16_ELIMIT, "element count overflows");
    wna16_safetensors_writer_abort(w);
    int64_t e52[] = {(int64_t)1 << 52};
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_declare(w, "h", WNA16_DTYPE_I64,
                                                    1, e52, &err),
                   &err, WNA16_ELIMIT, "exceed 2^53 bytes");
    wna16_safetensors_writer_abort(w);

    /* declaring or adding metadata after data was written */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 1, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_declare(w, "c", WNA16_DTYPE_U8, 1,
                                                    s4, &err), &err,
                   WNA16_EINVAL, "after tensor data was written");
    wna16_safetensors_writer_abort(w);
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 0, &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_metadata(w, "k", "v", &err), &err,
                   WNA16_EINVAL, "after tensor data was written");
    wna16_safetensors_writer_abort(w);
    /* metadata errors */
    w = writer_with(ctx, path);
    TU_OK(wna16_safetensors_writer_metadata(w, "k", "v", &err), &err);
    STT_EXPECT_ERR(wna16_safetensors_writer_metadata(w, "k", "w", &err), &err,
                   WNA16_EINVAL, "duplicate metadata key 'k'");
    wna16_safetensors_writer_abort(w);
    w = writer_with(ctx, path);
    STT_EXPECT_ERR(wna16_safetensors_writer_metadata(w, "k", NULL, &err), &err,
                   WNA16_EINVAL, "key and value are required");
    wna16_safetensors_writer_abort(w);
    w = writer_with(ctx, path);
    STT_EXPECT_ERR(wna16_safetensors_writer_write(w, NULL, 2, &err), &err,
                   WNA16_EINVAL, "from NULL");
    wna16_safetensors_writer_abort(w);

    /* no directory to write into */
    char *nodir = stt_path(dir, "no/such/dir.safetensors");
    w = (wna16_safetensors_writer_t *)1;
    STT_EXPECT_ERR(wna16_safetensors_writer_create(ctx, nodir, &w, &err), &err,
                   WNA16_EIO, "cannot create temporary file");
    TU_CHECK(w == NULL);
    STT_EXPECT_ERR(wna16_safetensors_writer_create(ctx, NULL, &w, &err), &err,
                   WNA16_EINVAL, NULL);
    STT_EXPECT_ERR(wna16_safetensors_writer_finish(NULL, &err), &err,
                   WNA16_EINVAL, NULL);
    wna16_safetensors_writer_abort(NULL);

    /* many tensors: the name set grows and still catches duplicates */
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    char name[32];
    int64_t s1[] = {1};
    for (int i = 0; i < 500; i++) {
        snprintf(name, sizeof name, "t.%d", i);
        TU_OK(wna16_safetensors_writer_declare(w, name, WNA16_DTYPE_U8, 1, s1,
                                               &err), &err);
    }
    STT_EXPECT_ERR(wna16_safetensors_writer_declare(w, "t.250", WNA16_DTYPE_U8,
                                                    1, s1, &err),
                   &err, WNA16_EINVAL, "duplicate tensor 't.250'");
    wna16_safetensors_writer_abort(w);

    /* a long name (no fixed-size buffers) */
    size_t long_len = 100000;
    char *long_name = malloc(long_len + 1);
    memset(long_name, 'n', long_len);
    long_name[long_len] = '\0';
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, long_name, WNA16_DTYPE_U8, 1, s1,
                                           &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, bytes, 1, &err), &err);
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    TU_OK(wna16_safetensors_open(ctx, path, &st, &err), &err);
    TU_CHECK(st && wna16_safetensors_find(st, long_name) != NULL);
    wna16_safetensors_close(st);
    free(long_name);
    unlink(path);

    TU_CHECK_MSG(stt_count_entries(dir) == 0, "%d files left in %s",
                 stt_count_entries(dir), dir);
    stt_rmtree(dir);
    free(nodir);
    free(path);
    free(dir);
}

/* ---- allocation failures ------------------------------------------------- */

/* Writes a small file with metadata and three tensors; any failure must
 * leave neither the file nor a temporary one. */
static wna16_status_t alloc_write(wna16_context_t *ctx, const char *path,
                                  wna16_error_t *err)
{
    wna16_safetensors_writer_t *w;
    wna16_status_t s = wna16_safetensors_writer_create(ctx, path, &w, err);
    if (s != WNA16_OK)
        return s;
    int64_t sh[] = {3, 2};
    const unsigned char bytes[24] = {0};
    s = wna16_safetensors_writer_metadata(w, "k", "v", err);
    for (int i = 0; i < 40 && s == WNA16_OK; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        s = wna16_safetensors_writer_declare(w, name, WNA16_DTYPE_F32, 2, sh,
                                             err);
    }
    for (int i = 0; i < 40 && s == WNA16_OK; i++)
        s = wna16_safetensors_writer_write(w, bytes, 24, err);
    if (s != WNA16_OK) {
        wna16_safetensors_writer_abort(w);
        return s;
    }
    return wna16_safetensors_writer_finish(w, err);
}

/* Fails the n-th allocation for n = 0, 1, ... until the call succeeds:
 * every failure is ENOMEM and frees everything, with the right sizes. */
static void test_alloc_failures(void)
{
    stt_alloc_t al;
    stt_alloc_init(&al);
    wna16_context_t *ctx = stt_alloc_context(&al);
    char *dir = stt_tempdir("stalloc");
    char *path = stt_path(dir, "a.safetensors");
    wna16_error_t err;
    long base = al.live;
    int failures = 0;
    wna16_status_t s = WNA16_ENOMEM;
    for (long n = 0; n < 10000 && s != WNA16_OK; n++) {
        al.countdown = n;
        s = alloc_write(ctx, path, &err);
        al.countdown = -1;
        if (s != WNA16_OK) {
            failures++;
            STT_EXPECT_ERR(s, &err, WNA16_ENOMEM, "out of memory");
            TU_CHECK(stt_count_entries(dir) == 0);
        }
        TU_CHECK_MSG(al.live == base, "write, failing at %ld: %ld blocks "
                     "leaked", n, al.live - base);
    }
    TU_CHECK(s == WNA16_OK && failures > 3);
    size_t size;
    void *bytes = tu_read_file(path, &size);
    s = WNA16_ENOMEM;
    for (long n = 0; bytes && n < 10000 && s != WNA16_OK; n++) {
        wna16_safetensors_t *st = NULL;
        al.countdown = n;
        s = wna16_safetensors_open_memory(ctx, "a", bytes, size, &st, &err);
        al.countdown = -1;
        if (s == WNA16_OK) {
            TU_CHECK(wna16_safetensors_count(st) == 40);
            wna16_safetensors_close(st);
        } else {
            STT_EXPECT_ERR(s, &err, WNA16_ENOMEM, "out of memory");
        }
        TU_CHECK_MSG(al.live == base, "open, failing at %ld: %ld blocks "
                     "leaked", n, al.live - base);
    }
    TU_CHECK(s == WNA16_OK);
    TU_CHECK_MSG(al.size_mismatch == 0, "%ld frees with the wrong size",
                 al.size_mismatch);
    free(bytes);
    unlink(path);
    stt_rmtree(dir);
    free(path);
    free(dir);
    wna16_context_destroy(ctx);
    TU_CHECK(al.live == 0);
}

/* ---- golden files --------------------------------------------------------- */

static uint64_t sum_bytes(const wna16_safetensors_t *st)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < wna16_safetensors_count(st); i++) {
        const wna16_tensor_t *t = wna16_safetensors_at(st, i);
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const unsigned char *)t->data)[k];
    }
    return sum;
}

static void check_shape(const wna16_safetensors_t *st, const char *name,
                        wna16_dtype_t dtype, int ndim, const int64_t *shape)
{
    const wna16_tensor_t *t = wna16_safetensors_find(st, name);
    TU_CHECK_MSG(t != NULL, "%s missing", name);
    if (!t)
        return;
    TU_CHECK_MSG(t->dtype == dtype && t->ndim == ndim, "%s", name);
    for (int i = 0; i < ndim && i < t->ndim; i++)
        TU_CHECK_MSG(t->shape[i] == shape[i], "%s dim %d", name, i);
}

static void test_golden_known(wna16_context_t *ctx)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    const char *p = WNA16_GOLDEN_DIR
        "/gptq_b4_g32_pad/expected_marlin.safetensors";
    TU_OK(wna16_safetensors_open(ctx, p, &st, &err), &err);
    if (!st)
        return;
    const char *pre = "model.layers.0.mlp.experts.";
    char name[128];
    snprintf(name, sizeof name, "%sw13_qweight", pre);
    check_shape(st, name, WNA16_DTYPE_I32, 3, (const int64_t[]){2, 8, 768});
    snprintf(name, sizeof name, "%sw2_scales", pre);
    check_shape(st, name, WNA16_DTYPE_F16, 3, (const int64_t[]){2, 6, 128});
    snprintf(name, sizeof name, "%sw13_g_idx", pre);
    check_shape(st, name, WNA16_DTYPE_I32, 2, (const int64_t[]){2, 0});
    const char *bits = wna16_safetensors_metadata_get(st, "num_bits");
    TU_CHECK(bits && strcmp(bits, "4") == 0);
    const char *ip = wna16_safetensors_metadata_get(st, "intermediate_size_padded");
    TU_CHECK(ip && strcmp(ip, "192") == 0);
    wna16_safetensors_close(st);

    p = WNA16_GOLDEN_DIR "/gptq_b4_g32_pad/model.safetensors";
    TU_OK(wna16_safetensors_open(ctx, p, &st, &err), &err);
    if (!st)
        return;
    TU_CHECK(wna16_safetensors_count(st) == 2 * 3 * 4); /* E x proj x role */
    check_shape(st, "model.layers.0.mlp.experts.0.down_proj.qweight",
                WNA16_DTYPE_I32, 2, (const int64_t[]){20, 128});
    check_shape(st, "model.layers.0.mlp.experts.1.gate_proj.scales",
                WNA16_DTYPE_F16, 2, (const int64_t[]){4, 160});
    const wna16_tensor_t *qz = wna16_safetensors_find(
        st, "model.layers.0.mlp.experts.0.gate_proj.qzeros");
    if (qz) {
        uint32_t w0;
        memcpy(&w0, qz->data, 4);
        TU_CHECK(w0 == 0x77777777u); /* README: GPTQ 4-bit sym qzeros */
    }
    const char *seed = wna16_safetensors_metadata_get(st, "seed");
    TU_CHECK(seed && strcmp(seed, "1106") == 0);
    wna16_safetensors_close(st);
}

/* Opens every .safetensors file of every case, by file and in memory. */
static void test_golden_all(wna16_context_t *ctx)
{
    DIR *d = opendir(WNA16_GOLDEN_DIR);
    if (!d)
        return;
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char *cdir = stt_path(WNA16_GOLDEN_DIR, e->d_name);
        DIR *cd = opendir(cdir);
        struct dirent *f;
        while (cd && (f = readdir(cd))) {
            size_t n = strlen(f->d_name);
            if (n < 12 || strcmp(f->d_name + n - 12, ".safetensors") != 0)
                continue;
            char *p = stt_path(cdir, f->d_name);
            wna16_error_t err;
            wna16_safetensors_t *st = NULL, *sm = NULL;
            TU_OK(wna16_safetensors_open(ctx, p, &st, &err), &err);
            size_t size;
            void *bytes = tu_read_file(p, &size);
            TU_OK(wna16_safetensors_open_memory(ctx, p, bytes, size, &sm, &err),
                  &err);
            if (st && sm) {
                TU_CHECK(wna16_safetensors_count(st) > 0);
                TU_CHECK(wna16_safetensors_count(st) ==
                         wna16_safetensors_count(sm));
                TU_CHECK(sum_bytes(st) == sum_bytes(sm));
                files++;
            }
            wna16_safetensors_close(st);
            wna16_safetensors_close(sm);
            free(bytes);
            free(p);
        }
        if (cd)
            closedir(cd);
        free(cdir);
    }
    closedir(d);
    printf("golden: opened %d safetensors files\n", files);
    TU_CHECK(files >= 8);
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    char *dir = stt_tempdir("safetensors");
    test_round_trip(ctx, dir);
    test_exact_bytes(ctx, dir);
    test_header_rules(ctx);
    test_exact_message(ctx);
    test_length_field(ctx);
    test_file_errors(ctx, dir);
    test_writer_errors(ctx);
    test_alloc_failures();
    if (tu_exists(WNA16_GOLDEN_DIR)) {
        test_golden_known(ctx);
        test_golden_all(ctx);
    } else {
        printf("note: %s is absent; golden files not checked\n",
               WNA16_GOLDEN_DIR);
    }
    stt_rmtree(dir);
    free(dir);
    wna16_context_destroy(ctx);
    return tu_finish("test_safetensors");
}
