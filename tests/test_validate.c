/* test_validate.c: the runtime checks that need no GPU: every validation error detected before a
 * driver call (status and a message that names the argument and its value), normalisation
 * (default strides and scale, the parameter block), status strings, the shape bucket and problem
 * key, arch compatibility, exported-table registration, and context creation without a driver. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_runtime_internal.h"
#include "validate_support.h"

/* A valid problem (validate_support.h) whose pointers are fake but aligned and far apart. */
static fg_attention_args valid_args(void) {
  fg_attention_args a;
  FG_TEST_VALID_PROBLEM(a);
  a.v = (const void *)(uintptr_t)0x30000000;
  a.o = (void *)(uintptr_t)0x40000000;
  a.lse = (float *)(uintptr_t)0x50000000;
  return a;
}

static char err[2048];

static fg_status check(const fg_attention_args *a, fg_attention_args *out) {
  fg_attention_args tmp;
  err[0] = 0;
  return fg_validate_args(a, FG_VALIDATE_CALL, out ? out : &tmp, err, sizeof err);
}

#define EXPECT_ERR(a, status, ...)                                                     \
  do {                                                                                 \
    fg_status s_ = check(&(a), NULL);                                                  \
    cr_assert_eq(s_, (status), "status %d (%s), message: %s", (int)s_,                  \
                 fg_status_string(s_), err);                                           \
    const char *needles_[] = {__VA_ARGS__};                                            \
    for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)               \
      cr_assert(strstr(err, needles_[i_]), "message \"%s\" lacks \"%s\"", err, needles_[i_]); \
  } while (0)

Test(validate, valid_problem_passes_and_is_normalised) {
  fg_attention_args a = valid_args(), n;
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  cr_assert_eq(n.q_stride[0], 4 * 128 * 64);
  cr_assert_eq(n.q_stride[1], 128 * 64);
  cr_assert_eq(n.q_stride[2], 64);
  cr_assert_eq(n.k_stride[0], 2 * 96 * 64);
  cr_assert_eq(n.k_stride[1], 96 * 64);
  cr_assert_eq(n.v_stride[2], 64);
  cr_assert_eq(n.o_stride[0], 4 * 128 * 64);
  cr_assert_float_eq(n.scale, 0.125f, 1e-7, "default scale 1/sqrt(64)");
  cr_assert_eq(n.size, sizeof n);
}

Test(validate, null_args) {
  fg_attention_args out;
  cr_assert_eq(fg_validate_args(NULL, FG_VALIDATE_CALL, &out, err, sizeof err),
               FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "args is NULL"), "%s", err);
}

Test(validate, size_field) {
  fg_attention_args a = valid_args();
  a.size = 0;
  cr_assert_eq(check(&a, NULL), FG_OK, "size 0 means this version: %s", err);
  a.size = 16;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->size = 16", "sizeof(fg_attention_args)");
  a.size = 1u << 20;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->size = 1048576");
}

Test(validate, larger_struct_from_a_newer_caller) {
  struct {
    fg_attention_args a;
    int64_t future[4];
  } big;
  memset(&big, 0, sizeof big);
  big.a = valid_args();
  big.a.size = sizeof big;
  cr_assert_eq(check(&big.a, NULL), FG_OK, "unknown fields left zero are fine: %s", err);
  big.future[2] = 1;
  EXPECT_ERR(big.a, FG_ERROR_INVALID_ARGUMENT, "args->size", "does not know", "upgrade flashgen");
}

Test(validate, dtype) {
  fg_attention_args a = valid_args();
  a.dtype = 0;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dtype is not set", "FG_DTYPE_BF16");
  a.dtype = (fg_dtype)7;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dtype = 7", "FG_DTYPE_F16");
  a.dtype = FG_DTYPE_F16;
  cr_assert_eq(check(&a, NULL), FG_OK, "%s", err);
}

Test(validate, negative_sizes) {
  const char *names[] = {"batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"};
  for (int i = 0; i < 6; i++) {
    fg_attention_args a = valid_args();
    int64_t *f[] = {&a.batch, &a.heads_q, &a.heads_kv, &a.seqlen_q, &a.seqlen_k, &a.head_dim};
    *f[i] = -8;
    char want[64];
    snprintf(want, sizeof want, "args->%s = -8 is negative", names[i]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want);
  }
}

Test(validate, head_dim) {
  fg_attention_args a = valid_args();
  a.head_dim = 100;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT,
             "head_dim = 100 is not a multiple of 8; flashgen supports 32..256 in steps of 8");
  a.head_dim = 264;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 264 is outside 32..256");
  a.head_dim = 24;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 24 is outside 32..256");
  a.head_dim = 0;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 0");
  static const int ok[] = {32, 40, 64, 80, 96, 128, 160, 192, 256};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    a.head_dim = ok[i];
    cr_assert_eq(check(&a, NULL), FG_OK, "d = %d: %s", ok[i], err);
  }
}

Test(validate, heads) {
  fg_attention_args a = valid_args();
  a.heads_kv = 0;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->heads_kv = 0 with heads_q = 4");
  a.heads_q = 12;
  a.heads_kv = 5;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT,
             "args->heads_q = 12 is not a multiple of args->heads_kv = 5");
  a.heads_q = 2;
  a.heads_kv = 4;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT,
             "args->heads_q = 2 is not a multiple of args->heads_kv = 4");
  a.heads_q = 16;
  a.heads_kv = 2; /* GQA 8:1 */
  cr_assert_eq(check(&a, NULL), FG_OK, "%s", err);
  a.heads_kv = 1; /* MQA */
  cr_assert_eq(check(&a, NULL), FG_OK, "%s", err);
  a.heads_q = 70000;
  a.heads_kv = 70000;
  EXPECT_ERR(a, FG_ERROR_UNSUPPORTED, "args->heads_q = 70000", "65535");
}

Test(validate, scale) {
  fg_attention_args a = valid_args(), n;
  a.scale = NAN;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->scale = nan is not finite");
  a.scale = INFINITY;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->scale = inf is not finite");
  a.scale = -0.5f;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->scale = -0.5 is negative");
  a.scale = 0.25f;
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  cr_assert_eq(n.scale, 0.25f);
  a.scale = -0.0f;
  cr_assert_eq(check(&a, &n), FG_OK, "-0 is 0, the default: %s", err);
  cr_assert_float_eq(n.scale, 0.125f, 1e-7);
}

Test(validate, null_pointers) {
  const char *names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; i++) {
    fg_attention_args a = valid_args();
    if (i == 0) a.q = NULL;
    if (i == 1) a.k = NULL;
    if (i == 2) a.v = NULL;
    if (i == 3) a.o = NULL;
    char want[64];
    snprintf(want, sizeof want, "args->%s is NULL", names[i]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want, "device address");
  }
  fg_attention_args a = valid_args();
  a.lse = NULL;
  cr_assert_eq(check(&a, NULL), FG_OK, "lse is optional: %s", err);
}

Test(validate, null_pointers_allowed_when_nothing_is_read) {
  fg_attention_args a = valid_args();
  a.seqlen_k = 0; /* no key: K and V are never read */
  a.k = a.v = NULL;
  cr_assert_eq(check(&a, NULL), FG_OK, "%s", err);
  fg_attention_args e = valid_args();
  e.q = e.k = e.v = NULL;
  e.o = NULL;
  e.lse = NULL;
  e.batch = 0;
  fg_attention_args n;
  cr_assert_eq(check(&e, &n), FG_OK, "%s", err);
  cr_assert(fg_args_empty(&n));
  e.batch = 2;
  e.seqlen_q = 0;
  cr_assert_eq(check(&e, &n), FG_OK, "%s", err);
  cr_assert(fg_args_empty(&n));
  e.seqlen_q = 4;
  e.heads_q = e.heads_kv = 0;
  cr_assert_eq(check(&e, &n), FG_OK, "%s", err);
  cr_assert(fg_args_empty(&n));
  /* fg_explain's mode takes shapes only */
  fg_attention_args s = valid_args();
  s.q = s.k = s.v = NULL;
  s.o = NULL;
  cr_assert_eq(fg_validate_args(&s, FG_VALIDATE_SHAPES, &n, err, sizeof err), FG_OK, "%s", err);
}

Test(validate, misaligned_pointers) {
  const char *names[] = {"q", "k", "v", "o", "lse"};
  for (int i = 0; i < 5; i++) {
    fg_attention_args a = valid_args();
    if (i == 0) a.q = (const char *)a.q + 8;
    if (i == 1) a.k = (const char *)a.k + 2;
    if (i == 2) a.v = (const char *)a.v + 4;
    if (i == 3) a.o = (char *)a.o + 8;
    if (i == 4) a.lse = (float *)((char *)a.lse + 4);
    char want[64];
    snprintf(want, sizeof want, "args->%s = 0x", names[i]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want, "is not 16-byte aligned");
  }
}

Test(validate, strides) {
  fg_attention_args a = valid_args();
  a.q_stride[0] = 4 * 128 * 64;
  a.q_stride[1] = 128 * 64;
  a.q_stride[2] = 100;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT,
             "args->q_stride[2] = 100 elements (200 bytes) is not a multiple of 16 bytes");
  a = valid_args();
  a.k_stride[0] = -8;
  a.k_stride[1] = 96 * 64;
  a.k_stride[2] = 64;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->k_stride[0] = -8 is negative");
  a = valid_args();
  a.v_stride[1] = 12;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->v_stride[1] = 12 elements (24 bytes)");
}

Test(validate, bnhd_layout) {
  fg_attention_args a = valid_args(), n;
  const int64_t N = 128, H = 4, Hk = 2, Nk = 96, d = 64;
  int64_t qs[3] = {N * H * d, d, H * d}, ks[3] = {Nk * Hk * d, d, Hk * d};
  memcpy(a.q_stride, qs, sizeof qs);
  memcpy(a.o_stride, qs, sizeof qs);
  memcpy(a.k_stride, ks, sizeof ks);
  memcpy(a.v_stride, ks, sizeof ks);
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  cr_assert_eq(n.q_stride[2], H * d);
  fg_fwd_params p;
  fg_params_from_args(&n, &p);
  cr_assert_eq(p.q_sb, N * H * d);
  cr_assert_eq(p.q_sh, d);
  cr_assert_eq(p.q_sn, H * d);
  cr_assert_eq(p.k_sn, Hk * d);
}

Test(validate, overlapping_output_rows) {
  fg_attention_args a = valid_args();
  a.o_stride[0] = 4 * 128 * 64;
  a.o_stride[1] = 128 * 64;
  a.o_stride[2] = 32; /* rows of 64 elements 32 apart */
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->o_stride = {32768, 8192, 32}", "overlap");
  a.o_stride[2] = 64;
  a.o_stride[1] = 0; /* every head writes the same rows */
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->o_stride", "overlap");
}

Test(validate, output_aliasing_an_input) {
  fg_attention_args a = valid_args();
  a.o = (void *)(uintptr_t)a.q;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->q and args->o overlap");
  a = valid_args();
  a.lse = (float *)((char *)a.o + 4096);
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->o and args->lse overlap");
  a = valid_args();
  a.v = a.k; /* inputs may share memory */
  cr_assert_eq(check(&a, NULL), FG_OK, "%s", err);
}

Test(validate, sixty_four_bit_sizes) {
  /* B = 8300, Hq = 16, Nq = Nk = 1: batch * heads_q past the grid's y limit is valid. */
  fg_attention_args a = valid_args(), n;
  a.batch = 8300;
  a.heads_q = a.heads_kv = 16;
  a.seqlen_q = a.seqlen_k = 1;
  a.head_dim = 128;
  a.q = (const void *)(uintptr_t)0x100000000ull;
  a.k = (const void *)(uintptr_t)0x200000000ull;
  a.v = (const void *)(uintptr_t)0x300000000ull;
  a.o = (void *)(uintptr_t)0x400000000ull;
  a.lse = (float *)(uintptr_t)0x500000000ull;
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  /* Q of more than 2^31 elements */
  a.batch = a.heads_q = a.heads_kv = 1;
  a.seqlen_q = (INT64_C(1) << 31) / 128 + 4097;
  a.seqlen_k = 64;
  a.q = (const void *)(uintptr_t)0x1000000000ull;
  a.o = (void *)(uintptr_t)0x2000000000ull;
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  cr_assert_eq(fg_tensor_extent(1, 1, a.seqlen_q, 128, n.q_stride), a.seqlen_q * 128);
  /* offsets that overflow 64 bits */
  a.batch = INT64_C(1) << 50;
  a.seqlen_q = 1 << 20;
  EXPECT_ERR(a, FG_ERROR_UNSUPPORTED, "do not fit in 64 bits");
  const int64_t s[3] = {INT64_C(1) << 62, 8, 8};
  cr_assert_eq(fg_tensor_extent(4, 1, 1, 8, s), -1);
  cr_assert_eq(fg_tensor_extent(0, 1, 1, 8, s), 0);
  /* key blocks are counted in 32 bits */
  a = valid_args();
  a.seqlen_k = (INT64_C(1) << 31);
  EXPECT_ERR(a, FG_ERROR_UNSUPPORTED, "args->seqlen_k = 2147483648 is more than 2147483647");
}

Test(validate, params_block) {
  fg_attention_args a = valid_args(), n;
  a.causal = 5;
  a.scale = 0.5f;
  cr_assert_eq(check(&a, &n), FG_OK, "%s", err);
  fg_fwd_params p;
  fg_params_from_args(&n, &p);
  cr_assert_eq(p.causal, 1);
  cr_assert_eq(p.hq_per_hkv, 2);
  cr_assert_eq(p.q, 0x10000000ull);
  cr_assert_eq(p.lse, 0x50000000ull);
  cr_assert_eq(p.workspace, 0);
  cr_assert_float_eq(p.scale, 0.5, 1e-12);
  cr_assert_float_eq(p.scale_log2, 0.5 * 1.4426950408889634, 1e-12);
  cr_assert_eq(p.batch, 2);
  cr_assert_eq(p.seqlen_k, 96);
}

Test(status, strings_for_every_code) {
  const char *seen[11];
  for (int c = 0; c <= 10; c++) {
    const char *s = fg_status_string((fg_status)c);
    cr_assert(s && s[0], "code %d has no text", c);
    cr_assert(strcmp(s, "unknown status code") != 0, "code %d is unknown", c);
    for (int k = 0; k < c; k++)
      cr_assert(strcmp(seen[k], s) != 0, "codes %d and %d share text", k, c);
    seen[c] = s;
  }
  cr_assert_str_eq(fg_status_string(FG_OK), "success");
  cr_assert_str_eq(fg_status_string(FG_ERROR_INVALID_ARGUMENT), "invalid argument");
  cr_assert_str_eq(fg_status_string((fg_status)99), "unknown status code");
  cr_assert_str_eq(fg_version(), FG_VERSION_STRING);
}

Test(context, create_without_a_driver) {
  /* An explicit driver path that does not exist is the only place looked at, so this holds on
   * a machine with a GPU too. */
  setenv("FLASHGEN_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  fg_context *ctx = (fg_context *)(uintptr_t)1;
  fg_status s = fg_context_create(&ctx, NULL);
  cr_assert_eq(s, FG_ERROR_NO_DRIVER, "%s", fg_status_string(s));
  cr_assert_null(ctx);
  const char *m = fg_last_create_error();
  cr_assert(strstr(m, "FLASHGEN_CUDA_LIBRARY=/nonexistent/libcuda.so.1"), "%s", m);
  cr_assert(strstr(m, "could not be loaded"), "%s", m);
}

Test(context, create_without_libcuda_says_what_to_do) {
  unsetenv("FLASHGEN_CUDA_LIBRARY");
  char e[2048];
  if (fg_cuda_load(e, sizeof e) == 0) {
    cr_skip_test("libcuda.so.1 is installed on this machine");
  }
  fg_context *ctx;
  fg_status s = fg_context_create(&ctx, NULL);
  cr_assert_eq(s, FG_ERROR_NO_DRIVER);
  cr_assert_null(ctx);
  const char *m = fg_last_create_error();
  cr_assert(strstr(m, "libcuda.so.1"), "%s", m);
  cr_assert(strstr(m, "was not found"), "%s", m);
  cr_assert(strstr(m, "looked in"), "%s", m);
  cr_assert(strstr(m, "Install the NVIDIA driver"), "%s", m);
  char report[4096];
  cr_assert_eq(fg_cuda_report(report, sizeof report), -1);
  cr_assert(strstr(report, "not usable"), "%s", report);
}

Test(context, bad_options_and_null_handles) {
  cr_assert_eq(fg_context_create(NULL, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_last_create_error(), "out is NULL"));
  fg_context *ctx;
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = (fg_policy)9;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_last_create_error(), "options->policy = 9"), "%s", fg_last_create_error());
  o.policy = FG_POLICY_JIT;
  o.device = -1;
  cr_assert_eq(fg_context_create(&ctx, &o), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_last_create_error(), "options->device = -1"), "%s", fg_last_create_error());
  cr_assert(fg_context_last_error(NULL)[0]);
  fg_context_destroy(NULL);
  fg_attention_args a = valid_args();
  cr_assert_eq(fg_attention_forward(NULL, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  char buf[128];
  cr_assert_eq(fg_explain(NULL, &a, buf, sizeof buf), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(buf, "ctx is NULL"), "%s", buf);
}

Test(dispatch, buckets_and_keys) {
  cr_assert_eq(fg_seqlen_bucket(0), 512);
  cr_assert_eq(fg_seqlen_bucket(1), 512);
  cr_assert_eq(fg_seqlen_bucket(512), 512);
  cr_assert_eq(fg_seqlen_bucket(513), 1024);
  cr_assert_eq(fg_seqlen_bucket(4096), 4096);
  cr_assert_eq(fg_seqlen_bucket(4097), 8192);
  cr_assert_eq(fg_seqlen_bucket(16384), 16384);
  cr_assert_eq(fg_seqlen_bucket(INT64_C(1) << 40), 16384);
  char k[64], p[64];
  fg_problem pr = fg_problem_make(FG_PASS_FWD, 128, FG_DTYPE_BF16, 1, 4096);
  fg_problem_format(&pr, k, sizeof k);
  cr_assert_str_eq(k, "fwd_d128_bf16_causal_nk4096");
  pr = fg_problem_make(FG_PASS_FWD, 64, FG_DTYPE_F16, 0, 512);
  fg_problem_format(&pr, k, sizeof k);
  cr_assert_str_eq(k, "fwd_d64_f16_noncausal_nk512");
  fg_problem_prefix(&pr, p, sizeof p);
  cr_assert_str_eq(p, "fwd_d64_f16_noncausal_nk");
  cr_assert_eq(fg_problem_key_bucket(k, p), 512);
  cr_assert_eq(fg_problem_key_bucket("fwd_d128_bf16_causal_nk4096", p), -1);
  cr_assert_eq(fg_problem_key_bucket("fwd_d64_f16_noncausal_nk", p), -1);
  cr_assert_eq(fg_problem_key_bucket("fwd_d64_f16_noncausal_nk12x", p), -1);
}

Test(dispatch, arch_compat) {
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM90A, 9, 0), 3);
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM80, 8, 0), 3);
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM80, 8, 6), 2);  /* sm_80 cubin runs on 8.6 */
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM86, 8, 0), 0);  /* not backwards */
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM80, 9, 0), 1);  /* PTX only */
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM90A, 8, 9), 0);
  cr_assert_eq(fg_arch_compat(FG_ARCH_SM90A, 10, 0), 0); /* arch-specific code is not portable */
}

Test(exported, malformed_tables_are_refused) {
  char e[512];
  cr_assert_eq(fg_register_exported(NULL, e, sizeof e), FG_ERROR_INVALID_ARGUMENT);
  static unsigned char cubin[16] = {1};
  fg_kernel_image k;
  memset(&k, 0, sizeof k);
  snprintf(k.variant, sizeof k.variant, "not_a_variant");
  k.cubin = cubin;
  k.cubin_size = sizeof cubin;
  fg_kernel_meta_single(&k.meta, "fg_x", FG_GRID_Q_TILES, 128, 128, 0);
  fg_exported_table t = {"test table", &k, 1, NULL, 0};
  cr_assert_eq(fg_register_exported(&t, e, sizeof e), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(e, "test table") && strstr(e, "not_a_variant"), "%s", e);
  snprintf(k.variant, sizeof k.variant, "fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm90a");
  k.meta.steps[0].entry[0] = 0;
  cr_assert_eq(fg_register_exported(&t, e, sizeof e), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(e, "entry point"), "%s", e);
  snprintf(k.meta.steps[0].entry, sizeof k.meta.steps[0].entry, "fg_x");
  fg_exported_choice c = {"fwd_d128_bf16_causal_nk4096", "garbage"};
  t.choices = &c;
  t.n_choices = 1;
  cr_assert_eq(fg_register_exported(&t, e, sizeof e), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(e, "choice 0"), "%s", e);
  c.variant = "fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm90a";
  cr_assert_eq(fg_register_exported(&t, e, sizeof e), FG_OK, "%s", e);
  cr_assert_eq(fg_register_exported(&t, e, sizeof e), FG_OK, "registering twice is a no-op");
}
