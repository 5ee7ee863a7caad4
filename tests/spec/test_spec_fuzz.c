/*
 * test_spec_fuzz.c - mutation fuzzing of the spec loader and the layout
 * check, built against the ASan+UBSan library. Every built-in spec file
 * (read from specs/ in the source tree) is mutated with a fixed seed: byte
 * flips, truncation, deleted and duplicated lines, numbers replaced by -1,
 * 0, huge, 1.5 or 1e309, expression strings replaced by token soup from the
 * expression grammar, deep nesting and long chains, and JSON-structure
 * mutations through cJSON (removed keys, swapped keys, values of another
 * type, unknown keys). Each text is loaded either with wna16_spec_load_text
 * on a fresh context without built-in specs, or with w16_spec_parse and the
 * full layout check. The test passes when nothing crashes and every
 * failure is WNA16_ESPEC (or EINVAL) with a non-empty message that starts
 * with the origin. Usage: test_spec_fuzz [iterations] [seed]; set
 * WNA16_FUZZ_NO_SKIP=1 to also run the texts that hit the known code_bits
 * crash (skipped by default, see code_bits_crash).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "spec/spec.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct text {
    char *s;
    size_t len;
} text_t;

typedef struct src {
    char name[64];
    text_t t;
} src_t;

static src_t srcs[32];
static int n_srcs;
static tu_rng_t rng;

static uint32_t below(uint32_t n) { return tu_rng_below(&rng, n); }

static text_t text_dup(const char *s, size_t len)
{
    text_t t = {malloc(len + 1), len};
    memcpy(t.s, s, len);
    t.s[len] = '\0';
    return t;
}

/* Replaces [a, b) of t by r. */
static void splice(text_t *t, size_t a, size_t b, const char *r, size_t rl)
{
    size_t n = t->len - (b - a) + rl;
    char *s = malloc(n + 1);
    memcpy(s, t->s, a);
    memcpy(s + a, r, rl);
    memcpy(s + a + rl, t->s + b, t->len - b);
    s[n] = '\0';
    free(t->s);
    t->s = s;
    t->len = n;
}

/* ---- token soup ------------------------------------------------------------ */

static const char *const soup_words[] = {
    /* identifiers: variables, tables of the built-in specs, lets, junk */
    "E", "H", "I", "IP", "BITS", "MASK", "GS", "K", "N", "G", "GSE", "PF",
    "ZP", "ACT_ORDER", "HAS_BIAS", "W13", "e", "n", "k", "g", "slot", "i0",
    "i1", "i2", "i3", "i4", "i5", "c", "PLATFORM", "CC", "CUDA", "ROCM",
    "TOPK", "BATCHED", "MAY_ZP", "WK_BITS", "NIB4", "BYTE8", "DK4", "DN4",
    "SPS", "ZP_ORDER", "ZP_SLOT", "AWQ_ORDER", "AWQ_SLOT", "r", "nt", "col",
    "th", "bk", "jj", "rem", "grouped", "foo", "x_1",
    /* functions */
    "min(", "max(", "cdiv(", "round_up(", "gcd(", "lcm(", "sqrt(",
    /* operators and punctuation */
    "+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "==", "!=", "<", "<=",
    ">", ">=", "&&", "||", "!", "~", "?", ":", ",", "(", ")", "[", "]", "(",
    ")", "=", "@", "\\\\", "\\\"",
    /* numbers */
    "0", "1", "2", "4", "8", "16", "32", "64", "128", "0x10", "0xff", "0x",
    "1.5", "007", "9223372036854775807", "99999999999999999999",
    "0x7fffffffffffffff",
};

static void soup(char *out, size_t cap)
{
    size_t used = 0;
    int n = 1 + (int)below(24);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *w = soup_words[below(sizeof soup_words /
                                         sizeof soup_words[0])];
        int m = snprintf(out + used, cap - used, "%s%s", below(3) ? " " : "",
                         w);
        if (m < 0 || (size_t)m >= cap - used)
            break;
        used += (size_t)m;
    }
}

/* Deep nesting and long chains, up to ~1100 characters (the loader refuses
 * expressions longer than 1000). */
static void nesting(char *out, size_t cap)
{
    static const int depths[] = {8, 20, 31, 32, 33, 40, 63, 64, 65, 100, 300,
                                 499};
    static const struct { const char *open, *mid, *close; } forms[] = {
        {"(", "k", ")"},       {"-", "1", ""},     {"min(1, ", "N", ")"},
        {"0 ? 1 : ", "E", ""}, {"1 + ", "1", ""},  {"K / 2 / ", "2", ""},
        {"!", "0", ""},        {"T[", "0", "]"},   {"~-", "H", ""},
    };
    int d = depths[below(sizeof depths / sizeof depths[0])];
    int f = (int)below(sizeof forms / sizeof forms[0]);
    size_t lo = strlen(forms[f].open), lm = strlen(forms[f].mid),
           lc = strlen(forms[f].close), used = 0;
    for (int i = 0; i < d && used + lo + 1 < cap; i++, used += lo)
        memcpy(out + used, forms[f].open, lo);
    if (used + lm + 1 < cap) {
        memcpy(out + used, forms[f].mid, lm);
        used += lm;
    }
    for (int i = 0; i < d && used + lc + 1 < cap; i++, used += lc)
        memcpy(out + used, forms[f].close, lc);
    out[used] = '\0';
}

/* A small well-formed expression over the usual names (scope errors and
 * wrong layouts are the point: they reach the sample check). */
static void valid_expr(char *out, size_t cap, int depth)
{
    static const char *const atoms[] = {
        "E", "H", "I", "IP", "K", "N", "G", "GS", "GSE", "PF", "BITS", "MASK",
        "ZP", "W13", "e", "n", "k", "g", "i0", "i1", "i2", "i3", "slot", "c",
        "0", "1", "2", "3", "4", "8", "16", "32", "64", "128"};
    static const char *const ops[] = {"+", "-", "*", "/", "%", "<<", ">>", "&",
                                      "|", "^", "==", "<", "&&", "||"};
    static const char *const fns[] = {"min", "max", "cdiv", "round_up", "gcd",
                                      "lcm"};
    char a[512], b[512];
    switch (depth <= 0 ? 0 : below(5)) {
    case 0:
        snprintf(out, cap, "%s", atoms[below(sizeof atoms / sizeof atoms[0])]);
        break;
    case 1:
        valid_expr(a, sizeof a, depth - 1);
        valid_expr(b, sizeof b, depth - 1);
        snprintf(out, cap, "%s(%s, %s)",
                 fns[below(sizeof fns / sizeof fns[0])], a, b);
        break;
    case 2:
        valid_expr(a, sizeof a, depth - 1);
        valid_expr(b, sizeof b, depth - 1);
        snprintf(out, cap, "(%s) ? %s : 0", a, b);
        break;
    default:
        valid_expr(a, sizeof a, depth - 1);
        valid_expr(b, sizeof b, depth - 1);
        snprintf(out, cap, "(%s %s %s)", a,
                 ops[below(sizeof ops / sizeof ops[0])], b);
        break;
    }
}

/* ---- text mutations --------------------------------------------------------- */

static void m_flip(text_t *t)
{
    if (!t->len)
        return;
    int n = 1 + (int)below(8);
    for (int i = 0; i < n; i++) {
        size_t at = below((uint32_t)t->len);
        t->s[at] ^= below(2) ? (char)(1u << below(8)) : (char)below(256);
    }
}

static void m_truncate(text_t *t)
{
    if (t->len)
        t->len = below((uint32_t)t->len);
    t->s[t->len] = '\0';
}

/* Start offsets of every line. */
static size_t lines_of(const text_t *t, size_t *starts, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < t->len && n < max; i++)
        if (i == 0 || t->s[i - 1] == '\n')
            starts[n++] = i;
    return n;
}

static void m_lines(text_t *t, bool dup)
{
    static size_t starts[8192];
    size_t n = lines_of(t, starts, 8192);
    if (!n)
        return;
    int times = 1 + (int)below(3);
    for (int k = 0; k < times; k++) {
        n = lines_of(t, starts, 8192);
        if (!n)
            return;
        size_t i = below((uint32_t)n);
        size_t a = starts[i], b = i + 1 < n ? starts[i + 1] : t->len;
        if (dup) {
            char *line = malloc(b - a + 1);
            memcpy(line, t->s + a, b - a);
            splice(t, a, a, line, b - a);
            free(line);
        } else {
            splice(t, a, b, "", 0);
        }
    }
}

static const char *const specials[] = {"-1", "0", "99999999999999999999",
                                       "1.5", "1e309", "-0", "2147483648",
                                       "4096", "-1e309", "1e-5", "65", "1",
                                       "2", "3", "7", "31", "33"};

static void m_number(text_t *t)
{
    /* digit runs (inside strings too: numbers in expressions) */
    size_t cnt = 0;
    for (size_t i = 0; i < t->len; i++)
        if ((t->s[i] >= '0' && t->s[i] <= '9') &&
            (i == 0 || !(t->s[i - 1] >= '0' && t->s[i - 1] <= '9')))
            cnt++;
    if (!cnt)
        return;
    size_t pick = below((uint32_t)cnt), seen = 0;
    for (size_t i = 0; i < t->len; i++) {
        if (!((t->s[i] >= '0' && t->s[i] <= '9') &&
              (i == 0 || !(t->s[i - 1] >= '0' && t->s[i - 1] <= '9'))))
            continue;
        if (seen++ != pick)
            continue;
        size_t j = i;
        while (j < t->len && t->s[j] >= '0' && t->s[j] <= '9')
            j++;
        const char *r = specials[below(sizeof specials / sizeof specials[0])];
        splice(t, i, j, r, strlen(r));
        return;
    }
}

/* Swaps one arithmetic operator or variable letter of the text for
 * another: expressions stay well formed but change meaning. */
static void m_operator(text_t *t)
{
    static const char swaps[] = "+-*/%&|^<>ekngEKNG";
    size_t cnt = 0;
    for (size_t i = 0; i < t->len; i++)
        cnt += strchr(swaps, t->s[i]) != NULL && t->s[i];
    if (!cnt)
        return;
    size_t pick = below((uint32_t)cnt);
    for (size_t i = 0; i < t->len; i++) {
        if (!t->s[i] || !strchr(swaps, t->s[i]) || pick--)
            continue;
        bool letter = (t->s[i] >= 'a' && t->s[i] <= 'z') ||
                      (t->s[i] >= 'A' && t->s[i] <= 'Z');
        t->s[i] = letter ? swaps[10 + below(8)] : swaps[below(10)];
        return;
    }
}

/* Replaces the contents of a random JSON string value (not a key). */
static void m_string(text_t *t, int how)
{
    size_t cnt = 0, pick = 0, a = 0, b = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t seen = 0;
        bool in = false;
        size_t start = 0;
        for (size_t i = 0; i < t->len; i++) {
            char ch = t->s[i];
            if (in) {
                if (ch == '\\') {
                    i++;
                    continue;
                }
                if (ch != '"')
                    continue;
                in = false;
                size_t j = i + 1;
                while (j < t->len && (t->s[j] == ' ' || t->s[j] == '\n'))
                    j++;
                if (j < t->len && t->s[j] == ':')
                    continue; /* a key */
                if (pass == 1 && seen == pick) {
                    a = start;
                    b = i;
                }
                seen++;
            } else if (ch == '"') {
                in = true;
                start = i + 1;
            }
        }
        if (pass == 0) {
            cnt = seen;
            if (!cnt)
                return;
            pick = below((uint32_t)cnt);
        }
    }
    char buf[2048];
    if (how == 1)
        nesting(buf, sizeof buf);
    else if (how == 2)
        valid_expr(buf, sizeof buf, 1 + (int)below(3));
    else
        soup(buf, sizeof buf);
    splice(t, a, b, buf, strlen(buf));
}

/* ---- JSON-structure mutations through cJSON -------------------------------- */

static cJSON *nodes[65536];
static int n_nodes;

static void collect(cJSON *j)
{
    for (cJSON *c = j->child; c; c = c->next) {
        if (n_nodes < (int)(sizeof nodes / sizeof nodes[0]))
            nodes[n_nodes++] = c;
        collect(c);
    }
}

static cJSON *parent_of(cJSON *root, cJSON *x)
{
    for (cJSON *c = root->child; c; c = c->next) {
        if (c == x)
            return root;
        cJSON *p = parent_of(c, x);
        if (p)
            return p;
    }
    return NULL;
}

static cJSON *random_value(void)
{
    char buf[256];
    switch (below(10)) {
    case 0: return cJSON_CreateNumber(-1);
    case 1: return cJSON_CreateNumber(0);
    case 2: return cJSON_CreateNumber(1.5);
    case 3: return cJSON_CreateNumber(1e300);
    case 4: return cJSON_CreateBool(below(2));
    case 5: return cJSON_CreateNull();
    case 6: return cJSON_CreateArray();
    case 7: return cJSON_CreateObject();
    case 8: soup(buf, sizeof buf); return cJSON_CreateString(buf);
    default: {
        cJSON *a = cJSON_CreateArray();
        cJSON_AddItemToArray(a, cJSON_CreateNumber(below(3) ? 4 : 8));
        return a;
    }
    }
}

static bool m_json(text_t *t)
{
    cJSON *root = cJSON_ParseWithLength(t->s, t->len);
    if (!root)
        return false;
    n_nodes = 0;
    collect(root);
    if (!n_nodes) {
        cJSON_Delete(root);
        return false;
    }
    cJSON *x = nodes[below((uint32_t)n_nodes)];
    cJSON *p = parent_of(root, x);
    switch (below(5)) {
    case 0: /* remove a key or an element */
        cJSON_Delete(cJSON_DetachItemViaPointer(p, x));
        break;
    case 1: /* a value of another type */
        cJSON_ReplaceItemViaPointer(p, x, random_value());
        break;
    case 2: { /* swap two keys of one object */
        if (!cJSON_IsObject(p) || !p->child || !p->child->next)
            break;
        int n = cJSON_GetArraySize(p);
        cJSON *a = cJSON_GetArrayItem(p, (int)below((uint32_t)n));
        cJSON *b = cJSON_GetArrayItem(p, (int)below((uint32_t)n));
        char *s = a->string;
        a->string = b->string;
        b->string = s;
        break;
    }
    case 3: /* an unknown or duplicated key */
        if (cJSON_IsObject(x))
            cJSON_AddItemToObject(x, below(2) ? "bogus" :
                                  (x->child && x->child->string
                                       ? x->child->string : "name"),
                                  random_value());
        else if (cJSON_IsArray(x))
            cJSON_AddItemToArray(x, random_value());
        else
            cJSON_ReplaceItemViaPointer(p, x, random_value());
        break;
    default: /* every number of the document to one special value */
        for (int i = 0; i < n_nodes; i++)
            if (cJSON_IsNumber(nodes[i]) && below(4) == 0)
                cJSON_SetNumberValue(nodes[i], below(2) ? -1.0 : 0.0);
        break;
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (!out)
        return false;
    free(t->s);
    *t = text_dup(out, strlen(out));
    cJSON_free(out);
    return true;
}

/* ---- known crashes of gen/ (see the report in tests/spec) ------------------ */

/* KNOWN BUG: gen/spec_check.c check_layout divides by the code width that
 * w16_layout_code_bits returns, which is 0 when a layout's "code_bits"
 * evaluates outside [1, 64] or fails: SIGFPE. Texts whose code_bits is not
 * a plain 1..64 literal are skipped until that is fixed. */
static bool code_bits_crash(const text_t *t)
{
    for (size_t i = 0; i + 9 <= t->len; i++) {
        if (memcmp(t->s + i, "code_bits", 9) != 0)
            continue;
        const char *q = t->s + i + 9;
        while (*q == '"' || *q == ' ' || *q == ':' || *q == '\n' ||
               *q == '\t' || *q == '\r')
            q++;
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > 64 || !(*end == '"' || *end == ',' ||
                                             *end == '\n' || *end == ' ' ||
                                             *end == '}'))
            return true;
    }
    return false;
}

/* ---- the run ---------------------------------------------------------------- */

static void read_sources(void)
{
    static const char *const dirs[] = {"formats", "backends"};
    for (int d = 0; d < 2; d++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/specs/%s", WNA16_SOURCE_DIR, dirs[d]);
        DIR *dh = opendir(dir);
        if (!dh)
            continue;
        struct dirent *de;
        while ((de = readdir(dh)) && n_srcs < 32) {
            size_t l = strlen(de->d_name);
            if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
                continue;
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            size_t n;
            char *s = tu_read_file(path, &n);
            if (!s)
                continue;
            snprintf(srcs[n_srcs].name, sizeof srcs[n_srcs].name, "%.*s",
                     (int)(l - 5), de->d_name);
            srcs[n_srcs].t = (text_t){s, n};
            n_srcs++;
        }
        closedir(dh);
    }
    /* readdir order is arbitrary: sort for a reproducible run */
    for (int i = 1; i < n_srcs; i++)
        for (int j = i; j > 0 && strcmp(srcs[j - 1].name, srcs[j].name) > 0;
             j--) {
            src_t tmp = srcs[j];
            srcs[j] = srcs[j - 1];
            srcs[j - 1] = tmp;
        }
}

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? strtol(argv[1], NULL, 10) : 1200;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x5eed5eedu;
    read_sources();
    if (n_srcs < 12) {
        fprintf(stderr, "only %d spec files under %s/specs\n", n_srcs,
                WNA16_SOURCE_DIR);
        return 1;
    }
    /* WNA16_FUZZ_NO_SKIP=1 runs the texts that hit known bugs too. */
    /* The code_bits crash is fixed; WNA16_FUZZ_SKIP_CODE_BITS=1 restores the
     * old filter for comparison. */
    bool skip_known = getenv("WNA16_FUZZ_SKIP_CODE_BITS") != NULL;
    tu_rng_seed(&rng, seed);
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .no_builtin_specs = true};
    wna16_context_t *shared = NULL;
    wna16_error_t err = {0};
    TU_OK(wna16_context_create(&o, &shared, &err), &err);
    if (!shared)
        return tu_finish("test_spec_fuzz");

    /* The unmutated files are accepted in both modes. */
    for (int i = 0; i < n_srcs; i++) {
        wna16_spec_t *s = NULL;
        TU_OK(w16_spec_parse(shared, srcs[i].name, srcs[i].t.s, srcs[i].t.len,
                             &s, &err), &err);
        if (s) {
            TU_OK(w16_spec_check_layouts(s, true, &err), &err);
            w16_spec_free(s);
        }
    }

    static const char *const mut_names[] = {
        "byte flips", "truncation", "line deleted", "line duplicated",
        "number", "token soup", "deep nesting", "random expression",
        "operator swap", "JSON structure"};
    enum { N_MUT = 10 };
    long applied[N_MUT] = {0};
    long accepted = 0, rejected = 0, skipped = 0, bad = 0;
    clock_t t0 = clock();
    for (long it = 0; it < iterations; it++) {
        const src_t *src = &srcs[below((uint32_t)n_srcs)];
        text_t t = text_dup(src->t.s, src->t.len);
        int n_mut = 1 + (int)below(3);
        for (int m = 0; m < n_mut; m++) {
            int kind = (int)below(N_MUT + 3); /* JSON mutations weigh more */
            if (kind >= N_MUT)
                kind = N_MUT - 1;
            switch (kind) {
            case 0: m_flip(&t); break;
            case 1: m_truncate(&t); break;
            case 2: m_lines(&t, false); break;
            case 3: m_lines(&t, true); break;
            case 4: m_number(&t); break;
            case 5: m_string(&t, 0); break;
            case 6: m_string(&t, 1); break;
            case 7: m_string(&t, 2); break;
            case 8: m_operator(&t); break;
            default: m_json(&t); break;
            }
            applied[kind]++;
        }
        if (skip_known && code_bits_crash(&t)) {
            skipped++;
            free(t.s);
            continue;
        }
        char origin[128];
        snprintf(origin, sizeof origin, "fuzz:%s#%ld", src->name, it);
        wna16_error_t e;
        memset(&e, 0, sizeof e);
        wna16_status_t st;
        if (it % 2 == 0) {
            wna16_context_t *ctx = NULL;
            TU_OK(wna16_context_create(&o, &ctx, &err), &err);
            const wna16_spec_t *spec = NULL;
            st = wna16_spec_load_text(ctx, origin, t.s, t.len, &spec, &e);
            if (st == WNA16_OK) { /* checked on its first sample */
                TU_CHECK(spec && wna16_spec_count(ctx) == 1);
            } else {
                TU_CHECK(wna16_spec_count(ctx) == 0);
            }
            wna16_context_destroy(ctx);
        } else {
            wna16_spec_t *s = NULL;
            st = w16_spec_parse(shared, origin, t.s, t.len, &s, &e);
            if (st == WNA16_OK) {
                st = w16_spec_check_layouts(s, true, &e);
                w16_spec_free(s);
            } else {
                TU_CHECK(s == NULL);
            }
        }
        if (st == WNA16_OK) {
            accepted++;
        } else {
            rejected++;
            size_t lo = strlen(origin);
            bool ok = (st == WNA16_ESPEC || st == WNA16_EINVAL) &&
                      e.message[0] && strncmp(e.message, origin, lo) == 0 &&
                      e.message[lo] == ':';
            TU_CHECK_MSG(ok, "%s: status %s, message \"%s\"", origin,
                         wna16_status_name(st), e.message);
            bad += !ok;
        }
        free(t.s);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("test_spec_fuzz: seed %" PRIu64 ", %ld mutated specs from %d files "
           "in %.1f s: %ld accepted, %ld rejected (%ld with a bad status or "
           "message), %ld skipped (known code_bits crash)\n", seed, iterations,
           n_srcs, secs, accepted, rejected, bad, skipped);
    printf("mutations applied:");
    for (int m = 0; m < N_MUT; m++)
        printf(" %s %ld%s", mut_names[m], applied[m], m + 1 < N_MUT ? "," : "\n");
    TU_CHECK(iterations < 1000 || rejected > 0);

    wna16_context_destroy(shared);
    for (int i = 0; i < n_srcs; i++)
        free(srcs[i].t.s);
    return tu_finish("test_spec_fuzz");
}
