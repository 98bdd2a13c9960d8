/* test_validate_bwd.c: fg_validate_backward_args without a GPU: every bad input is refused with
 * the documented status and a message naming the argument; good inputs (contiguous, BNHD,
 * GQA/MQA, seqlen_k = 0, empty) are accepted and normalised (strides, scale); the parameter
 * block. The calls on the fake driver are test_backward.c's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fg_params.h"
#include "fg_runtime_internal.h"
#include "validate_support.h"

/* ---- fg_validate_backward_args -------------------------------------------------------------- */

#define P(x) ((void *)(uintptr_t)(x))

/* A valid problem (validate_support.h: B 2, Hq 4, Hkv 2 (GQA), Nq 128, Nk 96, d 64) whose
 * pointers are fake, aligned and far apart (validation touches no memory). */
static fg_attention_backward_args valid_bwd(void) {
  fg_attention_backward_args a;
  FG_TEST_VALID_PROBLEM(a);
  a.v = P(0x30000000);
  a.o = P(0x40000000);
  a.lse = P(0x50000000);
  a.d_o = P(0x60000000);
  a.dq = P(0x70000000);
  a.dk = P(0x80000000);
  a.dv = P(0x90000000);
  return a;
}

static char err[2048];

static fg_status vcheck(const fg_attention_backward_args *a, fg_validate_mode mode,
                        fg_attention_backward_args *out) {
  fg_attention_backward_args tmp;
  strcpy(err, "(not cleared)");
  return fg_validate_backward_args(a, mode, out ? out : &tmp, err, sizeof err);
}

#define EXPECT_MODE(a, mode, status, ...)                                                    \
  do {                                                                                      \
    fg_status s_ = vcheck(&(a), (mode), NULL);                                              \
    cr_assert_eq(s_, (status), "line %d: status %d (%s), message: %s", __LINE__, (int)s_,    \
                 fg_status_string(s_), err);                                                \
    const char *needles_[] = {__VA_ARGS__};                                                 \
    for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)                    \
      cr_assert(strstr(err, needles_[i_]), "line %d: message \"%s\" lacks \"%s\"", __LINE__, \
                err, needles_[i_]);                                                         \
  } while (0)
#define EXPECT_ERR(a, status, ...) EXPECT_MODE(a, FG_VALIDATE_CALL, status, __VA_ARGS__)
#define EXPECT_OK(a, mode)                                                                   \
  do {                                                                                      \
    fg_status s_ = vcheck(&(a), (mode), NULL);                                              \
    cr_assert_eq(s_, FG_OK, "line %d: %s: %s", __LINE__, fg_status_string(s_), err);        \
    cr_assert_str_empty(err, "line %d: a success leaves no message", __LINE__);             \
  } while (0)

static void expect_strides(const int64_t s[3], int64_t s0, int64_t s1, int64_t s2,
                           const char *what) {
  cr_assert(s[0] == s0 && s[1] == s1 && s[2] == s2,
            "%s = {%lld, %lld, %lld}, want {%lld, %lld, %lld}", what, (long long)s[0],
            (long long)s[1], (long long)s[2], (long long)s0, (long long)s1, (long long)s2);
}

Test(validate_bwd, contiguous_gqa_is_accepted_and_normalised) {
  fg_attention_backward_args a = valid_bwd(), n;
  a.causal = 7;
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  cr_assert_str_empty(err);
  const int64_t q0 = 4 * 128 * 64, q1 = 128 * 64, k0 = 2 * 96 * 64, k1 = 96 * 64;
  expect_strides(n.q_stride, q0, q1, 64, "q_stride");
  expect_strides(n.o_stride, q0, q1, 64, "o_stride");
  expect_strides(n.do_stride, q0, q1, 64, "do_stride");
  expect_strides(n.dq_stride, q0, q1, 64, "dq_stride");
  expect_strides(n.k_stride, k0, k1, 64, "k_stride");
  expect_strides(n.v_stride, k0, k1, 64, "v_stride");
  expect_strides(n.dk_stride, k0, k1, 64, "dk_stride");
  expect_strides(n.dv_stride, k0, k1, 64, "dv_stride");
  cr_assert_float_eq(n.scale, 0.125f, 1e-7, "default scale 1/sqrt(64), got %g", n.scale);
  cr_assert_eq(n.causal, 1, "causal normalised to 0/1");
  cr_assert_eq(n.size, sizeof n);
  cr_assert_eq(n.dq, a.dq);
  cr_assert_eq(n.lse, a.lse);

  /* d = 128: 1/sqrt(128); an explicit scale is kept. */
  a = valid_bwd();
  a.head_dim = 128;
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  cr_assert_float_eq(n.scale, (float)(1 / sqrt(128.0)), 1e-7);
  a.scale = 0.3f;
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  cr_assert_eq(n.scale, 0.3f);
  /* size 0 means this version's struct. */
  a = valid_bwd();
  a.size = 0;
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  cr_assert_eq(n.size, sizeof n);
}

Test(validate_bwd, bnhd_strides_and_mqa_are_accepted_and_kept) {
  fg_attention_backward_args a = valid_bwd(), n;
  a.heads_kv = 1; /* MQA */
  const int64_t H = 4, Hk = 1, Nq = 128, Nk = 96, d = 64;
  const int64_t qs[3] = {Nq * H * d, d, H * d}, ks[3] = {Nk * Hk * d, d, Hk * d};
  memcpy(a.q_stride, qs, sizeof qs);
  memcpy(a.o_stride, qs, sizeof qs);
  memcpy(a.do_stride, qs, sizeof qs);
  memcpy(a.dq_stride, qs, sizeof qs);
  memcpy(a.k_stride, ks, sizeof ks);
  memcpy(a.v_stride, ks, sizeof ks);
  memcpy(a.dk_stride, ks, sizeof ks);
  memcpy(a.dv_stride, ks, sizeof ks);
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  expect_strides(n.dq_stride, qs[0], qs[1], qs[2], "dq_stride");
  expect_strides(n.do_stride, qs[0], qs[1], qs[2], "do_stride");
  expect_strides(n.dk_stride, ks[0], ks[1], ks[2], "dk_stride");
  expect_strides(n.dv_stride, ks[0], ks[1], ks[2], "dv_stride");
  /* Only some tensors strided: the others still get their contiguous defaults. */
  a = valid_bwd();
  memcpy(a.dq_stride, (int64_t[3]){Nq * H * d, d, H * d}, sizeof a.dq_stride);
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  expect_strides(n.dq_stride, Nq * H * d, d, H * d, "dq_stride");
  expect_strides(n.do_stride, H * Nq * d, Nq * d, d, "do_stride");
  /* K and V in one buffer (inputs may share memory), as the forward allows. */
  a = valid_bwd();
  a.v = a.k;
  EXPECT_OK(a, FG_VALIDATE_CALL);
}

Test(validate_bwd, seqlen_k_zero_needs_no_k_v_dk_dv) {
  fg_attention_backward_args a = valid_bwd(), n;
  a.seqlen_k = 0;
  a.k = a.v = NULL;
  a.dk = a.dv = NULL;
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  expect_strides(n.dq_stride, 4 * 128 * 64, 128 * 64, 64, "dq_stride");
  /* Unused, so not even their alignment matters. */
  a.dk = P(0x80000008);
  a.k = P(0x20000004);
  EXPECT_OK(a, FG_VALIDATE_CALL);
  /* dq is still needed. */
  a.dq = NULL;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dq is NULL");
}

Test(validate_bwd, empty_problems_accept_null_pointers) {
  const char *which[3] = {"batch", "heads_q", "seqlen_q"};
  for (int w = 0; w < 3; w++) {
    fg_attention_backward_args a = valid_bwd();
    if (w == 0) a.batch = 0;
    if (w == 1) a.heads_q = 0;
    if (w == 2) a.seqlen_q = 0;
    a.q = a.k = a.v = a.o = a.d_o = NULL;
    a.lse = NULL;
    a.dq = a.dk = a.dv = NULL;
    fg_status s = vcheck(&a, FG_VALIDATE_CALL, NULL);
    cr_assert_eq(s, FG_OK, "%s = 0: %s", which[w], err);
  }
  /* Empty still has to be well formed. */
  fg_attention_backward_args a = valid_bwd();
  a.batch = 0;
  a.head_dim = 100;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 100");
}

Test(validate_bwd, null_args_and_size_field) {
  fg_attention_backward_args out;
  cr_assert_eq(fg_validate_backward_args(NULL, FG_VALIDATE_CALL, &out, err, sizeof err),
               FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(err, "args is NULL") && strstr(err, "fg_attention_backward_args"), "%s", err);
  cr_assert_eq(fg_validate_backward_args(NULL, FG_VALIDATE_CALL, &out, NULL, 0),
               FG_ERROR_INVALID_ARGUMENT, "err may be NULL");

  fg_attention_backward_args a = valid_bwd();
  a.size = 16;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->size = 16",
             "sizeof(fg_attention_backward_args)");
  a.size = sizeof a - 8;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->size = ");
  a.size = (size_t)1 << 20;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->size = 1048576");
}

Test(validate_bwd, a_larger_struct_from_a_newer_caller) {
  struct {
    fg_attention_backward_args a;
    unsigned char tail[24];
  } big;
  memset(&big, 0, sizeof big);
  big.a = valid_bwd();
  big.a.size = sizeof big;
  fg_attention_backward_args n;
  cr_assert_eq(vcheck(&big.a, FG_VALIDATE_CALL, &n), FG_OK, "a zero tail is 'off': %s", err);
  cr_assert_eq(n.size, sizeof n);
  big.tail[5] = 1;
  char want[64];
  snprintf(want, sizeof want, "byte %zu of them is set", sizeof(fg_attention_backward_args) + 5);
  EXPECT_ERR(big.a, FG_ERROR_INVALID_ARGUMENT, "args->size = ", want, "upgrade flashgen");
}

Test(validate_bwd, deterministic_is_a_flag) {
  fg_attention_backward_args a = valid_bwd(), out;
  a.deterministic = -3; /* any nonzero value: normalised to 1 */
  cr_assert_eq(fg_validate_backward_args(&a, FG_VALIDATE_CALL, &out, err, sizeof err), FG_OK,
               "%s", err);
  cr_assert_eq(out.deterministic, 1);
}

Test(validate_bwd, dtype_head_dim_heads_scale) {
  fg_attention_backward_args a = valid_bwd();
  a.dtype = 0;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dtype is not set", "FG_DTYPE_BF16");
  a.dtype = 9;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dtype = 9");
  a = valid_bwd();
  a.head_dim = 100;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 100", "multiple of 8");
  a.head_dim = 264;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 264", "32..256");
  a.head_dim = 24;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->head_dim = 24");
  a = valid_bwd();
  a.heads_q = 6;
  a.heads_kv = 4;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->heads_q = 6", "args->heads_kv = 4");
  a.heads_kv = 0;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->heads_kv = 0");
  a = valid_bwd();
  a.seqlen_k = -1;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->seqlen_k = -1");
  a = valid_bwd();
  a.scale = -1;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->scale = -1");
  a.scale = NAN;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->scale", "not finite");
}

Test(validate_bwd, every_null_pointer_is_named) {
  static const char *const names[9] = {"q", "k", "v", "o", "d_o", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 9; i++) {
    fg_attention_backward_args a = valid_bwd();
    const void **cp[6] = {&a.q, &a.k, &a.v, &a.o, &a.d_o, (const void **)&a.lse};
    void **mp[3] = {&a.dq, &a.dk, &a.dv};
    if (i < 6)
      *cp[i] = NULL;
    else
      *mp[i - 6] = NULL;
    char want[64];
    snprintf(want, sizeof want, "args->%s is NULL", names[i]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want);
    if (i == 5) cr_assert(strstr(err, "forward"), "the lse message says where it comes from: %s", err);
    /* FG_VALIDATE_SHAPES (workspace_size, explain): pointers may be NULL. */
    EXPECT_OK(a, FG_VALIDATE_SHAPES);
  }
  fg_attention_backward_args a = valid_bwd();
  a.q = a.k = a.v = a.o = a.d_o = NULL;
  a.lse = NULL;
  a.dq = a.dk = a.dv = NULL;
  EXPECT_OK(a, FG_VALIDATE_SHAPES);
  /* ... but a pointer that is given is still checked. */
  a.d_o = P(0x60000004);
  EXPECT_MODE(a, FG_VALIDATE_SHAPES, FG_ERROR_INVALID_ARGUMENT, "args->d_o = ", "16-byte");
}

Test(validate_bwd, every_misaligned_pointer_is_named) {
  static const char *const names[10] = {"q", "k", "v", "o", "d_o", "lse",
                                        "dq", "dk", "dv", "workspace"};
  for (int i = 0; i < 10; i++) {
    fg_attention_backward_args a = valid_bwd();
    a.workspace = P(0xa0000000);
    a.workspace_size = (size_t)1 << 30;
    EXPECT_OK(a, FG_VALIDATE_CALL);
    const void **cp[6] = {&a.q, &a.k, &a.v, &a.o, &a.d_o, (const void **)&a.lse};
    void **mp[4] = {&a.dq, &a.dk, &a.dv, &a.workspace};
    if (i < 6)
      *cp[i] = (const char *)*cp[i] + 8;
    else
      *mp[i - 6] = (char *)*mp[i - 6] + 8;
    char want[64];
    snprintf(want, sizeof want, "args->%s = 0x", names[i]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want, "16-byte aligned");
  }
}

Test(validate_bwd, gradient_strides) {
  static const char *const sn[4] = {"do_stride", "dq_stride", "dk_stride", "dv_stride"};
  for (int t = 0; t < 4; t++) {
    fg_attention_backward_args a = valid_bwd();
    int64_t *s[4] = {a.do_stride, a.dq_stride, a.dk_stride, a.dv_stride};
    const int64_t n = t < 2 ? 128 : 96, h = t < 2 ? 4 : 2;
    /* Row stride 68: not a multiple of 8 elements (16 bytes). */
    s[t][0] = h * n * 72;
    s[t][1] = n * 72;
    s[t][2] = 68;
    char want[64];
    snprintf(want, sizeof want, "args->%s[2] = 68", sn[t]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want, "multiple of 16 bytes");
    s[t][2] = 72; /* padded rows are fine */
    EXPECT_OK(a, FG_VALIDATE_CALL);
    s[t][0] = -8;
    snprintf(want, sizeof want, "args->%s[0] = -8", sn[t]);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, want, "negative");
  }
}

Test(validate_bwd, gradients_whose_elements_overlap) {
  /* dQ rows 32 elements apart with d = 64: rows i and i+1 share 32 elements. */
  fg_attention_backward_args a = valid_bwd();
  a.dq_stride[0] = 4 * 128 * 64;
  a.dq_stride[1] = 128 * 64;
  a.dq_stride[2] = 32;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dq_stride = {32768, 8192, 32}",
             "makes elements of dq overlap");
  /* dK with head stride 0: the two KV heads write the same rows. */
  a = valid_bwd();
  a.dk_stride[0] = 96 * 64;
  a.dk_stride[1] = 0;
  a.dk_stride[2] = 64;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dk_stride = {6144, 0, 64}",
             "makes elements of dk overlap");
  /* dV with batch stride smaller than a batch. */
  a = valid_bwd();
  a.dv_stride[0] = 96 * 64;
  a.dv_stride[1] = 96 * 64;
  a.dv_stride[2] = 64;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->dv_stride", "makes elements of dv overlap");
  /* dO is an input: overlapping rows are allowed (a broadcast gradient, e.g. from a sum). */
  a = valid_bwd();
  a.do_stride[0] = 0;
  a.do_stride[1] = 0;
  a.do_stride[2] = 64;
  EXPECT_OK(a, FG_VALIDATE_CALL);
}

Test(validate_bwd, gradients_that_alias_another_tensor) {
  /* dq (Q's shape: 2*4*128*64*2 = 131072 bytes), dk and dv (2*2*96*64*2 = 49152 bytes). */
  struct {
    int which; /* 0 dq, 1 dk, 2 dv */
    uintptr_t at;
    const char *want;
  } cases[] = {
      {0, 0x10000000, "args->dq and args->q overlap"},
      {0, 0x10000000 + 131072 - 16, "args->dq and args->q overlap"}, /* last 16 bytes of q */
      {0, 0x40000000 - 131072 + 16, "args->dq and args->o overlap"}, /* first 16 bytes of o */
      {0, 0x60000000, "args->dq and args->d_o overlap"},
      {0, 0x80000000 - 131072 + 64, "args->dq and args->dk overlap"},
      {0, 0x90000000, "args->dq and args->dv overlap"},
      {0, 0x50000000, "args->dq and args->lse overlap"},
      {1, 0x90000000 - 49152 + 16, "args->dk and args->dv overlap"},
      {1, 0x90000000, "args->dk and args->dv overlap"},
      {1, 0x20000000, "args->dk and args->k overlap"},
      {1, 0x60000000 + 4096, "args->dk and args->d_o overlap"},
      {2, 0x30000000 + 32, "args->dv and args->v overlap"},
      {2, 0x50000000 + 1024, "args->dv and args->lse overlap"},
      {2, 0x10000000, "args->dv and args->q overlap"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fg_attention_backward_args a = valid_bwd();
    void **slot[3] = {&a.dq, &a.dk, &a.dv};
    *slot[cases[i].which] = P(cases[i].at);
    EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, cases[i].want, "must not share memory");
  }
  /* Touching but not overlapping: dq ends where o begins. */
  fg_attention_backward_args a = valid_bwd();
  a.dq = P(0x40000000 - 131072);
  EXPECT_OK(a, FG_VALIDATE_CALL);
  /* seqlen_k = 0: dk and dv are empty, so sitting on q is harmless. */
  a = valid_bwd();
  a.seqlen_k = 0;
  a.dk = a.dv = P(0x10000000);
  EXPECT_OK(a, FG_VALIDATE_CALL);
}

Test(validate_bwd, the_forward_checks_apply_to_the_forward_tensors) {
  fg_attention_backward_args a = valid_bwd();
  a.k_stride[0] = 2 * 96 * 64;
  a.k_stride[1] = 96 * 64;
  a.k_stride[2] = 60;
  EXPECT_ERR(a, FG_ERROR_INVALID_ARGUMENT, "args->k_stride[2] = 60");
  a = valid_bwd();
  a.heads_q = a.heads_kv = 70000;
  a.batch = 1;
  EXPECT_ERR(a, FG_ERROR_UNSUPPORTED, "args->heads_q = 70000");
}

Test(validate_bwd, params_block) {
  fg_attention_backward_args a = valid_bwd(), n;
  a.causal = 3;
  a.workspace = P(0xa0000000);
  const int64_t qs[3] = {128 * 4 * 64, 64, 4 * 64};
  memcpy(a.dq_stride, qs, sizeof qs);
  cr_assert_eq(vcheck(&a, FG_VALIDATE_CALL, &n), FG_OK, "%s", err);
  fg_bwd_params p;
  fg_bwd_params_from_args(&n, &p);
  cr_assert_eq(p.q, 0x10000000ull);
  cr_assert_eq(p.d_o, 0x60000000ull);
  cr_assert_eq(p.lse, 0x50000000ull);
  cr_assert_eq(p.dq, 0x70000000ull);
  cr_assert_eq(p.dk, 0x80000000ull);
  cr_assert_eq(p.dv, 0x90000000ull);
  cr_assert_eq(p.workspace, 0xa0000000ull);
  cr_assert(p.dq_sb == qs[0] && p.dq_sh == qs[1] && p.dq_sn == qs[2]);
  cr_assert(p.do_sb == 4 * 128 * 64 && p.do_sh == 128 * 64 && p.do_sn == 64);
  cr_assert(p.dk_sb == 2 * 96 * 64 && p.dv_sh == 96 * 64 && p.k_sn == 64);
  cr_assert_eq(p.hq_per_hkv, 2);
  cr_assert_eq(p.causal, 1);
  cr_assert_eq(p.batch, 2);
  cr_assert_eq(p.seqlen_k, 96);
  cr_assert_float_eq(p.scale, 0.125, 1e-12);
  cr_assert_float_eq(p.scale_log2, 0.125 * 1.4426950408889634, 1e-12);
}
