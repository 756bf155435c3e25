/* test_lora.c: adapters as data (vks_lora.h): target lists, layout, PEFT
 * initialisation, identities. No device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "vkswarm/vks_lora.h"

static vks_model *tiny_model(void) {
    vks_model_config c;
    vks_model_tiny_config(&c);
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, 7, &m), VKS_OK);
    return m;
}

static void test_parse_targets(void **state) {
    (void)state;
    uint32_t t = 0;
    assert_int_equal(vks_lora_parse_targets("all", &t, "x"), VKS_OK);
    assert_int_equal(t, VKS_LORA_ALL_TARGETS);
    assert_int_equal(vks_lora_parse_targets("q,v_proj,down", &t, "x"), VKS_OK);
    assert_int_equal(t, (1u << VKS_LORA_Q) | (1u << VKS_LORA_V) | (1u << VKS_LORA_DOWN));
    assert_int_equal(vks_lora_parse_targets("q,lm_head", &t, "--lora-targets"), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "unknown LoRA target 'lm_head'"));
    assert_int_equal(vks_lora_parse_targets("", &t, "x"), VKS_ERR_ARG);
    assert_int_equal(vks_lora_parse_targets("q,,k", &t, "x"), VKS_ERR_ARG);
}

static void test_adapter_layout(void **state) {
    (void)state;
    vks_model *m = tiny_model();
    const vks_model_config *c = &m->cfg;
    vks_lora_config lc = {4, 8.0, (1u << VKS_LORA_Q) | (1u << VKS_LORA_DOWN)};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(c, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_n_layers(a), c->n_layers);
    assert_null(vks_lora_adapter_A(a, 0, VKS_LORA_K));
    assert_null(vks_lora_adapter_A(a, c->n_layers, VKS_LORA_Q));
    /* matrices are disjoint and in order: B of (l, q) ends where A of (l, down) starts */
    int64_t out, in, dout, din;
    vks_lora_target_shape(c, VKS_LORA_Q, &out, &in);
    vks_lora_target_shape(c, VKS_LORA_DOWN, &dout, &din);
    for (int l = 0; l < c->n_layers; l++) {
        assert_ptr_equal(vks_lora_adapter_B(a, l, VKS_LORA_Q), vks_lora_adapter_A(a, l, VKS_LORA_Q) + 4 * in);
        assert_ptr_equal(vks_lora_adapter_A(a, l, VKS_LORA_DOWN), vks_lora_adapter_B(a, l, VKS_LORA_Q) + 4 * out);
    }
    assert_int_equal(vks_lora_adapter_init(a, 99), VKS_OK);
    /* the same draw as vks_lora_init of that matrix alone */
    float A[4 * 2048], B[4 * 2048];
    assert_true(4 * din <= 4 * 2048 && 4 * dout <= 4 * 2048);
    assert_int_equal(vks_lora_init(A, B, 4, din, dout, 99, vks_lora_stream(2, VKS_LORA_DOWN)), VKS_OK);
    assert_memory_equal(A, vks_lora_adapter_A(a, 2, VKS_LORA_DOWN), (size_t)(4 * din) * sizeof(float));
    assert_memory_equal(B, vks_lora_adapter_B(a, 2, VKS_LORA_DOWN), (size_t)(4 * dout) * sizeof(float));
    vks_lora_adapter_free(a);

    vks_lora_config bad = {0, 8.0, VKS_LORA_ALL_TARGETS};
    assert_int_equal(vks_lora_adapter_create(c, &bad, &a), VKS_ERR_ARG);
    assert_null(a);
    bad.rank = 4;
    bad.alpha = 0.0 / 0.0;
    assert_int_equal(vks_lora_adapter_create(c, &bad, &a), VKS_ERR_ARG);
    vks_model_free(m);
}

static void test_hashes(void **state) {
    (void)state;
    vks_model *m = tiny_model();
    vks_lora_config lc = {2, 16.0, VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 1), VKS_OK);
    uint8_t base[32], none[32], with[32], h1[32], h2[32];
    assert_int_equal(vks_model_hash(m, base), VKS_OK);
    assert_int_equal(vks_lora_model_hash(m, NULL, none), VKS_OK);
    assert_memory_equal(base, none, 32);
    assert_int_equal(vks_lora_model_hash(m, a, with), VKS_OK);
    assert_memory_not_equal(base, with, 32);
    assert_int_equal(vks_lora_adapter_hash(a, h1), VKS_OK);
    vks_lora_adapter_B(a, 3, VKS_LORA_UP)[5] = 1e-7f; /* one value */
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_not_equal(h1, h2, 32);
    vks_lora_adapter_B(a, 3, VKS_LORA_UP)[5] = 0.0f;
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_equal(h1, h2, 32);
    vks_lora_adapter_free(a);
    lc.alpha = 32.0; /* a scaled adapter is another model */
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 1), VKS_OK);
    assert_int_equal(vks_lora_adapter_hash(a, h2), VKS_OK);
    assert_memory_not_equal(h1, h2, 32);
    vks_lora_adapter_free(a);
    vks_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_targets),
        cmocka_unit_test(test_adapter_layout),
        cmocka_unit_test(test_hashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
