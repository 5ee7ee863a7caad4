/*
 * spec_load.c - loads a spec (JSON) into the frozen structs of spec.h:
 * parsing, validation and the spec's content hash, nothing kept after.
 *
 * The loader walks the document with a JSON path for every message
 * ("$.layouts.qweight.index[1]"), rejects unknown keys, wrong types and
 * out-of-range numbers, parses every expression against the variables that
 * are legal in its place, and finally checks the layouts on a sample problem
 * (spec_check.c). It is the only file that sees cJSON for a spec, except
 * spec_tiling.c for the "tiling" section. It runs past the 1,200-line
 * guide because it is one walk of one document: every section shares the
 * loader state and the typed getters that name the JSON path, which a
 * split by section would have to export to a second file that sees cJSON.
 */
#include "spec/spec_load.h"
#include "base/hash.h"
#include "base/json_text.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* ---- loader state -------------------------------------------------------- */

enum { PATH_MAX_LEN = 256 };

typedef struct loader {
    wna16_spec_t *spec;
    wna16_error_t *err;
    const char *origin;
    wna16_status_t status;
} loader_t;

static bool lfail(loader_t *L, const char *path, const char *fmt, ...)
    W16_PRINTF(3, 4);

static bool lfail(loader_t *L, const char *path, const char *fmt, ...)
{
    if (L->status != WNA16_OK)
        return false;
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    L->status = w16_err(L->err, WNA16_ESPEC, "%s: %s: %s", L->origin, path,
                        what);
    return false;
}

static void path_key(char *out, const char *base, const char *key)
{
    snprintf(out, PATH_MAX_LEN, "%s.%s", base, key);
}

static void path_index(char *out, const char *base, int i)
{
    snprintf(out, PATH_MAX_LEN, "%s[%d]", base, i);
}

static const char *type_name(const cJSON *j)
{
    if (!j) return "nothing";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an unknown value";
}

/* Rejects keys not in `allowed` (NULL-terminated) and duplicates. */
static bool check_keys(loader_t *L, const cJSON *obj, const char *path,
                       const char *const *allowed)
{
    if (!cJSON_IsObject(obj))
        return lfail(L, path, "expected an object, found %s", type_name(obj));
    for (const cJSON *c = obj->child; c; c = c->next) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, c->string) == 0)
                ok = true;
        char p[PATH_MAX_LEN];
        path_key(p, path, c->string);
        if (!ok) {
            char list[512] = "";
            for (const char *const *a = allowed; *a; a++) {
                strncat(list, *a, sizeof list - strlen(list) - 1);
                if (a[1])
                    strncat(list, ", ", sizeof list - strlen(list) - 1);
            }
            return lfail(L, p, "unknown key (expected one of: %s)", list);
        }
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (strcmp(d->string, c->string) == 0)
                return lfail(L, p, "duplicate key");
    }
    return true;
}

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static const char *dup_string(loader_t *L, const cJSON *j, const char *path,
                              size_t max_len)
{
    if (!cJSON_IsString(j))
        return lfail(L, path, "expected a string, found %s", type_name(j)),
               NULL;
    if (strlen(j->valuestring) > max_len)
        return lfail(L, path, "string longer than %zu characters", max_len),
               NULL;
    char *s = w16_arena_strdup(&L->spec->arena, j->valuestring);
    if (!s)
        lfail(L, path, "out of memory");
    return s;
}

static bool is_identifier(const char *s, bool lower_only)
{
    if (!*s || isdigit((unsigned char)*s))
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (!(isalnum(ch) || ch == '_'))
            return false;
        if (lower_only && isupper(ch))
            return false;
    }
    return true;
}

/* A name that becomes part of tensor names or kernel identifiers. */
static const char *get_name(loader_t *L, const cJSON *j, const char *path)
{
    const char *s = dup_string(L, j, path, 63);
    if (s && !is_identifier(s, true))
        return lfail(L, path, "\"%s\" is not a name: use lowercase letters, "
                     "digits and '_', not starting with a digit", s),
               NULL;
    return s;
}

static bool get_int(loader_t *L, const cJSON *j, const char *path, int64_t lo,
                    int64_t hi, int64_t *out)
{
    *out = 0; /* defined on failure too (optimizing compilers ask) */
    if (!cJSON_IsNumber(j))
        return lfail(L, path, "expected an integer, found %s", type_name(j));
    double d = j->valuedouble;
    /* Range first: casting an out-of-range double to int64 is undefined. */
    if (!(d >= (double)lo && d <= (double)hi))
        return lfail(L, path, "%g is out of range [%lld, %lld]", d,
                     (long long)lo, (long long)hi);
    if (d != (double)(int64_t)d)
        return lfail(L, path, "expected an integer, found %g", d);
    *out = (int64_t)d;
    return true;
}

static bool get_bool(loader_t *L, const cJSON *j, const char *path, bool *out)
{
    if (!cJSON_IsBool(j))
        return lfail(L, path, "expected true or false, found %s",
                     type_name(j));
    *out = cJSON_IsTrue(j);
    return true;
}

/* Array of strings (each a name if `names`). */
static bool get_string_list(loader_t *L, const cJSON *j, const char *path,
                            bool names, const char ***out, int *n_out)
{
    if (!cJSON_IsArray(j))
        return lfail(L, path, "expected an array of strings, found %s",
                     type_name(j));
    int n = cJSON_GetArraySize(j);
    if (n > 64)
        return lfail(L, path, "at most 64 entries");
    const char **v = w16_arena_alloc(&L->spec->arena,
                                     sizeof(char *) * (size_t)(n ? n : 1));
    if (!v)
        return lfail(L, path, "out of memory");
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char p[PATH_MAX_LEN];
        path_index(p, path, i);
        v[i] = names ? get_name(L, c, p) : dup_string(L, c, p, 255);
        if (!v[i])
            return false;
        for (int k = 0; k < i; k++)
            if (strcmp(v[k], v[i]) == 0)
                return lfail(L, p, "\"%s\" is listed twice", v[i]);
    }
    *out = v;
    *n_out = n;
    return true;
}

static const w16_expr_t *get_expr(loader_t *L, const cJSON *j,
                                  const char *path, const w16_scope_t *scope)
{
    if (cJSON_IsNumber(j)) { /* allow plain integers where an expression goes */
        int64_t v;
        if (!get_int(L, j, path, INT32_MIN, INT32_MAX, &v))
            return NULL;
        w16_expr_t *x = w16_arena_alloc(&L->spec->arena, sizeof *x);
        if (!x)
            return lfail(L, path, "out of memory"), NULL;
        x->op = W16_OP_CONST;
        x->value = v;
        return x;
    }
    if (!cJSON_IsString(j))
        return lfail(L, path, "expected an expression (a string), found %s",
                     type_name(j)),
               NULL;
    if (strlen(j->valuestring) > 1000)
        return lfail(L, path, "expression longer than 1000 characters"), NULL;
    char msg[512];
    const w16_expr_t *x = w16_expr_parse(&L->spec->arena, j->valuestring,
                                         scope, msg, sizeof msg);
    if (!x)
        lfail(L, path, "%s", msg);
    return x;
}

static w16_scope_t spec_scope(const wna16_spec_t *s, unsigned where)
{
    return (w16_scope_t){.where = where, .tables = s->tables,
                         .n_tables = s->n_tables};
}

/* ---- tables -------------------------------------------------------------- */

static bool load_tables(loader_t *L, const cJSON *j, const char *path)
{
    if (!cJSON_IsObject(j))
        return lfail(L, path, "expected an object of integer arrays");
    wna16_spec_t *s = L->spec;
    int n = cJSON_GetArraySize(j);
    if (n > 32)
        return lfail(L, path, "at most 32 tables");
    s->tables = w16_arena_alloc(&s->arena, sizeof(w16_table_t) * (size_t)(n ? n : 1));
    if (!s->tables)
        return lfail(L, path, "out of memory");
    for (const cJSON *t = j->child; t; t = t->next) {
        char p[PATH_MAX_LEN];
        path_key(p, path, t->string);
        if (!is_identifier(t->string, false) || strlen(t->string) > 63)
            return lfail(L, p, "table names are identifiers");
        for (int v = 0; v < W16_VAR_COUNT; v++)
            if (strcmp(w16_var_name((w16_var_t)v), t->string) == 0)
                return lfail(L, p, "table name clashes with the variable %s",
                             t->string);
        for (int k = 0; k < s->n_tables; k++)
            if (strcmp(s->tables[k].name, t->string) == 0)
                return lfail(L, p, "duplicate table");
        if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) == 0 ||
            cJSON_GetArraySize(t) > 4096)
            return lfail(L, p, "expected a non-empty array of at most 4096 "
                         "integers");
        w16_table_t *tab = &s->tables[s->n_tables];
        tab->name = w16_arena_strdup(&s->arena, t->string);
        tab->len = cJSON_GetArraySize(t);
        tab->values = w16_arena_alloc(&s->arena, sizeof(int64_t) * (size_t)tab->len);
        if (!tab->name || !tab->values)
            return lfail(L, p, "out of memory");
        int i = 0;
        for (const cJSON *v = t->child; v; v = v->next, i++) {
            char pi[PATH_MAX_LEN];
            path_index(pi, p, i);
            if (!get_int(L, v, pi, INT32_MIN, INT32_MAX, &tab->values[i]))
                return false;
        }
        s->n_tables++;
    }
    return true;
}

/* ---- rules --------------------------------------------------------------- */

static bool load_rule(loader_t *L, const cJSON *j, const char *path,
                      unsigned where, w16_rule_t *r)
{
    static const char *const keys[] = {"if", "reason", "format", "actorder",
                                       "activation_not_in", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    char p[PATH_MAX_LEN];
    path_key(p, path, "reason");
    if (!get(j, "reason"))
        return lfail(L, path, "a rule needs a \"reason\"");
    if (!(r->reason = dup_string(L, get(j, "reason"), p, 200)))
        return false;
    r->json_path = w16_arena_strdup(&L->spec->arena, path);
    if (where == W16_VW_DIM && !get(j, "if"))
        return lfail(L, path, "a layout rule needs an \"if\"");
    if (get(j, "if")) {
        path_key(p, path, "if");
        w16_scope_t sc = spec_scope(L->spec, where);
        if (!(r->cond = get_expr(L, get(j, "if"), p, &sc)))
            return false;
    }
    struct { const char *key; const char ***v; int *n; } lists[] = {
        {"format", &r->formats, &r->n_formats},
        {"actorder", &r->actorders, &r->n_actorders},
        {"activation_not_in", &r->act_not_in, &r->n_act_not_in},
    };
    for (size_t i = 0; i < W16_ARRAY_LEN(lists); i++) {
        const cJSON *v = get(j, lists[i].key);
        if (!v)
            continue;
        if (where != W16_VW_SELECT)
            return lfail(L, path, "\"%s\" applies only to selection rules",
                         lists[i].key);
        path_key(p, path, lists[i].key);
        if (!get_string_list(L, v, p, true, lists[i].v, lists[i].n))
            return false;
    }
    return true;
}

static bool load_rules(loader_t *L, const cJSON *j, const char *path,
                       unsigned where, w16_rule_t **out, int *n_out)
{
    if (!cJSON_IsArray(j))
        return lfail(L, path, "expected an array of rules, found %s",
                     type_name(j));
    int n = cJSON_GetArraySize(j);
    if (n > 64)
        return lfail(L, path, "at most 64 rules");
    *out = w16_arena_alloc(&L->spec->arena, sizeof(w16_rule_t) * (size_t)(n ? n : 1));
    if (!*out)
        return lfail(L, path, "out of memory");
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char p[PATH_MAX_LEN];
        path_index(p, path, i);
        if (!load_rule(L, c, p, where, &(*out)[i]))
            return false;
    }
    *n_out = n;
    return true;
}

/* ---- capabilities -------------------------------------------------------- */



static bool load_int_list(loader_t *L, const cJSON *j, const char *path,
                          int *out, int max, int *n_out, int64_t lo, int64_t hi)
{
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) == 0 ||
        cJSON_GetArraySize(j) > max)
        return lfail(L, path, "expected an array of 1 to %d integers", max);
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char p[PATH_MAX_LEN];
        int64_t v;
        path_index(p, path, i);
        if (!get_int(L, c, p, lo, hi, &v))
            return false;
        out[i] = (int)v;
    }
    *n_out = i;
    return true;
}

static bool load_caps(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {
        "bits", "group_sizes", "zero_points", "bias", "act_order",
        "activation_formats", "activations", "platforms", "min_cc",
        "input_dtypes", "numerics", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    w16_capabilities_t *c = &L->spec->caps;
    char p[PATH_MAX_LEN];
    path_key(p, path, "bits");
    if (!get(j, "bits"))
        return lfail(L, path, "\"bits\" is required");
    if (!load_int_list(L, get(j, "bits"), p, c->bits, 4, &c->n_bits, 1, 8))
        return false;
    for (int i = 0; i < c->n_bits; i++)
        if (c->bits[i] != 4 && c->bits[i] != 8)
            return lfail(L, p, "wna16 handles 4- and 8-bit weights, not %d",
                         c->bits[i]);
    const cJSON *gs = get(j, "group_sizes");
    path_key(p, path, "group_sizes");
    if (!gs)
        return lfail(L, path, "\"group_sizes\" is required (\"any\" or a list)");
    if (cJSON_IsString(gs)) {
        if (strcmp(gs->valuestring, "any") != 0)
            return lfail(L, p, "expected \"any\" or an array of group sizes");
    } else {
        if (!load_int_list(L, gs, p, c->group_sizes, 8, &c->n_group_sizes, -1,
                           1 << 20))
            return false;
        for (int i = 0; i < c->n_group_sizes; i++) {
            int g = c->group_sizes[i];
            if (g == 0 || (g > 0 && (g & (g - 1))))
                return lfail(L, p, "group size %d: expected -1 or a power of "
                             "two", g);
        }
    }
    struct { const char *key; bool *v; } flags[] = {
        {"zero_points", &c->zero_points}, {"bias", &c->bias},
        {"act_order", &c->act_order}};
    for (size_t i = 0; i < W16_ARRAY_LEN(flags); i++) {
        path_key(p, path, flags[i].key);
        if (!get(j, flags[i].key))
            return lfail(L, path, "\"%s\" is required", flags[i].key);
        if (!get_bool(L, get(j, flags[i].key), p, flags[i].v))
            return false;
    }
    c->numerics[0] = WNA16_NUMERICS_F32;
    c->n_numerics = 1;
    if (get(j, "numerics")) {
        const char **v;
        int n;
        path_key(p, path, "numerics");
        if (!get_string_list(L, get(j, "numerics"), p, false, &v, &n))
            return false;
        if (n > WNA16_NUMERICS_COUNT_)
            return lfail(L, p, "at most %d numeric contracts",
                         WNA16_NUMERICS_COUNT_);
        for (int i = 0; i < n; i++) {
            c->numerics[i] = wna16_numerics_from_name(v[i]);
            if (c->numerics[i] == WNA16_NUMERICS_INVALID)
                return lfail(L, p, "unknown numeric contract \"%s\" (f32, "
                             "int8-dynamic, bf16-exact)", v[i]);
            for (int k = 0; k < i; k++)
                if (c->numerics[k] == c->numerics[i])
                    return lfail(L, p, "\"%s\" listed twice", v[i]);
        }
        c->n_numerics = n;
    }
    c->standard_format = true;
    if (get(j, "activation_formats")) {
        const char **v;
        int n;
        path_key(p, path, "activation_formats");
        if (!get_string_list(L, get(j, "activation_formats"), p, true, &v, &n))
            return false;
        c->standard_format = false;
        for (int i = 0; i < n; i++) {
            if (strcmp(v[i], "standard") == 0)
                c->standard_format = true;
            else if (strcmp(v[i], "batched") == 0)
                c->batched_format = true;
            else
                return lfail(L, p, "unknown activation format \"%s\" "
                             "(standard, batched)", v[i]);
        }
    }
    if (get(j, "activations")) {
        path_key(p, path, "activations");
        if (!get_string_list(L, get(j, "activations"), p, true,
                             &c->activations, &c->n_activations))
            return false;
        for (int i = 0; i < c->n_activations; i++)
            if (!w16_activation_known(c->activations[i]))
                return lfail(L, p, "unknown activation \"%s\"",
                             c->activations[i]);
    }
    if (get(j, "platforms")) {
        path_key(p, path, "platforms");
        if (!get_string_list(L, get(j, "platforms"), p, true, &c->platforms,
                             &c->n_platforms))
            return false;
        for (int i = 0; i < c->n_platforms; i++)
            if (w16_platform_from_name(c->platforms[i]) < 0)
                return lfail(L, p, "unknown platform \"%s\" (cuda, rocm, cpu, "
                             "xpu)", c->platforms[i]);
    }
    if (get(j, "min_cc")) {
        int64_t v;
        path_key(p, path, "min_cc");
        if (!get_int(L, get(j, "min_cc"), p, 0, 200, &v))
            return false;
        c->min_cc = (int)v;
    }
    c->input_dtypes[WNA16_INPUT_16BIT] = true;
    if (get(j, "input_dtypes")) {
        const char **v;
        int n;
        path_key(p, path, "input_dtypes");
        if (!get_string_list(L, get(j, "input_dtypes"), p, true, &v, &n))
            return false;
        for (int i = 0; i < n; i++) {
            wna16_input_dtype_t d = wna16_input_dtype_from_name(v[i]);
            if (d != WNA16_INPUT_INT8 && d != WNA16_INPUT_FP8)
                return lfail(L, p, "unknown 8-bit input dtype \"%s\" (int8, "
                             "fp8)", v[i]);
            c->input_dtypes[d] = true;
        }
    }
    return true;
}

/* ---- layouts ------------------------------------------------------------- */

/* The storage dtypes a role may declare, as a list for the messages: the
 * reference reads codes and indices as integers of any width and values
 * as F16/BF16/F32; safetensors' other dtypes (BOOL, F64, C64, the F8, F6
 * and F4 formats) hold nothing a layout can mean. */
static const char *role_dtypes(w16_role_t r)
{
    switch (r) {
    case W16_ROLE_SCALES: case W16_ROLE_BIAS: case W16_ROLE_WEIGHT:
        return "F16 BF16 F32";
    case W16_ROLE_G_IDX: case W16_ROLE_SORT_IDX:
        return "I32 I64";
    case W16_ROLE_GSCALE:
        return "F32";
    default:
        return "U8 I8 U16 I16 U32 I32 U64 I64";
    }
}

static bool dtype_fits_role(w16_role_t r, wna16_dtype_t d)
{
    const char *list = role_dtypes(r), *name = wna16_dtype_name(d);
    if (!name)
        return false;
    size_t n = strlen(name);
    for (const char *q = list; (q = strstr(q, name)) != NULL; q += n)
        if ((q == list || q[-1] == ' ') && (q[n] == ' ' || q[n] == '\0'))
            return true;
    return false;
}

static bool load_dtypes(loader_t *L, const cJSON *j, const char *path,
                        w16_layout_t *l)
{
    const cJSON *one = j;
    int n = 1;
    if (cJSON_IsArray(j)) {
        n = cJSON_GetArraySize(j);
        if (n < 1 || n > 4)
            return lfail(L, path, "expected 1 to 4 dtypes");
        one = j->child;
    }
    for (int i = 0; i < n; i++, one = one->next) {
        char p[PATH_MAX_LEN];
        if (cJSON_IsArray(j))
            path_index(p, path, i);
        else
            snprintf(p, sizeof p, "%s", path);
        if (!cJSON_IsString(one))
            return lfail(L, p, "expected a dtype name, found %s",
                         type_name(one));
        wna16_dtype_t d = wna16_dtype_from_name(one->valuestring,
                                                strlen(one->valuestring));
        if (d == WNA16_DTYPE_INVALID)
            return lfail(L, p, "unknown dtype \"%s\" (%s takes %s)",
                         one->valuestring, w16_role_doc(l->role),
                         role_dtypes(l->role));
        if (!dtype_fits_role(l->role, d))
            return lfail(L, p, "dtype %s cannot hold %s (it takes %s)",
                         one->valuestring, w16_role_doc(l->role),
                         role_dtypes(l->role));
        l->dtypes[l->n_dtypes++] = d;
    }
    return true;
}

static bool load_expr_array(loader_t *L, const cJSON *j, const char *path,
                            const w16_scope_t *sc, int min,
                            const w16_expr_t **out, int *n_out)
{
    if (!cJSON_IsArray(j))
        return lfail(L, path, "expected an array of expressions, found %s",
                     type_name(j));
    int n = cJSON_GetArraySize(j);
    if (n < min || n > W16_MAX_STORE_DIMS)
        return lfail(L, path, "expected %d to %d dimensions, found %d", min,
                     W16_MAX_STORE_DIMS, n);
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char p[PATH_MAX_LEN];
        path_index(p, path, i);
        if (!(out[i] = get_expr(L, c, p, sc)))
            return false;
    }
    *n_out = n;
    return true;
}

/* Parses j (an object of name: expression, or NULL) into sc's lets; each
 * let may use the ones before it. sc->let_names/let_exprs have room for
 * `max`. */
static bool load_lets(loader_t *L, const cJSON *j, const char *path,
                      const char *key, w16_scope_t *sc, int max)
{
    sc->n_lets = 0;
    if (!j)
        return true;
    char p[PATH_MAX_LEN];
    path_key(p, path, key);
    if (!cJSON_IsObject(j))
        return lfail(L, p, "expected an object of name: expression");
    const char **names = (const char **)sc->let_names;
    const w16_expr_t **exprs = (const w16_expr_t **)sc->let_exprs;
    for (const cJSON *c = j->child; c; c = c->next) {
        char pl[PATH_MAX_LEN];
        path_key(pl, p, c->string);
        if (sc->n_lets == max)
            return lfail(L, pl, "at most %d lets", max);
        if (!is_identifier(c->string, true) || strlen(c->string) > 31)
            return lfail(L, pl, "let names are lowercase identifiers");
        for (int v = 0; v < W16_VAR_COUNT; v++)
            if (strcmp(w16_var_name((w16_var_t)v), c->string) == 0)
                return lfail(L, pl, "'%s' is a variable", c->string);
        for (int k = 0; k < sc->n_lets; k++)
            if (strcmp(names[k], c->string) == 0)
                return lfail(L, pl, "duplicate let");
        for (int t = 0; t < sc->n_tables; t++)
            if (strcmp(sc->tables[t].name, c->string) == 0)
                return lfail(L, pl, "'%s' is a table", c->string);
        const w16_expr_t *x = get_expr(L, c, pl, sc);
        if (!x)
            return false;
        exprs[sc->n_lets] = x;
        names[sc->n_lets++] = c->string;
    }
    return true;
}

static bool load_layout(loader_t *L, const cJSON *j, const char *path,
                        w16_role_t role)
{
    static const char *const keys[] = {"name", "when", "dtype", "shape", "let",
                                       "index", "bit", "coord_let", "coord",
                                       "encode", "decode", "code_bits", "sums",
                                       "dequant_scale_dtype", "multiply",
                                       "int16_codes", "model_dtype", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    wna16_spec_t *s = L->spec;
    w16_layout_t *l = w16_arena_alloc(&s->arena, sizeof *l);
    if (!l)
        return lfail(L, path, "out of memory");
    l->role = role;
    l->json_path = w16_arena_strdup(&s->arena, path);
    char p[PATH_MAX_LEN];

    path_key(p, path, "name");
    l->name = get(j, "name") ? get_name(L, get(j, "name"), p)
                             : w16_role_name(role);
    if (!l->name)
        return false;

    path_key(p, path, "dtype");
    if (!get(j, "dtype"))
        return lfail(L, path, "\"dtype\" is required");
    if (!load_dtypes(L, get(j, "dtype"), p, l))
        return false;

    /* Lets: named sub-expressions, for the forward map ("let") and for the
     * inverse map ("coord_let"). */
    enum { MAX_LETS = 32 };
    const char *let_names[MAX_LETS], *clet_names[MAX_LETS];
    const w16_expr_t *let_exprs[MAX_LETS], *clet_exprs[MAX_LETS];
    w16_scope_t dims = spec_scope(s, W16_VW_DIM);
    w16_scope_t fwd = spec_scope(s, W16_VW_DIM | W16_VW_COORD);
    w16_scope_t inv = spec_scope(s, W16_VW_DIM | W16_VW_STORE);
    w16_scope_t val = spec_scope(s, W16_VW_DIM | W16_VW_VALUE);
    fwd.let_names = let_names;
    fwd.let_exprs = let_exprs;
    inv.let_names = clet_names;
    inv.let_exprs = clet_exprs;
    if (!load_lets(L, get(j, "let"), path, "let", &fwd, MAX_LETS) ||
        !load_lets(L, get(j, "coord_let"), path, "coord_let", &inv, MAX_LETS))
        return false;

    if (get(j, "when")) {
        path_key(p, path, "when");
        if (!(l->when = get_expr(L, get(j, "when"), p, &dims)))
            return false;
    }
    int n_shape = 0, n_index = 0;
    path_key(p, path, "shape");
    if (!get(j, "shape"))
        return lfail(L, path, "\"shape\" is required");
    /* A role without coordinates holds one value: a 0-dimensional tensor
     * (as vLLM's scalar parameters are) or one of any shape. */
    int min_dims = w16_role_coords(role, (w16_var_t[W16_MAX_COORDS]){0}) ? 1 : 0;
    if (!load_expr_array(L, get(j, "shape"), p, &dims, min_dims, l->shape,
                         &n_shape))
        return false;
    path_key(p, path, "index");
    if (!get(j, "index"))
        return lfail(L, path, "\"index\" (the forward map) is required");
    if (!load_expr_array(L, get(j, "index"), p, &fwd, min_dims, l->index,
                         &n_index))
        return false;
    if (n_index != n_shape)
        return lfail(L, p, "%d index expressions for a %d-dimensional shape",
                     n_index, n_shape);
    l->ndim = n_shape;
    if (get(j, "bit")) {
        path_key(p, path, "bit");
        if (!(l->bit = get_expr(L, get(j, "bit"), p, &fwd)))
            return false;
        if (role != W16_ROLE_QWEIGHT && role != W16_ROLE_QZEROS)
            return lfail(L, p, "only packed codes (qweight, qzeros) have a "
                         "bit offset");
    }

    /* Inverse map: exactly the role's coordinates (no e when per expert). */
    const cJSON *coord = get(j, "coord");
    path_key(p, path, "coord");
    if (!coord)
        return lfail(L, path, "\"coord\" (the inverse map) is required");
    if (!cJSON_IsObject(coord))
        return lfail(L, p, "expected an object of coordinate: expression");
    w16_var_t want[W16_MAX_COORDS];
    int n_want = w16_role_coords(role, want);
    const char *allowed[W16_MAX_COORDS + 1] = {0};
    int n_allowed = 0;
    for (int i = 0; i < n_want; i++)
        if (want[i] != W16_VAR_e || s->stacked)
            allowed[n_allowed++] = w16_var_name(want[i]);
    if (!check_keys(L, coord, p, allowed))
        return false;
    for (int i = 0; i < n_want; i++) {
        if (want[i] == W16_VAR_e && !s->stacked)
            continue;
        const char *cn = w16_var_name(want[i]);
        char pc[PATH_MAX_LEN];
        path_key(pc, p, cn);
        if (!get(coord, cn))
            return lfail(L, p, "missing coordinate \"%s\"", cn);
        if (!(l->coord[i] = get_expr(L, get(coord, cn), pc, &inv)))
            return false;
        for (int d = l->ndim; d < W16_MAX_STORE_DIMS; d++)
            if (w16_expr_uses(l->coord[i], (w16_var_t)(W16_VAR_i0 + d)))
                return lfail(L, pc, "uses i%d but the shape has %d "
                             "dimensions", d, l->ndim);
    }
    l->n_coords = n_want;

    bool packed = role == W16_ROLE_QWEIGHT || role == W16_ROLE_QZEROS;
    struct { const char *key; const w16_expr_t **v; } vt[] = {
        {"encode", &l->encode}, {"decode", &l->decode}};
    for (size_t i = 0; i < W16_ARRAY_LEN(vt); i++) {
        if (!get(j, vt[i].key))
            continue;
        path_key(p, path, vt[i].key);
        if (!packed)
            return lfail(L, p, "value transforms apply to codes only");
        if (!(*vt[i].v = get_expr(L, get(j, vt[i].key), p, &val)))
            return false;
        if (role != W16_ROLE_QWEIGHT && w16_expr_uses(*vt[i].v, W16_VAR_z))
            return lfail(L, p, "z (the zero point of a code's group) exists "
                         "for qweight codes only");
    }
    if (!l->encode != !l->decode)
        return lfail(L, path, "\"encode\" and \"decode\" come together");
    if (get(j, "code_bits")) {
        path_key(p, path, "code_bits");
        if (!packed)
            return lfail(L, p, "only codes (qweight, qzeros) have code_bits");
        if (!(l->code_bits = get_expr(L, get(j, "code_bits"), p, &dims)))
            return false;
    }
    const cJSON *sums = get(j, "sums");
    if (sums) {
        path_key(p, path, "sums");
        if (role != W16_ROLE_QWEIGHT)
            return lfail(L, p, "only qweight carries block sums");
        if (!check_keys(L, sums, p,
                        (const char *const[]){"block_k", "index", "coord",
                                               NULL}))
            return false;
        char ps[PATH_MAX_LEN];
        path_key(ps, p, "block_k");
        if (!get(sums, "block_k") || !get(sums, "index"))
            return lfail(L, p, "\"block_k\" and \"index\" are required");
        if (!(l->sums_block_k = get_expr(L, get(sums, "block_k"), ps, &dims)))
            return false;
        int n_ix = 0;
        path_key(ps, p, "index");
        w16_scope_t sc = spec_scope(s, W16_VW_DIM | W16_VW_COORD);
        if (!load_expr_array(L, get(sums, "index"), ps, &sc, 1, l->sums_index,
                             &n_ix))
            return false;
        if (n_ix != l->ndim)
            return lfail(L, ps, "%d index expressions for a %d-dimensional "
                         "shape", n_ix, l->ndim);
        const cJSON *sc_coord = get(sums, "coord");
        if (sc_coord) {
            static const char *const names[] = {"e", "n", "g", NULL};
            path_key(ps, p, "coord");
            if (!cJSON_IsObject(sc_coord))
                return lfail(L, ps, "expected an object of coordinate: "
                             "expression");
            if (!check_keys(L, sc_coord, ps, names))
                return false;
            for (int i = 0; i < 3; i++) {
                char pc[PATH_MAX_LEN];
                path_key(pc, ps, names[i]);
                if (!get(sc_coord, names[i]))
                    return lfail(L, ps, "missing coordinate \"%s\"", names[i]);
                if (!(l->sums_coord[i] = get_expr(L, get(sc_coord, names[i]),
                                                  pc, &inv)))
                    return false;
                for (int d = l->ndim; d < W16_MAX_STORE_DIMS; d++)
                    if (w16_expr_uses(l->sums_coord[i],
                                      (w16_var_t)(W16_VAR_i0 + d)))
                        return lfail(L, pc, "uses i%d but the shape has %d "
                                     "dimensions", d, l->ndim);
            }
        }
        if (l->n_dtypes != 1 || wna16_dtype_size(l->dtypes[0]) != 1)
            return lfail(L, p, "block sums are written into a byte tensor "
                         "(U8 or I8)");
    }

    if (get(j, "dequant_scale_dtype")) {
        path_key(p, path, "dequant_scale_dtype");
        if (role != W16_ROLE_WEIGHT)
            return lfail(L, p, "only the dequantized weight role has it");
        const cJSON *d = get(j, "dequant_scale_dtype");
        if (!cJSON_IsString(d))
            return lfail(L, p, "expected a dtype name");
        l->dequant_scale_dtype =
            wna16_dtype_from_name(d->valuestring, strlen(d->valuestring));
        if (!dtype_fits_role(W16_ROLE_SCALES, l->dequant_scale_dtype))
            return lfail(L, p, "expected F16, BF16 or F32");
    }
    if (get(j, "model_dtype")) {
        path_key(p, path, "model_dtype");
        if (!get_bool(L, get(j, "model_dtype"), p, &l->model_dtype))
            return false;
        if (role != W16_ROLE_SCALES && role != W16_ROLE_BIAS)
            return lfail(L, p, "only scales and bias follow the model's "
                         "dtype");
        bool f16 = false, bf16 = false;
        for (int i = 0; i < l->n_dtypes; i++) {
            f16 = f16 || l->dtypes[i] == WNA16_DTYPE_F16;
            bf16 = bf16 || l->dtypes[i] == WNA16_DTYPE_BF16;
        }
        if (l->model_dtype && !(f16 && bf16))
            return lfail(L, p, "a tensor in the model's dtype must list F16 "
                         "and BF16 in \"dtype\"");
    }
    struct { const char *key; const w16_expr_t **v; } sx[] = {
        {"multiply", &l->scale_multiply}, {"int16_codes", &l->scale_int16}};
    for (size_t i = 0; i < W16_ARRAY_LEN(sx); i++) {
        if (!get(j, sx[i].key))
            continue;
        path_key(p, path, sx[i].key);
        if (role != W16_ROLE_SCALES)
            return lfail(L, p, "only scales have scale transforms");
        if (!(*sx[i].v = get_expr(L, get(j, sx[i].key), p, &dims)))
            return false;
    }
    s->layouts[role] = l;
    return true;
}

static bool load_layouts(loader_t *L, const cJSON *j, const char *path)
{
    const char *allowed[W16_ROLE_COUNT + 1] = {0};
    for (int r = 0; r < W16_ROLE_COUNT; r++)
        allowed[r] = w16_role_key((w16_role_t)r);
    if (!check_keys(L, j, path, allowed))
        return false;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const cJSON *l = get(j, w16_role_key((w16_role_t)r));
        if (!l)
            continue;
        char p[PATH_MAX_LEN];
        path_key(p, path, w16_role_key((w16_role_t)r));
        if (!load_layout(L, l, p, (w16_role_t)r))
            return false;
    }
    const w16_layout_t *const *ls = L->spec->layouts;
    if (!ls[W16_ROLE_QWEIGHT] && !ls[W16_ROLE_WEIGHT])
        return lfail(L, path, "a spec needs a \"qweight\" or \"weight\" layout");
    if (ls[W16_ROLE_QWEIGHT] && !ls[W16_ROLE_SCALES])
        return lfail(L, path, "quantized weights need a \"scales\" layout");
    if (ls[W16_ROLE_SORT_IDX] && !ls[W16_ROLE_G_IDX])
        return lfail(L, path, "\"g_idx_sort_indices\" comes with a \"g_idx\" "
                     "layout");
    if (ls[W16_ROLE_GSCALE] &&
        (!ls[W16_ROLE_SCALES] || !ls[W16_ROLE_SCALES]->scale_int16))
        return lfail(L, path, "\"input_global_scale\" is the unit of int16 "
                     "scale codes: it comes with a \"scales\" layout that has "
                     "\"int16_codes\"");
    /* Two layouts may not write one tensor. */
    for (int a = 0; a < W16_ROLE_COUNT; a++)
        for (int b = a + 1; b < W16_ROLE_COUNT; b++)
            if (ls[a] && ls[b] && strcmp(ls[a]->name, ls[b]->name) == 0)
                return lfail(L, ls[b]->json_path, "tensor name \"%s\" is "
                             "already used by %s", ls[b]->name,
                             w16_role_key((w16_role_t)a));
    return true;
}

/* ---- projections, config, padding ---------------------------------------- */

static bool load_projections(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {"gate", "up", "down", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    w16_spec_proj_t *dst[] = {&L->spec->proj_gate, &L->spec->proj_up,
                              &L->spec->proj_down};
    for (int i = 0; i < 3; i++) {
        char p[PATH_MAX_LEN];
        path_key(p, path, keys[i]);
        if (!get(j, keys[i]))
            return lfail(L, path, "\"%s\" is required", keys[i]);
        const char **v;
        int n;
        if (!get_string_list(L, get(j, keys[i]), p, true, &v, &n))
            return false;
        if (n < 1 || n > 4)
            return lfail(L, p, "expected 1 to 4 names");
        for (int k = 0; k < n; k++)
            dst[i]->names[k] = v[k];
        dst[i]->n_names = n;
    }
    return true;
}

static bool load_pad(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {"intermediate", "act_order", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    char p[PATH_MAX_LEN];
    w16_scope_t sc = spec_scope(L->spec, W16_VW_DIM);
    if (get(j, "intermediate")) {
        path_key(p, path, "intermediate");
        if (!(L->spec->pad_intermediate = get_expr(L, get(j, "intermediate"),
                                                   p, &sc)))
            return false;
        static const w16_var_t later[] = {W16_VAR_IP, W16_VAR_K, W16_VAR_N,
                                          W16_VAR_G, W16_VAR_GSE, W16_VAR_W13};
        for (size_t i = 0; i < W16_ARRAY_LEN(later); i++)
            if (w16_expr_uses(L->spec->pad_intermediate, later[i]))
                return lfail(L, p, "padding is computed before %s is known; "
                             "use E, H, I, BITS, GS, MASK, PF, ZP, ACT_ORDER, "
                             "HAS_BIAS", w16_var_name(later[i]));
    }
    if (get(j, "act_order")) {
        path_key(p, path, "act_order");
        if (!(L->spec->pad_forbidden_with_act_order =
                  dup_string(L, get(j, "act_order"), p, 200)))
            return false;
    }
    return true;
}

/* ---- selection ----------------------------------------------------------- */

static bool load_format_select(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {"integration", "errors", "may_have_zp",
                                       "may_have_bias", "allow_tile_padding",
                                       "weight_key", "fallback", NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    w16_format_select_t *f = &L->spec->fsel;
    w16_scope_t sc = spec_scope(L->spec, W16_VW_SELECT);
    char p[PATH_MAX_LEN];
    path_key(p, path, "integration");
    if (!get(j, "integration"))
        return lfail(L, path, "\"integration\" is required");
    if (!(f->integration = dup_string(L, get(j, "integration"), p, 63)))
        return false;
    if (get(j, "errors")) {
        path_key(p, path, "errors");
        if (!load_rules(L, get(j, "errors"), p, W16_VW_SELECT, &f->errors,
                        &f->n_errors))
            return false;
    }
    struct { const char *key; const w16_expr_t **v; } ex[] = {
        {"may_have_zp", &f->may_have_zp}, {"may_have_bias", &f->may_have_bias},
        {"allow_tile_padding", &f->allow_tile_padding}};
    for (size_t i = 0; i < W16_ARRAY_LEN(ex); i++) {
        path_key(p, path, ex[i].key);
        if (!get(j, ex[i].key))
            return lfail(L, path, "\"%s\" is required", ex[i].key);
        if (!(*ex[i].v = get_expr(L, get(j, ex[i].key), p, &sc)))
            return false;
    }
    const cJSON *wk = get(j, "weight_key");
    path_key(p, path, "weight_key");
    static const char *const wk_keys[] = {"bits", "group32", "asym", NULL};
    if (!wk)
        return lfail(L, path, "\"weight_key\" is required");
    if (!check_keys(L, wk, p, wk_keys))
        return false;
    const w16_expr_t **wkv[] = {&f->wk_bits, &f->wk_group32, &f->wk_asym};
    for (int i = 0; i < 3; i++) {
        char pk[PATH_MAX_LEN];
        path_key(pk, p, wk_keys[i]);
        if (!get(wk, wk_keys[i]))
            return lfail(L, p, "\"%s\" is required", wk_keys[i]);
        if (!(*wkv[i] = get_expr(L, get(wk, wk_keys[i]), pk, &sc)))
            return false;
    }
    const cJSON *fb = get(j, "fallback");
    if (fb) {
        static const char *const fb_keys[] = {"format", "if", "reason", NULL};
        path_key(p, path, "fallback");
        if (!check_keys(L, fb, p, fb_keys))
            return false;
        char pk[PATH_MAX_LEN];
        for (int i = 0; i < 3; i++)
            if (!get(fb, fb_keys[i]))
                return lfail(L, p, "\"%s\" is required", fb_keys[i]);
        path_key(pk, p, "format");
        if (!(f->fallback_format = get_name(L, get(fb, "format"), pk)))
            return false;
        path_key(pk, p, "if");
        if (!(f->fallback_if = get_expr(L, get(fb, "if"), pk, &sc)))
            return false;
        path_key(pk, p, "reason");
        if (!(f->fallback_reason = dup_string(L, get(fb, "reason"), pk, 200)))
            return false;
    }
    return true;
}

static bool load_backend_select(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {"vllm_name", "by_name", "priority",
                                       "gate", "kernels", "kernel_platforms",
                                       NULL};
    if (!check_keys(L, j, path, keys))
        return false;
    w16_backend_select_t *b = &L->spec->bsel;
    char p[PATH_MAX_LEN];
    path_key(p, path, "vllm_name");
    if (!get(j, "vllm_name"))
        return lfail(L, path, "\"vllm_name\" is required");
    if (!(b->vllm_name = dup_string(L, get(j, "vllm_name"), p, 63)))
        return false;
    const cJSON *bn = get(j, "by_name");
    path_key(p, path, "by_name");
    if (bn && !cJSON_IsNull(bn) && !(b->by_name = get_name(L, bn, p)))
        return false;
    const cJSON *pr = get(j, "priority");
    if (pr) {
        path_key(p, path, "priority");
        if (!check_keys(L, pr, p, (const char *const[]){"cuda", "rocm", "cpu",
                                                         "xpu", NULL}))
            return false;
        for (const cJSON *c = pr->child; c; c = c->next) {
            char pk[PATH_MAX_LEN];
            int64_t v;
            path_key(pk, p, c->string);
            if (!get_int(L, c, pk, 1, 100, &v))
                return false;
            b->priority[w16_platform_from_name(c->string)] = (int)v;
        }
    }
    if (get(j, "gate")) {
        path_key(p, path, "gate");
        if (!load_rules(L, get(j, "gate"), p, W16_VW_SELECT, &b->gate,
                        &b->n_gate))
            return false;
    }
    const cJSON *ks = get(j, "kernels");
    path_key(p, path, "kernels");
    if (!ks)
        return lfail(L, path, "\"kernels\" (vLLM's experts classes) is "
                     "required");
    if (!cJSON_IsArray(ks) || cJSON_GetArraySize(ks) < 1 ||
        cJSON_GetArraySize(ks) > 8)
        return lfail(L, p, "expected an array of 1 to 8 kernel classes");
    b->n_classes = cJSON_GetArraySize(ks);
    b->classes = w16_arena_alloc(&L->spec->arena,
                                 sizeof(w16_kernel_class_t) * (size_t)b->n_classes);
    if (!b->classes)
        return lfail(L, p, "out of memory");
    int i = 0;
    for (const cJSON *c = ks->child; c; c = c->next, i++) {
        char pc[PATH_MAX_LEN], pk[PATH_MAX_LEN];
        path_index(pc, p, i);
        if (!check_keys(L, c, pc, (const char *const[]){"name", "rules", NULL}))
            return false;
        path_key(pk, pc, "name");
        if (!get(c, "name"))
            return lfail(L, pc, "\"name\" is required");
        if (!(b->classes[i].name = dup_string(L, get(c, "name"), pk, 63)))
            return false;
        if (get(c, "rules")) {
            path_key(pk, pc, "rules");
            if (!load_rules(L, get(c, "rules"), pk, W16_VW_SELECT,
                            &b->classes[i].rules, &b->classes[i].n_rules))
                return false;
        }
    }
    const cJSON *kp = get(j, "kernel_platforms");
    path_key(p, path, "kernel_platforms");
    if (!kp)
        return lfail(L, path, "\"kernel_platforms\" (where wna16's kernels for "
                     "this backend run) is required");
    const char **v;
    int n;
    if (!get_string_list(L, kp, p, true, &v, &n))
        return false;
    for (int k = 0; k < n; k++) {
        int pl = w16_platform_from_name(v[k]);
        if (pl < 0)
            return lfail(L, p, "unknown platform \"%s\"", v[k]);
        b->kernel_platforms[pl] = true;
    }
    return true;
}

/* ---- samples ------------------------------------------------------------- */

static bool load_samples(loader_t *L, const cJSON *j, const char *path)
{
    static const char *const keys[] = {"E", "H", "I", "BITS", "GS", "ZP",
                                       "ACT_ORDER", "HAS_BIAS", "ZEROS_STORED",
                                       "G_IDX_STORED", "A8", NULL};
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) < 1 ||
        cJSON_GetArraySize(j) > 16)
        return lfail(L, path, "expected an array of 1 to 16 sample problems");
    wna16_spec_t *s = L->spec;
    s->n_samples = cJSON_GetArraySize(j);
    s->samples = w16_arena_alloc(&s->arena, sizeof *s->samples * (size_t)s->n_samples);
    if (!s->samples)
        return lfail(L, path, "out of memory");
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char p[PATH_MAX_LEN];
        path_index(p, path, i);
        if (!check_keys(L, c, p, keys))
            return false;
        int64_t *dst[] = {&s->samples[i].E, &s->samples[i].H, &s->samples[i].I,
                          &s->samples[i].BITS, &s->samples[i].GS,
                          &s->samples[i].ZP, &s->samples[i].ACT_ORDER,
                          &s->samples[i].HAS_BIAS, &s->samples[i].ZEROS_STORED,
                          &s->samples[i].G_IDX_STORED, &s->samples[i].A8};
        static const int64_t lo[] = {1, 1, 1, 4, -1, 0, 0, 0, 0, 0, 0};
        static const int64_t hi[] = {16, 4096, 4096, 8, 4096, 1, 1, 1, 1, 1, 2};
        for (int k = 0; k < 11; k++) {
            char pk[PATH_MAX_LEN];
            path_key(pk, p, keys[k]);
            const cJSON *v = get(c, keys[k]);
            if (!v) {
                if (k < 5)
                    return lfail(L, p, "\"%s\" is required", keys[k]);
                *dst[k] = 0;
                continue;
            }
            if (!get_int(L, v, pk, lo[k], hi[k], dst[k]))
                return false;
        }
    }
    return true;
}

/* ---- the document -------------------------------------------------------- */

static bool load_doc(loader_t *L, const cJSON *root)
{
    static const char *const keys[] = {
        "wna16_spec", "kind", "name", "title", "description", "config",
        "projections", "stacked", "tables", "capabilities", "zero_point",
        "pad", "act_order_sort", "g_idx_parameters", "layouts", "rules",
        "selection", "samples", "tiling", NULL};
    if (!check_keys(L, root, "$", keys))
        return false;
    wna16_spec_t *s = L->spec;
    int64_t version;
    if (!get(root, "wna16_spec"))
        return lfail(L, "$", "\"wna16_spec\" (the language version, 1) is "
                     "required");
    if (!get_int(L, get(root, "wna16_spec"), "$.wna16_spec", 1, 1, &version))
        return false;
    s->version = (int)version;
    const cJSON *kind = get(root, "kind");
    if (!cJSON_IsString(kind) || (strcmp(kind->valuestring, "format") != 0 &&
                                  strcmp(kind->valuestring, "backend") != 0))
        return lfail(L, "$.kind", "expected \"format\" or \"backend\"");
    s->kind = strcmp(kind->valuestring, "format") == 0 ? WNA16_SPEC_FORMAT
                                                       : WNA16_SPEC_BACKEND;
    bool is_format = s->kind == WNA16_SPEC_FORMAT;
    if (!get(root, "name"))
        return lfail(L, "$", "\"name\" is required");
    if (!(s->name = get_name(L, get(root, "name"), "$.name")))
        return false;
    s->title = get(root, "title") ? dup_string(L, get(root, "title"),
                                               "$.title", 200)
                                  : s->name;
    s->description = get(root, "description")
                         ? dup_string(L, get(root, "description"),
                                      "$.description", 4000)
                         : "";
    if (!s->title || !s->description)
        return false;
    s->stacked = !is_format;
    if (get(root, "stacked") &&
        !get_bool(L, get(root, "stacked"), "$.stacked", &s->stacked))
        return false;
    if (!is_format && !s->stacked)
        return lfail(L, "$.stacked", "backend layouts are stacked per layer");

    /* Keys that belong to one kind only. */
    static const char *const format_only[] = {"config", "projections",
                                              "g_idx_parameters", NULL};
    static const char *const backend_only[] = {"pad", "tiling", NULL};
    for (const char *const *k = is_format ? backend_only : format_only; *k; k++)
        if (get(root, *k)) {
            char p[PATH_MAX_LEN];
            path_key(p, "$", *k);
            return lfail(L, p, "not allowed in a %s spec",
                         is_format ? "format" : "backend");
        }

    if (get(root, "tables") && !load_tables(L, get(root, "tables"), "$.tables"))
        return false;
    if (!get(root, "capabilities"))
        return lfail(L, "$", "\"capabilities\" is required");
    if (!load_caps(L, get(root, "capabilities"), "$.capabilities"))
        return false;
    if (get(root, "zero_point") &&
        !(s->zero_convention = dup_string(L, get(root, "zero_point"),
                                          "$.zero_point", 500)))
        return false;
    if (is_format && !get(root, "config"))
        return lfail(L, "$", "a format needs \"config\"");
    if (get(root, "config")) {
        const cJSON *c = get(root, "config");
        if (!check_keys(L, c, "$.config",
                        (const char *const[]){"quant_method", NULL}))
            return false;
        if (!get(c, "quant_method"))
            return lfail(L, "$.config", "\"quant_method\" is required");
        if (!get_string_list(L, get(c, "quant_method"), "$.config.quant_method",
                             false, &s->config.quant_methods,
                             &s->config.n_quant_methods))
            return false;
    }
    if (s->stacked && get(root, "projections"))
        return lfail(L, "$.projections", "a stacked spec names w13/w2 tensors, "
                     "not projections");
    if (is_format && !s->stacked) {
        if (!get(root, "projections"))
            return lfail(L, "$", "a per-expert format needs \"projections\"");
        if (!load_projections(L, get(root, "projections"), "$.projections"))
            return false;
    }
    if (get(root, "pad") && !load_pad(L, get(root, "pad"), "$.pad"))
        return false;
    if (get(root, "g_idx_parameters") &&
        !get_bool(L, get(root, "g_idx_parameters"), "$.g_idx_parameters",
                  &s->g_idx_params))
        return false;
    if (get(root, "act_order_sort") &&
        !get_bool(L, get(root, "act_order_sort"), "$.act_order_sort",
                  &s->act_order_sort))
        return false;
    if (!get(root, "layouts"))
        return lfail(L, "$", "\"layouts\" is required");
    if (!load_layouts(L, get(root, "layouts"), "$.layouts"))
        return false;
    if (get(root, "rules") &&
        !load_rules(L, get(root, "rules"), "$.rules", W16_VW_DIM,
                    &s->caps.shape_rules, &s->caps.n_shape_rules))
        return false;
    if (get(root, "tiling") &&
        (L->status = w16_spec_load_tiling(s, get(root, "tiling"), L->origin,
                                          L->err)) != WNA16_OK)
        return false;
    const cJSON *sel = get(root, "selection");
    if (!sel)
        return lfail(L, "$", "\"selection\" is required");
    if (is_format ? !load_format_select(L, sel, "$.selection")
                  : !load_backend_select(L, sel, "$.selection"))
        return false;
    if (!get(root, "samples"))
        return lfail(L, "$", "\"samples\" (problems the layouts are checked "
                     "on) is required");
    return load_samples(L, get(root, "samples"), "$.samples");
}

void w16_spec_free(wna16_spec_t *spec)
{
    if (!spec)
        return;
    wna16_context_t *ctx = spec->ctx;
    w16_spec_memo_free(spec);
    w16_arena_t arena = spec->arena;
    w16_arena_free(&arena);
    w16_free(ctx, spec, sizeof *spec);
}

static wna16_status_t parse_spec(wna16_context_t *ctx, const char *origin,
                                 const char *text, size_t len, bool check,
                                 wna16_spec_t **out, wna16_error_t *err);

wna16_status_t w16_spec_parse(wna16_context_t *ctx, const char *origin,
                              const char *text, size_t len,
                              wna16_spec_t **out, wna16_error_t *err)
{
    return parse_spec(ctx, origin, text, len, true, out, err);
}

wna16_status_t w16_spec_parse_builtin(wna16_context_t *ctx,
                                      const char *origin, const char *text,
                                      size_t len, wna16_spec_t **out,
                                      wna16_error_t *err)
{
    return parse_spec(ctx, origin, text, len, false, out, err);
}

static wna16_status_t parse_spec(wna16_context_t *ctx, const char *origin,
                                 const char *text, size_t len, bool check,
                                 wna16_spec_t **out, wna16_error_t *err)
{
    *out = NULL;
    if (len > (16u << 20))
        return w16_err(err, WNA16_ESPEC, "%s: larger than 16 MiB", origin);
    size_t at = 0;
    w16_json_fault_t fault = w16_json_text_check(text, len, &at);
    if (fault != W16_JSON_OK) {
        char why[96];
        int line = 1;
        for (size_t i = 0; i < at; i++)
            line += text[i] == '\n';
        return w16_err(err, WNA16_ESPEC, "%s: line %d: not valid JSON: %s",
                       origin, line,
                       w16_json_fault_str(fault, text, at, why, sizeof why));
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        int line = 1;
        for (size_t i = 0; i < off && i < len; i++)
            line += text[i] == '\n';
        return w16_err(err, WNA16_ESPEC, "%s: line %d: not valid JSON", origin,
                       line);
    }
    for (const char *p = end; p && p < text + len; p++)
        if (!isspace((unsigned char)*p) && *p) {
            int line = 1;
            for (const char *q = text; q < p; q++)
                line += *q == '\n';
            cJSON_Delete(root);
            return w16_err(err, WNA16_ESPEC, "%s: line %d: text after the JSON "
                           "document", origin, line);
        }
    wna16_spec_t *s = w16_calloc(ctx, 1, sizeof *s);
    if (!s) {
        cJSON_Delete(root);
        return w16_err_nomem(err, "loading a spec");
    }
    s->ctx = ctx;
    w16_arena_init(&s->arena, ctx);
    s->origin = w16_arena_strdup(&s->arena, origin);
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_bytes(&kr, text, len);
    w16_key_t ck = w16_keyer_done(&kr);
    s->content_hash[0] = ck.lo;
    s->content_hash[1] = ck.hi;
    loader_t L = {.spec = s, .err = err, .origin = origin, .status = WNA16_OK};
    if (!s->origin)
        lfail(&L, "$", "out of memory");
    else if ((L.status = w16_spec_memo_new(s, err)) == WNA16_OK)
        load_doc(&L, root);
    cJSON_Delete(root);
    if (L.status == WNA16_OK && check)
        L.status = w16_spec_check_layouts(s, false, err);
    if (L.status != WNA16_OK) {
        w16_spec_free(s);
        return L.status;
    }
    *out = s;
    return WNA16_OK;
}
