/*
 * test_moe_act.c - the MoE activations against hand-computed values: a few
 * points of each function (values computed independently with Python's
 * math module and written here as literals), the swiglu clamp boundaries
 * (gate clamped from above only, up clamped on both sides, exactly at the
 * limit and past it), custom limit/alpha/beta, NaN propagation, and the
 * names (vLLM's spelling) both ways.
 */
#include "moe_util.h"

#include <math.h>
#include <string.h>

/* The reference computes in double and returns float32: allow a float ulp
 * or two of the exact value. */
static void check_act(const wna16_moe_params_t *p, float g, float u,
                      double want, int line)
{
    float got = wna16_ref_activation(p, g, u);
    double tol = 2.5 * fabs(want) * 0x1p-24 + 1e-30;
    TU_CHECK_MSG(fabs((double)got - want) <= tol,
                 "line %d: %s(%g, %g) = %.9g, want %.9g", line,
                 wna16_activation_name(p->activation), (double)g, (double)u,
                 (double)got, want);
}

#define ACT(p, g, u, want) check_act(p, g, u, want, __LINE__)

static wna16_moe_params_t params(wna16_activation_t a)
{
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.activation = a;
    return p;
}

static void test_silu_gelu(void)
{
    wna16_moe_params_t p = params(WNA16_ACT_SILU);
    ACT(&p, 1.0f, 1.0f, 0.7310585786300049);     /* 1 / (1 + e^-1) */
    ACT(&p, -2.0f, 1.0f, -0.2384058440442351);
    ACT(&p, 3.0f, -2.0f, -2.0 * 2.8577223804673); /* gated: times up */
    ACT(&p, 0.0f, 5.0f, 0.0);
    ACT(&p, -200.0f, 1.0f, -0.0); /* exp overflow: no NaN */
    p = params(WNA16_ACT_GELU);
    ACT(&p, 1.0f, 1.0f, 0.8413447460685429); /* 0.5 (1 + erf(1/sqrt 2)) */
    ACT(&p, -1.0f, 1.0f, -0.15865525393145707);
    ACT(&p, 2.5f, 0.5f, 0.5 * 2.4844758366855597);
    p = params(WNA16_ACT_GELU_TANH);
    ACT(&p, 1.0f, 1.0f, 0.8411919906082768);
    ACT(&p, -1.0f, 1.0f, -0.15880800939172324);
    ACT(&p, 2.5f, 2.0f, 2.0 * 2.484915733910001);
}

static void test_no_mul(void)
{
    wna16_moe_params_t p = params(WNA16_ACT_SILU_NO_MUL);
    ACT(&p, 1.0f, 99.0f, 0.7310585786300049); /* up ignored */
    p = params(WNA16_ACT_GELU_NO_MUL);
    ACT(&p, -1.0f, 99.0f, -0.15865525393145707);
    p = params(WNA16_ACT_RELU2_NO_MUL);
    ACT(&p, 3.0f, 99.0f, 9.0);
    ACT(&p, -3.0f, 99.0f, 0.0);
    ACT(&p, 0.5f, 0.0f, 0.25);
}

static void test_swigluoai(void)
{
    /* (clamp(u, -7, 7) + 1) * g' * sigmoid(alpha g'), g' = min(g, 7), with
     * alpha = 1.702f (the float parameter: 1.70200002193...) */
    wna16_moe_params_t p = params(WNA16_ACT_SWIGLUOAI);
    ACT(&p, 8.0f, -9.0f, -41.99971876986309); /* both clamped: g'=7, u'=-7 */
    ACT(&p, 7.0f, 7.0f, 55.99962502648411);   /* exactly at the limit */
    ACT(&p, 1000.0f, 7.5f, 55.99962502648411); /* past it: same value */
    ACT(&p, 1.0f, 2.0f, 2.537387306380908);   /* inside: no clamp */
    ACT(&p, -3.0f, 0.5f, -0.027106962788689914);
    /* The gate is clamped from above only: -20 stays -20. */
    ACT(&p, -20.0f, 1.0f, -6.586817593225877e-14);
    /* u at -limit - 1 behaves as -limit: (-7 + 1) * glu(1) */
    ACT(&p, 1.0f, -8.0f, -5.074774612761816);
    /* custom limit / alpha / beta: limit 1, alpha 2, beta 0.5 */
    p.swiglu_limit = 1.0f;
    p.swiglu_alpha = 2.0f;
    p.swiglu_beta = 0.5f;
    ACT(&p, 1.5f, 0.25f, 0.6605978084834118);
    /* no clamp */
    p = params(WNA16_ACT_SWIGLUOAI);
    p.swiglu_limit = INFINITY;
    ACT(&p, 10.0f, 20.0f, 209.99999147828316);
}

static void test_swiglustep(void)
{
    /* min(silu(g), 7) * clamp(u, -7, 7) */
    wna16_moe_params_t p = params(WNA16_ACT_SWIGLUSTEP);
    ACT(&p, 1.0f, 2.0f, 2.0 * 0.7310585786300049);
    ACT(&p, 20.0f, 1.0f, 7.0);   /* silu(20) ~ 20 clamped to 7 */
    ACT(&p, 1.0f, -10.0f, -7.0 * 0.7310585786300049);
    ACT(&p, -2.0f, 10.0f, 7.0 * -0.2384058440442351);
}

static void test_nan(void)
{
    wna16_moe_params_t p = params(WNA16_ACT_SWIGLUOAI);
    TU_CHECK(isnan(wna16_ref_activation(&p, NAN, 1.0f)));
    TU_CHECK(isnan(wna16_ref_activation(&p, 1.0f, NAN)));
    p = params(WNA16_ACT_RELU2_NO_MUL);
    TU_CHECK(isnan(wna16_ref_activation(&p, NAN, 0.0f)));
    p.activation = (wna16_activation_t)99;
    TU_CHECK(isnan(wna16_ref_activation(&p, 1.0f, 1.0f)));
    TU_CHECK(isnan(wna16_ref_activation(NULL, 1.0f, 1.0f)));
}

static void test_names(void)
{
    static const struct {
        const char *name;
        wna16_activation_t act;
        bool gated;
    } t[] = {
        {"silu", WNA16_ACT_SILU, true},
        {"gelu", WNA16_ACT_GELU, true},
        {"gelu_tanh", WNA16_ACT_GELU_TANH, true},
        {"swigluoai", WNA16_ACT_SWIGLUOAI, true},
        {"swiglustep", WNA16_ACT_SWIGLUSTEP, true},
        {"silu_no_mul", WNA16_ACT_SILU_NO_MUL, false},
        {"gelu_no_mul", WNA16_ACT_GELU_NO_MUL, false},
        {"relu2_no_mul", WNA16_ACT_RELU2_NO_MUL, false},
    };
    TU_CHECK(sizeof t / sizeof t[0] == WNA16_ACT_COUNT_);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        TU_CHECK(wna16_activation_from_name(t[i].name) == t[i].act);
        TU_CHECK(strcmp(wna16_activation_name(t[i].act), t[i].name) == 0);
        TU_CHECK(wna16_activation_is_gated(t[i].act) == t[i].gated);
    }
    TU_CHECK(wna16_activation_from_name("SILU") == WNA16_ACT_INVALID);
    TU_CHECK(wna16_activation_from_name("") == WNA16_ACT_INVALID);
    TU_CHECK(wna16_activation_from_name(NULL) == WNA16_ACT_INVALID);
    TU_CHECK(wna16_activation_name(WNA16_ACT_INVALID) == NULL);
    TU_CHECK(wna16_activation_name(WNA16_ACT_COUNT_) == NULL);
    TU_CHECK(!wna16_activation_is_gated(WNA16_ACT_INVALID));
    /* The default is vLLM's: silu, gpt-oss swiglu constants. */
    wna16_moe_params_t p;
    memset(&p, 0xab, sizeof p);
    wna16_moe_params_init(&p);
    TU_CHECK(p.activation == WNA16_ACT_SILU);
    TU_CHECK(p.swiglu_limit == 7.0f && p.swiglu_alpha == 1.702f &&
             p.swiglu_beta == 1.0f);
    TU_CHECK(!p.apply_router_weight_on_input && !p.expert_map &&
             p.global_num_experts == 0 && !p.round_gemm_outputs);
    TU_CHECK(p.act_dtype == WNA16_DTYPE_BF16);
}

int main(void)
{
    test_silu_gelu();
    test_no_mul();
    test_swigluoai();
    test_swiglustep();
    test_nan();
    test_names();
    return tu_finish("test_moe_act");
}
