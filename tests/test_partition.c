/* test_partition: pipeline placement (mpi/partition.c, pure logic in libvks_mpi):
 * even cuts, explicit counts, the speed- and memory-aware automatic cut and its
 * refusals, and the printed description. No MPI is started. */
#include "test_util.h"

#include <string.h>

#include "vkswarm/vks_partition.h"

static void expect_cut(const int *first, const int *want, int n_stages) {
    for (int s = 0; s <= n_stages; s++) assert_int_equal(first[s], want[s]);
}

static void expect_error(int rc, int code, const char *words) {
    assert_int_equal(rc, code);
    if (!strstr(vks_last_error(), words)) fail_msg("message '%s' lacks '%s'", vks_last_error(), words);
}

static void test_even(void **state) {
    (void)state;
    int first[4];
    assert_int_equal(vks_partition_even(10, 3, first), VKS_OK);
    expect_cut(first, (const int[]){0, 3, 6, 10}, 3);
    assert_int_equal(vks_partition_even(5, 1, first), VKS_OK);
    expect_cut(first, (const int[]){0, 5}, 1);
    expect_error(vks_partition_even(2, 3, first), VKS_ERR_ARG, "cannot cut 2 layers into 3 stages");
    expect_error(vks_partition_even(4, 0, first), VKS_ERR_ARG, "into 0 stages");
}

static void test_parse(void **state) {
    (void)state;
    int first[4];
    assert_int_equal(vks_partition_parse("1,2,3", 6, 3, first), VKS_OK);
    expect_cut(first, (const int[]){0, 1, 3, 6}, 3);
    static const char *const bad_form[] = {"1,2", "1,2,3,", "1,x,3", "0,3,3", "1;2;3", "", "1,2,3 "};
    for (size_t i = 0; i < sizeof bad_form / sizeof *bad_form; i++)
        expect_error(vks_partition_parse(bad_form[i], 6, 3, first), VKS_ERR_ARG, "positive layer counts");
    expect_error(vks_partition_parse("1,2,4", 6, 3, first), VKS_ERR_ARG, "must sum to the model's 6 layers");
    expect_error(vks_partition_parse("1,1,1", 6, 3, first), VKS_ERR_ARG, "must sum");
}

static vks_stage_measure stage(double seconds_per_layer, uint64_t free_bytes) {
    return (vks_stage_measure){seconds_per_layer, free_bytes};
}

/* Each further layer goes where the stage's time after taking it is least. */
static void test_auto_by_speed(void **state) {
    (void)state;
    int first[3];
    vks_stage_measure same[2] = {stage(1.0, 1000), stage(1.0, 1000)};
    assert_int_equal(vks_partition_auto(8, 2, same, 10, 0, 0, 0.0, 0.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 4, 8}, 2);
    /* stage 1 twice as fast: twice the layers */
    vks_stage_measure fast1[2] = {stage(1.0, 1000), stage(0.5, 1000)};
    assert_int_equal(vks_partition_auto(9, 2, fast1, 10, 0, 0, 0.0, 0.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 3, 9}, 2);
    /* an embedding worth two layers' time on stage 0: fewer layers there */
    assert_int_equal(vks_partition_auto(8, 2, same, 10, 0, 0, 2.0, 0.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 3, 8}, 2);
    /* a classifier worth two layers on the last stage */
    assert_int_equal(vks_partition_auto(8, 2, same, 10, 0, 0, 0.0, 2.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 5, 8}, 2);
}

static void test_auto_by_memory(void **state) {
    (void)state;
    int first[3];
    /* stage 0 holds its 50-byte embedding and two 10-byte layers, no more */
    vks_stage_measure m[2] = {stage(1.0, 50 + 2 * 10 + 9), stage(1.0, 1000)};
    assert_int_equal(vks_partition_auto(8, 2, m, 10, 50, 0, 0.0, 0.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 2, 8}, 2);
    /* the classifier leaves the last stage room for one layer only */
    vks_stage_measure h[2] = {stage(1.0, 1000), stage(0.1, 60 + 10)};
    assert_int_equal(vks_partition_auto(8, 2, h, 10, 0, 60, 0.0, 0.0, first), VKS_OK);
    expect_cut(first, (const int[]){0, 7, 8}, 2);
    /* no room for one layer beside the embedding */
    vks_stage_measure tight[2] = {stage(1.0, 55), stage(1.0, 1000)};
    expect_error(vks_partition_auto(8, 2, tight, 10, 50, 0, 0.0, 0.0, first), VKS_ERR_NOMEM,
                 "stage 0: not enough device memory for one layer (55 bytes free)");
    /* together the stages hold 5 of 8 layers */
    vks_stage_measure small[2] = {stage(1.0, 20), stage(1.0, 30)};
    expect_error(vks_partition_auto(8, 2, small, 10, 0, 0, 0.0, 0.0, first), VKS_ERR_NOMEM,
                 "the 2 stages together hold only 5 of 8 layers");
    expect_error(vks_partition_auto(1, 2, small, 10, 0, 0, 0.0, 0.0, first), VKS_ERR_ARG, "cannot cut");
}

static void test_describe(void **state) {
    (void)state;
    const int first[] = {0, 3, 6, 10};
    char buf[128];
    vks_partition_describe(first, 3, buf, sizeof buf);
    assert_string_equal(buf, "stage 0: layers [0,3), stage 1: layers [3,6), stage 2: layers [6,10)");
    char small[12];
    memset(small, 'x', sizeof small);
    vks_partition_describe(first, 3, small, sizeof small);  /* cut, still a string */
    assert_string_equal(small, "stage 0: la");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even),          cmocka_unit_test(test_parse),
        cmocka_unit_test(test_auto_by_speed), cmocka_unit_test(test_auto_by_memory),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
