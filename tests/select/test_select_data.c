/*
 * test_select_data.c - selection is data-driven: specs loaded with small
 * textual changes change the answers accordingly (priority order, by_name,
 * kernel_platforms, a format's may_have_bias, a kernel's activation list,
 * reason templates with every placeholder, long templates truncated
 * safely), spec bugs surface as WNA16_ESPEC naming the file and JSON path
 * (an evaluation error, a fallback to an unregistered format). Also: the
 * messages listing known formats and requestable backends, the default
 * kernel mask (wna16_build_kernel_platforms and kernel_platforms = 0), the
 * INFO/DEBUG log lines, and NULL arguments.
 */
#include "select_test.h"

#include <stdlib.h>
#include <string.h>

#define TRITON_SPEC "specs/backends/triton.json"
#define R_DEV90 "kernel does not support current device cuda with compute " \
    "capability 9.0"

/* ---- helpers ---------------------------------------------------------------- */

static wna16_status_t select_row(wna16_context_t *ctx, const st_row_t *r,
                                 wna16_select_result_t *res,
                                 wna16_error_t *err)
{
    wna16_select_query_t q;
    st_query(r, &q);
    wna16_error_clear(err);
    return wna16_select(ctx, &q, res, err);
}

/* Loads one mutated spec and runs rows against it. */
static void run_mutated(const char *rel, const char *from, const char *to,
                        const st_row_t *rows, size_t n)
{
    wna16_context_t *ctx = st_context_mutated(rel, &from, &to, 1);
    if (!ctx)
        return;
    st_run_all(ctx, rows, n);
    wna16_context_destroy(ctx);
}

#define RUN_MUTATED(rel, from, to, rows) \
    run_mutated(rel, from, to, rows, sizeof rows / sizeof rows[0])

/* ---- data drives the answers ------------------------------------------------ */

/* The facts-sheet expectation for ROCm (CT 4-bit sym -> TRITON) holds once
 * the TRITON spec says wna16 has ROCm kernels for it. */
static void test_rocm_triton_target(void)
{
    static const st_row_t rows[] = {
        {"rocm_ct_triton", .fmt = "compressed_tensors",
         .plat = WNA16_PLATFORM_ROCM, .cc = 94, .km = ST_KM_ALL,
         .want = "triton",
         .po = {{"marlin", "Marlin not supported for this layer"}}},
        {"rocm_ct_triton_build_lacks_rocm", .fmt = "compressed_tensors",
         .plat = WNA16_PLATFORM_ROCM, .cc = 94, .km = ST_KM_DEFAULT,
         .st = WNA16_EUNSUPPORTED,
         .po = {{"triton", "this wna16 build has no rocm kernel target"}}},
    };
    RUN_MUTATED(TRITON_SPEC, "\"kernel_platforms\": [\"cuda\", \"xpu\"]",
                "\"kernel_platforms\": [\"cuda\", \"rocm\", \"xpu\"]", rows);
}

/* TRITON's layout and act-order gate rules: with the built-in specs GPTQ and
 * AWQ always may carry bias, so vLLM reports the bias first. */
static void test_triton_layout_gates(void)
{
    static const st_row_t gptq[] = {
        {"triton_gptq_actorder", .fmt = "gptq", .ao = 1, .backend = "triton",
         .st = WNA16_EUNSUPPORTED, .exact = 1,
         .err = "since GPTQ activation ordering is not supported.",
         .po = {{"triton", "GPTQ activation ordering is not supported"}}},
        {"triton_gptq_no_actorder", .fmt = "gptq", .backend = "triton",
         .want = "triton"},
        {"triton_gptq_bias_flag", .fmt = "gptq", .bias = 1,
         .backend = "triton", .st = WNA16_EUNSUPPORTED,
         .po = {{"triton", "expert bias is not supported"}}},
    };
    static const st_row_t awq[] = {
        {"triton_awq_layout", .fmt = "awq", .zp = 1, .backend = "triton",
         .st = WNA16_EUNSUPPORTED, .exact = 1,
         .po = {{"triton", "the AutoAWQ weight layout is not supported"}}},
    };
    RUN_MUTATED("specs/formats/gptq.json", "\"may_have_bias\": \"1\"",
                "\"may_have_bias\": \"0\"", gptq);
    RUN_MUTATED("specs/formats/awq.json", "\"may_have_bias\": \"1\"",
                "\"may_have_bias\": \"0\"", awq);
}

/* TRITON's activation rule (every known activation is in its list). */
static void test_triton_activation(void)
{
    static const st_row_t rows[] = {
        {"triton_gelu_tanh", .fmt = "compressed_tensors", .H = 192,
         .act = "gelu_tanh", .want = "humming",
         .po = {{"triton", "kernel does not support gelu_tanh activation"}}},
    };
    RUN_MUTATED(TRITON_SPEC,
                "\"activation_not_in\": [\"silu\", \"gelu\", \"gelu_tanh\", ",
                "\"activation_not_in\": [\"silu\", \"gelu\", ", rows);
}

/* Priority order comes from the specs: MARLIN moved last. */
static void test_priority_from_data(void)
{
    static const st_row_t rows[] = {
        {"marlin_last", .fmt = "gptq", .want = "humming", .exact = 1,
         .po = {{"flashinfer_trtllm", "zero points and bias are not "
                                      "supported"},
                {"batched_marlin", "kernel does not support standard "
                                   "activation format"},
                {"triton", "expert bias is not supported"}}},
    };
    RUN_MUTATED("specs/backends/marlin.json", "\"cuda\": 2", "\"cuda\": 9",
                rows);
}

/* by_name comes from the specs. */
static void test_by_name_from_data(void)
{
    static const st_row_t rows[] = {
        {"renamed_accepted", .fmt = "gptq", .backend = "marlin_v2",
         .want = "marlin", .exact = 1},
        {"old_name_refused", .fmt = "gptq", .backend = "marlin",
         .st = WNA16_EINVAL, .err = "Expected one of ["},
    };
    wna16_context_t *ctx = st_context_mutated(
        "specs/backends/marlin.json", (const char *[]){"\"by_name\": \"marlin\""},
        (const char *[]){"\"by_name\": \"marlin_v2\""}, 1);
    if (!ctx)
        return;
    st_run_all(ctx, rows, sizeof rows / sizeof rows[0]);
    wna16_select_result_t res;
    wna16_error_t err;
    select_row(ctx, &rows[1], &res, &err);
    TU_CHECK_MSG(strstr(err.message, "'marlin_v2'"), "%s", err.message);
    wna16_context_destroy(ctx);
}

/* ---- reason templates -------------------------------------------------------- */

static void test_placeholders(void)
{
    static const char *tmpl =
        "zp {platform}|{device}|{activation}|{act_format}|{scheme}|{format}|"
        "{bits}|{group_size}|{hidden}|{nope}|{|{bits";
    static const char *want =
        "zp cuda|cuda with compute capability 8.6|gelu|standard|kInt8Static|"
        "gptq|8|-1|512|{nope}|{|{bits";
    char to[300];
    snprintf(to, sizeof to, "\"reason\": \"%s\"", tmpl);
    const char *from = "\"reason\": \"zero points and bias are not supported\"";
    const char *top = to;
    wna16_context_t *ctx = st_context_mutated(
        "specs/backends/flashinfer_trtllm.json", &from, &top, 1);
    if (!ctx)
        return;
    st_row_t r = {"placeholders", .fmt = "gptq", .bits = 8, .gs = -1,
                  .H = 512, .cc = 86, .act = "gelu"};
    wna16_select_result_t res;
    wna16_error_t err;
    TU_CHECK(select_row(ctx, &r, &res, &err) == WNA16_OK);
    TU_CHECK(res.n_passed_over == 1);
    TU_CHECK_MSG(strcmp(res.passed_over[0].reason, want) == 0, "got \"%s\"",
                 res.passed_over[0].reason);
    wna16_context_destroy(ctx);
}

/* A template expanding past WNA16_SELECT_REASON_MAX is truncated, both in
 * the result and in the explicit-refusal message. */
static void test_long_reason(void)
{
    char to[300] = "\"reason\": \"";
    for (int i = 0; i < 24; i++)
        strcat(to, "{device}");
    strcat(to, "\"");
    const char *from = "\"reason\": \"zero points and bias are not supported\"";
    const char *top = to;
    wna16_context_t *ctx = st_context_mutated(
        "specs/backends/flashinfer_trtllm.json", &from, &top, 1);
    if (!ctx)
        return;
    st_row_t r = {"long", .fmt = "gptq", .backend = "flashinfer_trtllm"};
    wna16_select_result_t res;
    wna16_error_t err;
    TU_CHECK(select_row(ctx, &r, &res, &err) == WNA16_EUNSUPPORTED);
    TU_CHECK(res.n_passed_over == 1);
    TU_CHECK(strlen(res.passed_over[0].reason) ==
             WNA16_SELECT_REASON_MAX - 1);
    TU_CHECK(strncmp(res.passed_over[0].reason,
                     "cuda with compute capability 9.0cuda", 36) == 0);
    TU_CHECK(strlen(err.message) < WNA16_ERROR_MESSAGE_MAX);
    wna16_context_destroy(ctx);
}

/* ---- spec errors --------------------------------------------------------------- */

static void test_eval_error(void)
{
    const char *from = "{ \"if\": \"WK_BITS != 4\"";
    const char *to = "{ \"if\": \"WK_BITS / (E - E) != 4\"";
    wna16_context_t *ctx = st_context_mutated("specs/backends/emulation.json",
                                              &from, &to, 1);
    if (!ctx)
        return;
    st_row_t r = {"div0", .fmt = "gptq", .backend = "emulation"};
    wna16_select_result_t res;
    wna16_error_t err;
    TU_CHECK(select_row(ctx, &r, &res, &err) == WNA16_ESPEC);
    TU_CHECK_MSG(strstr(err.message, "mutated:specs/backends/emulation.json")
                     && strstr(err.message, "$.selection.kernels[0]")
                     && strstr(err.message, ".if")
                     && strstr(err.message, "division by zero"),
                 "%s", err.message);
    TU_CHECK(res.backend == NULL);
    wna16_context_destroy(ctx);
}

static void test_missing_fallback(void)
{
    const char *from = "\"format\": \"moe_wna16\"";
    const char *to = "\"format\": \"no_such_format\"";
    wna16_context_t *ctx = st_context_mutated("specs/formats/gptq.json",
                                              &from, &to, 1);
    if (!ctx)
        return;
    st_row_t ok = {"no_fallback_needed", .fmt = "gptq", .want = "marlin"};
    st_run(ctx, &ok);
    st_row_t r = {"fallback_missing", .fmt = "gptq", .H = 192};
    wna16_select_result_t res;
    wna16_error_t err;
    TU_CHECK(select_row(ctx, &r, &res, &err) == WNA16_ESPEC);
    TU_CHECK_MSG(strstr(err.message, "mutated:specs/formats/gptq.json") &&
                     strstr(err.message, "$.selection.fallback.format") &&
                     strstr(err.message, "'no_such_format'"),
                 "%s", err.message);
    wna16_context_destroy(ctx);
}

/* ---- messages ---------------------------------------------------------------------- */

static void test_known_lists(void)
{
    wna16_context_t *ctx = tu_context();
    wna16_select_result_t res;
    wna16_error_t err;
    st_row_t f = {"unknown_format", .fmt = "exl2"};
    TU_CHECK(select_row(ctx, &f, &res, &err) == WNA16_EINVAL);
    const char *formats[] = {"awq", "compressed_tensors", "gptq", "moe_wna16"};
    for (size_t i = 0; i < 4; i++)
        TU_CHECK_MSG(strstr(err.message, formats[i]), "%s lacks %s",
                     err.message, formats[i]);
    st_row_t b = {"unknown_backend", .fmt = "gptq", .backend = "cutlass"};
    TU_CHECK(select_row(ctx, &b, &res, &err) == WNA16_EINVAL);
    TU_CHECK(res.n_passed_over == 0 && res.backend == NULL);
    TU_CHECK(strncmp(err.message, "moe_backend='cutlass' is not supported "
                     "for WNA16 MoE. Expected one of [", 63) == 0);
    const char *named[] = {"'triton'", "'marlin'", "'humming'",
                           "'flashinfer_trtllm'", "'emulation'"};
    for (size_t i = 0; i < 5; i++)
        TU_CHECK_MSG(strstr(err.message, named[i]), "%s lacks %s",
                     err.message, named[i]);
    const char *unnamed[] = {"'batched_marlin'", "'cpu'", "'xpu'"};
    for (size_t i = 0; i < 3; i++)
        TU_CHECK_MSG(!strstr(err.message, unnamed[i]), "%s has %s",
                     err.message, unnamed[i]);
    size_t n = strlen(err.message);
    TU_CHECK(n > 2 && strcmp(err.message + n - 2, "].") == 0);
    wna16_context_destroy(ctx);
}

/* ---- the default kernel mask ------------------------------------------------------ */

static void test_default_mask(void)
{
    uint32_t want = 0;
#ifdef WNA16_HAVE_LLVM
    want |= ST_BIT(CPU);
#endif
#ifdef WNA16_HAVE_CUDA
    want |= ST_BIT(CUDA);
#endif
#ifdef WNA16_HAVE_LEVEL_ZERO /* the xpu target (runtime/ze/) */
    want |= ST_BIT(XPU);
#endif
    uint32_t mask = wna16_build_kernel_platforms();
    TU_CHECK_MSG(mask == want, "mask 0x%x, want 0x%x", mask, want);
    TU_CHECK(!(mask & ST_BIT(ROCM)));
    /* kernel_platforms = 0 behaves as the build's own mask (or as "none"
     * when the build has no target at all). */
    wna16_context_t *ctx = tu_context();
    const st_row_t rows[] = {
        {"gptq_cuda", .fmt = "gptq"},
        {"gptq_cpu", .fmt = "gptq", .plat = WNA16_PLATFORM_CPU},
        {"ct_xpu", .fmt = "compressed_tensors", .plat = WNA16_PLATFORM_XPU},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        wna16_select_query_t q0, q1;
        wna16_select_result_t r0, r1;
        wna16_error_t e0, e1;
        st_query(&rows[i], &q0);
        q1 = q0;
        q0.kernel_platforms = 0;
        q1.kernel_platforms = mask ? mask : (1u << 31);
        wna16_status_t s0 = wna16_select(ctx, &q0, &r0, &e0);
        wna16_status_t s1 = wna16_select(ctx, &q1, &r1, &e1);
        TU_CHECK_MSG(s0 == s1 && r0.backend == r1.backend &&
                         r0.n_passed_over == r1.n_passed_over,
                     "[%s] default mask differs", rows[i].name);
        for (size_t k = 0; k < r0.n_passed_over && k < r1.n_passed_over; k++)
            TU_CHECK(strcmp(r0.passed_over[k].reason,
                            r1.passed_over[k].reason) == 0);
    }
    wna16_context_destroy(ctx);
}

/* ---- logging and arguments ------------------------------------------------------ */

typedef struct log_capture {
    char text[4096];
    size_t len;
} log_capture_t;

static void capture(void *user, wna16_log_level_t level, const char *msg)
{
    log_capture_t *c = user;
    int n = snprintf(c->text + c->len, sizeof c->text - c->len, "%d:%s\n",
                     (int)level, msg);
    if (n > 0 && c->len + (size_t)n < sizeof c->text)
        c->len += (size_t)n;
}

static void test_logging(void)
{
    log_capture_t cap = {{0}, 0};
    wna16_context_options_t o = {.log = capture, .log_user = &cap,
                                 .log_level = WNA16_LOG_DEBUG,
                                 .log_level_set = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    st_row_t r = {"log", .fmt = "gptq", .H = 192};
    wna16_select_result_t res;
    TU_CHECK(select_row(ctx, &r, &res, &err) == WNA16_OK);
    TU_CHECK_MSG(strstr(cap.text, "1:Using 'TRITON' WNA16 MoE backend.\n"),
                 "%s", cap.text);
    TU_CHECK_MSG(strstr(cap.text, "0:WNA16 MoE backend 'MARLIN' passed over: "
                                  "the MoeWNA16 checkpoint layout is not "
                                  "supported\n"),
                 "%s", cap.text);
    TU_CHECK_MSG(strstr(cap.text, "1:format 'gptq' falls back to "
                                  "'moe_wna16'"), "%s", cap.text);
    wna16_context_destroy(ctx);
}

static void test_null_args(void)
{
    wna16_context_t *ctx = tu_context();
    wna16_select_query_t q;
    wna16_select_result_t res;
    wna16_error_t err;
    st_row_t r = {"null", .fmt = "gptq"};
    st_query(&r, &q);
    TU_CHECK(wna16_select(ctx, &q, NULL, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_select(NULL, &q, &res, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_select(ctx, NULL, &res, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_select(ctx, &q, &res, NULL) == WNA16_OK);
    TU_CHECK(res.format == wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq"));
    wna16_context_destroy(ctx);
}

int main(void)
{
    test_rocm_triton_target();
    test_triton_layout_gates();
    test_triton_activation();
    test_priority_from_data();
    test_by_name_from_data();
    test_placeholders();
    test_long_reason();
    test_eval_error();
    test_missing_fallback();
    test_known_lists();
    test_default_mask();
    test_logging();
    test_null_args();
    return tu_finish("test_select_data");
}
