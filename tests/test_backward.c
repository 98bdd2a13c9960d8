/* test_backward.c: fg_attention_backward on the fake driver (tests/fake_cuda/libcuda.c, which
 * records backward launches), no GPU: the plan's three kernels in order with their grids, blocks
 * and parameter blocks, the split past the grid's y limit, seqlen_k = 0, the workspace (allocated
 * and freed, or the caller's, refused when too small) and fg_attention_backward_workspace_size.
 * The validation of the arguments is test_validate_bwd.c's. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_support.h"
#include "fg_params.h"
#include "fg_runtime_internal.h"
#include "support_plan.h"
#include "fake_cuda/fake_records.h"

#define P(x) ((void *)(uintptr_t)(x))

/* ---- fg_attention_backward on the fake driver ------------------------------------------------ */

/* The fake driver's records: tests/fake_cuda/fake_records.h. */
static char tmp_dir[64], fake_lib[160];
static void *fake_handle;
static void (*fake_reset)(void);
static int (*fake_launch_count)(void);
static const fake_launch *(*fake_launch_get)(int);
static void (*fake_mem_counts)(int *, int *, size_t *);
static void (*fake_async_counts)(int *, int *, void **);
static int (*fake_memset_async_last)(unsigned long long *, size_t *, unsigned *, void **, int *);
static int (*fake_stream_syncs)(void **);
static int (*fake_module_loads)(void);
static fg_context *ctx;

/* Backward kernels for the fake H100 (sm_90a): d 32, 64, 128, 256 x f16, bf16 x causal or not,
 * the built-in rule's variants with templates/bwd.lua's plan, as if exported. The cubin is never
 * looked at. */
#define N_IMAGES 16
static fg_kernel_image images[N_IMAGES];
static const unsigned char fake_cubin[16] = {0x7f, 'E', 'L', 'F'};
static fg_exported_table table;

static void register_backward_kernels(void) {
  static const int ds[4] = {32, 64, 128, 256};
  int n = 0;
  for (int di = 0; di < 4; di++)
    for (int t = 1; t <= 2; t++)
      for (int c = 0; c < 2; c++) {
        const fg_variant v = fg_builtin_backward_variant(ds[di], (fg_dtype)t, c, FG_ARCH_SM90A);
        fg_kernel_image *k = &images[n++];
        memset(k, 0, sizeof *k);
        char name[FG_VARIANT_NAME_MAX];
        cr_assert_gt(fg_variant_name(&v, name, sizeof name), 0);
        snprintf(k->variant, sizeof k->variant, "%s", name);
        k->arch = FG_ARCH_SM90A;
        k->cubin = (unsigned char *)fake_cubin;
        k->cubin_size = sizeof fake_cubin;
        cr_assert_lt(strlen(name) + 8, sizeof k->meta.steps[0].entry, "the entry of %s is too long",
                     name);
        /* smem: something to recognise */
        test_backward_plan(&k->meta, name, ds[di], v.bc, v.warps * 32, 70000 + ds[di]);
        /* d = 32 without a mask runs with a tail (the_tail_of_a_partial_last_wave) */
        if (ds[di] == 32 && !c) test_backward_plan_add_tail(&k->meta, ds[di], v.bc);
        k->meta.regs = k->meta.spill_load_bytes = k->meta.spill_store_bytes = -1;
        k->meta.stack_bytes = -1;
      }
  table.description = "test_backward";
  table.kernels = images;
  table.n_kernels = N_IMAGES;
  char e[512];
  cr_assert_eq(fg_register_exported(&table, e, sizeof e), FG_OK, "%s", e);
}

static void fake_setup(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/fg_bwd_test_XXXXXX");
  cr_assert_not_null(mkdtemp(tmp_dir));
  fgt_fake_driver_build(tmp_dir, "", fake_lib, sizeof fake_lib);
  register_backward_kernels();

  ctx = fgt_fake_context(fake_lib, &fake_handle);
  *(void **)&fake_reset = fgt_fake_sym(fake_handle, "fake_reset");
  *(void **)&fake_launch_count = fgt_fake_sym(fake_handle, "fake_launch_count");
  *(void **)&fake_launch_get = fgt_fake_sym(fake_handle, "fake_launch_get");
  *(void **)&fake_mem_counts = fgt_fake_sym(fake_handle, "fake_mem_counts");
  *(void **)&fake_async_counts = fgt_fake_sym(fake_handle, "fake_async_counts");
  *(void **)&fake_memset_async_last = fgt_fake_sym(fake_handle, "fake_memset_async_last");
  *(void **)&fake_stream_syncs = fgt_fake_sym(fake_handle, "fake_stream_syncs");
  *(void **)&fake_module_loads = fgt_fake_sym(fake_handle, "fake_module_loads");
  /* The tensors here are made-up addresses: record the launches, compute nothing. */
  setenv("FAKE_CUDA_BACKWARD_RECORD_ONLY", "1", 1);
  fake_reset();
}

static void fake_teardown(void) {
  fgt_fake_teardown(ctx, fake_handle, tmp_dir);
  ctx = NULL;
  fake_handle = NULL;
}

/* A backward problem on fake device addresses 2^36 bytes apart (nothing is read or written: the
 * fake driver's backward kernels only record their launch). */
#define BASE(i) ((uintptr_t)(i) << 36)
static fg_attention_backward_args bwd_problem(fg_dtype t, int causal, int64_t B, int64_t Hq,
                                              int64_t Hkv, int64_t Nq, int64_t Nk, int64_t d) {
  fg_attention_backward_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = t;
  a.causal = causal;
  a.batch = B;
  a.heads_q = Hq;
  a.heads_kv = Hkv;
  a.seqlen_q = Nq;
  a.seqlen_k = Nk;
  a.head_dim = d;
  a.q = P(BASE(1));
  a.k = P(BASE(2));
  a.v = P(BASE(3));
  a.o = P(BASE(4));
  a.lse = P(BASE(5));
  a.d_o = P(BASE(6));
  a.dq = P(BASE(7));
  a.dk = P(BASE(8));
  a.dv = P(BASE(9));
  return a;
}

static uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static const fake_launch *launch(int i) {
  const fake_launch *l = fake_launch_get(i);
  cr_assert_not_null(l, "launch %d was not recorded (%d launches)", i, fake_launch_count());
  return l;
}

static void expect_launch(int i, const char *entry, unsigned gx, unsigned gy, unsigned threads,
                          unsigned smem) {
  const fake_launch *l = launch(i);
  cr_assert_str_eq(l->entry, entry, "launch %d", i);
  cr_assert(l->grid[0] == gx && l->grid[1] == gy && l->grid[2] == 1,
            "launch %d (%s): grid %u x %u x %u, want %u x %u x 1", i, entry, l->grid[0],
            l->grid[1], l->grid[2], gx, gy);
  cr_assert(l->block[0] == threads && l->block[1] == 1 && l->block[2] == 1,
            "launch %d (%s): block %u, want %u", i, entry, l->block[0], threads);
  cr_assert_eq(l->smem, smem, "launch %d (%s): %u B of shared memory, want %u", i, entry, l->smem,
               smem);
}

/* The entry names of the built-in variant for the problem. */
static void entries(const fg_attention_backward_args *a, char pre[128], char main_[128],
                    char post[128], fg_variant *v) {
  *v = fg_builtin_backward_variant((int)a->head_dim, a->dtype, a->causal, FG_ARCH_SM90A);
  char name[FG_VARIANT_NAME_MAX];
  cr_assert_gt(fg_variant_name(v, name, sizeof name), 0);
  snprintf(pre, 128, "fg_%s_pre", name);
  snprintf(main_, 128, "fg_%s", name);
  snprintf(post, 128, "fg_%s_post", name);
}

static size_t ws_bytes(int64_t B, int64_t Hq, int64_t Nq, int64_t d) {
  return (size_t)((d + 1) * 4 * B * Hq * Nq);
}

Test(backward_launch, three_kernels_in_order, .init = fake_setup, .fini = fake_teardown) {
  /* d = 128: Br = 64, Bc = 128, so a grid of ceil(Nk / Br) would show. */
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 1, 2, 4, 2, 100, 130, 128);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(v.bc, 128);
  cr_assert_neq(v.br, v.bc);
  fg_status s = fg_attention_backward(ctx, &a, NULL);
  cr_assert_eq(s, FG_OK, "%s: %s", fg_status_string(s), fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  expect_launch(0, pre, (unsigned)cdiv(100, 64), 2 * 4, 128, 0);
  expect_launch(1, mn, (unsigned)cdiv(130, 128), 2 * 2, (unsigned)v.warps * 32, 70000 + 128);
  expect_launch(2, post, (unsigned)cdiv(100, 64), 2 * 4, 128, 0);
  /* The workspace was allocated for the call (no memory pools on the fake driver), the same
   * buffer went to all three kernels, and it was freed. */
  int allocs, frees;
  size_t bytes;
  fake_mem_counts(&allocs, &frees, &bytes);
  cr_assert_eq(allocs, 1);
  cr_assert_eq(frees, 1);
  cr_assert_eq(bytes, ws_bytes(2, 4, 100, 128), "allocated %zu bytes", bytes);
  const fg_bwd_params *p0 = &launch(0)->params;
  cr_assert_neq(p0->workspace, 0);
  cr_assert_eq(p0->workspace % 16, 0);
  for (int i = 1; i < 3; i++)
    cr_assert_eq(memcmp(&launch(i)->params, p0, sizeof *p0), 0,
                 "launch %d got another parameter block", i);
  /* The parameter block: the caller's pointers, default strides, the resolved scale. */
  cr_assert_eq(p0->q, (unsigned long long)BASE(1));
  cr_assert_eq(p0->lse, (unsigned long long)BASE(5));
  cr_assert_eq(p0->d_o, (unsigned long long)BASE(6));
  cr_assert_eq(p0->dq, (unsigned long long)BASE(7));
  cr_assert_eq(p0->dv, (unsigned long long)BASE(9));
  cr_assert(p0->dq_sb == 4 * 100 * 128 && p0->dq_sh == 100 * 128 && p0->dq_sn == 128);
  cr_assert(p0->dk_sb == 2 * 130 * 128 && p0->dk_sh == 130 * 128 && p0->dk_sn == 128);
  cr_assert(p0->batch == 2 && p0->heads_q == 4 && p0->heads_kv == 2 && p0->hq_per_hkv == 2);
  cr_assert(p0->seqlen_q == 100 && p0->seqlen_k == 130 && p0->head_dim == 128);
  cr_assert_eq(p0->causal, 1);
  cr_assert_float_eq(p0->scale, 1 / sqrt(128.0), 1e-7);

  /* A second call with another (d, dtype, causal) picks its own kernel. */
  fake_reset();
  fg_attention_backward_args b = bwd_problem(FG_DTYPE_BF16, 0, 1, 2, 1, 64, 65, 32);
  entries(&b, pre, mn, post, &v);
  cr_assert_eq(fg_attention_backward(ctx, &b, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  expect_launch(0, pre, 1, 2, 128, 0);
  expect_launch(1, mn, (unsigned)cdiv(65, (uint64_t)v.bc), 1, (unsigned)v.warps * 32, 70000 + 32);
  expect_launch(2, post, 1, 2, 128, 0);
  cr_assert_eq(launch(1)->params.causal, 0);
}

static void pools_setup(void) {
  setenv("FAKE_CUDA_MEMORY_POOLS", "1", 1);
  fake_setup();
}

Test(backward_launch, workspace_from_the_stream_pool, .init = pools_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 1, 2, 4, 2, 100, 130, 64);
  CUstream stream = (CUstream)(uintptr_t)0x5000; /* the fake driver never dereferences it */
  cr_assert_eq(fg_attention_backward(ctx, &a, stream), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  int allocs, frees;
  size_t bytes;
  void *st;
  fake_mem_counts(&allocs, &frees, &bytes);
  cr_assert_eq(bytes, ws_bytes(2, 4, 100, 64));
  cr_assert_eq(allocs, 0, "with memory pools the workspace is stream-ordered");
  cr_assert_eq(frees, 0);
  fake_async_counts(&allocs, &frees, &st);
  cr_assert_eq(allocs, 1);
  cr_assert_eq(frees, 1, "the workspace is freed on the stream after the kernels");
  cr_assert_eq(st, (void *)stream, "allocated and freed on the call's stream");
}

/* flashgen check's poisoning (fg_context_poison_workspaces): the whole workspace is filled with
 * 0xffffffff (fp32 NaN) on the call's stream before the plan's first kernel; without it, nothing
 * is filled (a call pays for no memset). */
Test(backward_launch, a_poisoned_workspace_is_filled_before_the_plan, .init = pools_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 1, 2, 4, 2, 100, 130, 64);
  CUstream stream = (CUstream)(uintptr_t)0x5000;
  unsigned long long ptr;
  size_t words;
  unsigned value;
  void *st;
  int before;
  cr_assert_eq(fg_attention_backward(ctx, &a, stream), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_memset_async_last(&ptr, &words, &value, &st, &before), 0,
               "not poisoned unless asked");
  fake_reset();
  fg_context_poison_workspaces(ctx, 1);
  cr_assert_eq(fg_attention_backward(ctx, &a, stream), FG_OK, "%s", fg_context_last_error(ctx));
  fg_context_poison_workspaces(ctx, 0);
  cr_assert_eq(fake_launch_count(), 3);
  cr_assert_eq(fake_memset_async_last(&ptr, &words, &value, &st, &before), 1);
  cr_assert_eq(ptr, launch(0)->params.workspace, "the workspace's first byte (dQ's accumulator)");
  cr_assert_eq(words * 4, ws_bytes(2, 4, 100, 64), "all of it");
  cr_assert_eq(value, 0xffffffffu);
  cr_assert_eq(st, (void *)stream, "on the call's stream");
  cr_assert_eq(before, 0, "before the plan's first kernel");
}

/* The device helpers that flashgen check, the tuner and fg_ab fill inputs and outputs with run on
 * the legacy default stream, which their kernels' non-blocking stream does not wait for: each
 * waits for that stream (CU_STREAM_LEGACY) before returning. */
Test(backward_launch, uploads_and_fills_wait_for_the_legacy_stream, .init = fake_setup,
     .fini = fake_teardown) {
  CUdeviceptr d = 0;
  cr_assert_eq(fg_dev_alloc(ctx, &d, 64), FG_OK);
  const unsigned char host[64] = {1};
  void *last = NULL;
  for (int i = 0; i < 3; i++) {
    const int n = fake_stream_syncs(&last);
    fg_status st = i == 0   ? fg_dev_upload(ctx, d, host, sizeof host)
                   : i == 1 ? fg_dev_fill16(ctx, d, 0x7fc0, 32)
                            : fg_dev_fill32(ctx, d, 0xffffffffu, 16);
    cr_assert_eq(st, FG_OK, "%s", fg_context_last_error(ctx));
    cr_assert_eq(fake_stream_syncs(&last), n + 1, "helper %d waits once", i);
    cr_assert_eq(last, (void *)FG_CU_STREAM_LEGACY, "helper %d waits for the legacy stream", i);
  }
  fg_dev_free(ctx, d);
}

Test(backward_launch, caller_workspace, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 2, 4, 4, 128, 128, 64);
  size_t need = 0;
  const int loads = fake_module_loads();
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK, "%s",
               fg_context_last_error(ctx));
  cr_assert_eq(need, ws_bytes(2, 4, 128, 64));
  cr_assert_eq(fake_module_loads(), loads, "the size comes from the plan, no kernel is loaded");
  /* One byte short: refused before anything is launched, naming the field. */
  a.workspace = P(BASE(10));
  a.workspace_size = need - 1;
  fg_status s = fg_attention_backward(ctx, &a, NULL);
  const char *msg = fg_context_last_error(ctx);
  cr_assert_eq(s, FG_ERROR_INVALID_ARGUMENT, "%s: %s", fg_status_string(s), msg);
  cr_assert(strstr(msg, "args->workspace_size") && strstr(msg, "fg_attention_backward_workspace_size"),
            "%s", msg);
  char num[32];
  snprintf(num, sizeof num, "%zu", need);
  cr_assert(strstr(msg, num), "the message says how much is needed (%s): %s", num, msg);
  cr_assert_eq(fake_launch_count(), 0, "nothing may be launched");
  cr_assert_eq(fake_module_loads(), loads, "nor loaded");
  /* Exactly enough: used as given, nothing allocated. */
  a.workspace_size = need;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(launch(i)->params.workspace, (unsigned long long)BASE(10));
  int allocs, frees;
  size_t bytes;
  fake_mem_counts(&allocs, &frees, &bytes);
  cr_assert_eq(allocs, 0, "the caller's workspace is used, not a new one");
  cr_assert_eq(frees, 0);
}

Test(backward_launch, workspace_size_is_d_plus_one_floats_per_row, .init = fake_setup,
     .fini = fake_teardown) {
  const int64_t shapes[][5] = {/* B, Hq, Hkv, Nq, d */
                               {1, 1, 1, 1, 32},    {2, 4, 2, 100, 64}, {3, 8, 1, 17, 128},
                               {1, 2, 2, 4096, 256}, {20000, 4, 2, 64, 64}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t *x = shapes[i];
    fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 0, x[0], x[1], x[2], x[3], 7, x[4]);
    a.q = a.k = a.v = a.o = a.d_o = NULL; /* only the shapes matter */
    a.lse = NULL;
    a.dq = a.dk = a.dv = NULL;
    size_t b = 1;
    cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &b), FG_OK, "%s",
                 fg_context_last_error(ctx));
    cr_assert_eq(b, ws_bytes(x[0], x[1], x[3], x[4]), "shape %zu: %zu bytes", i, b);
  }
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 0, 0, 4, 2, 100, 7, 64);
  size_t b = 1;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &b), FG_OK);
  cr_assert_eq(b, 0, "an empty problem needs no workspace");
  a = bwd_problem(FG_DTYPE_F16, 0, 1, 6, 4, 100, 7, 64);
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &b), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_context_last_error(ctx), "args->heads_q = 6"), "%s",
            fg_context_last_error(ctx));
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(fg_attention_backward_workspace_size(NULL, &a, &b), FG_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(fake_launch_count(), 0);
}

/* Checks launch 3c..3c+2 as chunk c: batches [b0, b0 + nb). */
static void expect_chunk(int c, const fg_attention_backward_args *a, int64_t b0, int64_t nb,
                         const char *pre, const char *mn, const char *post, const fg_variant *v,
                         uintptr_t ws) {
  const int64_t Hq = a->heads_q, Hkv = a->heads_kv, Nq = a->seqlen_q, Nk = a->seqlen_k;
  const int64_t d = a->head_dim;
  expect_launch(3 * c, pre, (unsigned)cdiv((uint64_t)Nq, 64), (unsigned)(nb * Hq), 128, 0);
  expect_launch(3 * c + 1, mn, (unsigned)cdiv((uint64_t)Nk, (uint64_t)v->bc),
                (unsigned)(nb * Hkv), (unsigned)v->warps * 32, (unsigned)(70000 + d));
  expect_launch(3 * c + 2, post, (unsigned)cdiv((uint64_t)Nq, 64), (unsigned)(nb * Hq), 128, 0);
  for (int i = 0; i < 3; i++) {
    const fg_bwd_params *p = &launch(3 * c + i)->params;
    cr_assert_eq(p->batch, nb, "chunk %d: batch %lld, want %lld", c, p->batch, (long long)nb);
    /* Contiguous tensors: a batch of Q-shaped tensors is Hq*Nq*d elements, of K-shaped ones
     * Hkv*Nk*d, of LSE Hq*Nq floats; the workspace holds the dQ accumulators of all batches
     * (d floats per row), then D (one float per row). */
    const unsigned long long qb = (unsigned long long)(b0 * Hq * Nq * d * 2);
    const unsigned long long kb = (unsigned long long)(b0 * Hkv * Nk * d * 2);
    cr_assert_eq(p->q, BASE(1) + qb, "chunk %d: q", c);
    cr_assert_eq(p->k, BASE(2) + kb, "chunk %d: k", c);
    cr_assert_eq(p->v, BASE(3) + kb, "chunk %d: v", c);
    cr_assert_eq(p->o, BASE(4) + qb, "chunk %d: o", c);
    cr_assert_eq(p->lse, BASE(5) + (unsigned long long)(b0 * Hq * Nq * 4), "chunk %d: lse", c);
    cr_assert_eq(p->d_o, BASE(6) + qb, "chunk %d: d_o", c);
    cr_assert_eq(p->dq, BASE(7) + qb, "chunk %d: dq", c);
    cr_assert_eq(p->dk, BASE(8) + kb, "chunk %d: dk", c);
    cr_assert_eq(p->dv, BASE(9) + kb, "chunk %d: dv", c);
    cr_assert_eq(p->workspace, ws + (unsigned long long)(b0 * Hq * Nq * d * 4),
                 "chunk %d: workspace", c);
    cr_assert_eq(p->dsum,
                 ws + (unsigned long long)(a->batch * Hq * Nq * d * 4 + b0 * Hq * Nq * 4),
                 "chunk %d: dsum", c);
    cr_assert(p->heads_q == Hq && p->heads_kv == Hkv && p->seqlen_q == Nq && p->seqlen_k == Nk);
  }
}

Test(backward_launch, batch_times_heads_past_the_grid_limit_is_split, .init = fake_setup,
     .fini = fake_teardown) {
  /* B * Hq = 80000 > 65535: chunks of floor(65535 / 4) = 16383 batches. */
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 1, 20000, 4, 2, 64, 48, 64);
  a.workspace = P(BASE(10));
  a.workspace_size = ws_bytes(20000, 4, 64, 64);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 6, "two launches of each kind, got %d launches",
               fake_launch_count());
  expect_chunk(0, &a, 0, 16383, pre, mn, post, &v, BASE(10));
  expect_chunk(1, &a, 16383, 20000 - 16383, pre, mn, post, &v, BASE(10));

  /* Hq = 40000: one batch per launch. */
  fake_reset();
  a = bwd_problem(FG_DTYPE_F16, 0, 3, 40000, 40000, 8, 8, 32);
  a.workspace = P(BASE(10));
  a.workspace_size = ws_bytes(3, 40000, 8, 32);
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 9);
  for (int c = 0; c < 3; c++) expect_chunk(c, &a, c, 1, pre, mn, post, &v, BASE(10));
}

/* Every chunk's workspace must start on a 16-byte boundary: the _pre and _post kernels
 * (templates/bwd.cu) access the dQ accumulator with 16-byte vector loads and stores. With a
 * chunk offset of b0 * Hq * Nq * (d + 1) * 4 bytes (the first layout: accumulator and D per
 * chunk), an odd Hq * Nq * b0 gave 4 or 12 mod 16 (here 65535 * 33 * 4 = 12 mod 16). */
Test(backward_launch, every_chunk_workspace_is_16_byte_aligned, .init = fake_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 0, 70000, 1, 1, 1, 8, 32);
  a.workspace = P(BASE(10));
  a.workspace_size = ws_bytes(70000, 1, 1, 32);
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 6);
  for (int i = 0; i < 6; i++)
    cr_assert_eq(launch(i)->params.workspace % 16, 0,
                 "launch %d (%s): workspace 0x%llx is not 16-byte aligned", i, launch(i)->entry,
                 launch(i)->params.workspace);
}

Test(backward_launch, seqlen_k_zero_skips_the_main_kernel, .init = fake_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 2, 4, 2, 70, 0, 64);
  a.k = a.v = NULL;
  a.dk = a.dv = NULL;
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  /* dQ is still zeroed and converted: _pre and _post run, the main kernel does not. */
  cr_assert_eq(fake_launch_count(), 2);
  expect_launch(0, pre, 2, 8, 128, 0);
  expect_launch(1, post, 2, 8, 128, 0);
}

Test(backward_launch, empty_problems_launch_nothing, .init = fake_setup, .fini = fake_teardown) {
  for (int w = 0; w < 3; w++) {
    fg_attention_backward_args a =
        bwd_problem(FG_DTYPE_BF16, 0, w == 0 ? 0 : 2, w == 1 ? 0 : 4, 2, w == 2 ? 0 : 64, 64, 64);
    a.q = a.k = a.v = a.o = a.d_o = NULL;
    a.lse = NULL;
    a.dq = a.dk = a.dv = NULL;
    cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  }
  cr_assert_eq(fake_launch_count(), 0);
  int allocs, frees;
  size_t bytes;
  fake_mem_counts(&allocs, &frees, &bytes);
  cr_assert_eq(allocs, 0);
}

Test(backward_launch, invalid_calls_launch_nothing, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 2, 4, 2, 64, 64, 64);
  a.dq = (void *)(uintptr_t)a.q;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_context_last_error(ctx), "args->dq and args->q overlap"), "%s",
            fg_context_last_error(ctx));
  a = bwd_problem(FG_DTYPE_BF16, 0, 2, 4, 2, 64, 64, 64);
  cr_assert_eq(fg_attention_backward(ctx, NULL, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_context_last_error(ctx), "args is NULL"), "%s", fg_context_last_error(ctx));
  cr_assert_eq(fg_attention_backward(NULL, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  /* A forced variant of another head_dim does not serve the problem. */
  a.deterministic = 0;
  const fg_variant v = fg_builtin_backward_variant(128, FG_DTYPE_BF16, 0, FG_ARCH_SM90A);
  cr_assert_eq(fg_attention_backward_variant(ctx, &a, NULL, &v), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_context_last_error(ctx), "does not serve this backward problem"), "%s",
            fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 0);
  /* After all that, a good call still works. */
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  cr_assert_str_empty(fg_context_last_error(ctx));
}

/* Deterministic mode: 4 more workspace bytes per 16 query rows of each (batch, query head),
 * after D; every launch of the plan gets the flag and its chunk's semaphores. */
Test(backward_launch, deterministic_semaphores_follow_d, .init = fake_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 1, 3, 4, 2, 100, 130, 64);
  size_t plain = 0, det = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &plain), FG_OK);
  a.deterministic = 1;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &det), FG_OK);
  cr_assert_eq(plain, ws_bytes(3, 4, 100, 64));
  cr_assert_eq(det, plain + (size_t)(3 * 4 * ((100 + 15) / 16) * 4), "%zu", det);
  a.workspace = P(BASE(10));
  a.workspace_size = det;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  for (int i = 0; i < 3; i++) {
    const fg_bwd_params *p = &launch(i)->params;
    cr_assert_eq(p->deterministic, 1, "launch %d", i);
    cr_assert_eq(p->sem, BASE(10) + (unsigned long long)(3 * 4 * 100 * 64 * 4 + 3 * 4 * 100 * 4),
                 "launch %d: semaphores right after D", i);
  }
  a.workspace_size = det - 4;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert(strstr(fg_context_last_error(ctx), "args->workspace_size"), "%s",
            fg_context_last_error(ctx));
}

/* Long query ranges (templates/bwd.lua's SPLIT_ROWS, dkv_accum): past 65536 query rows per KV
 * head (seqlen_q * Hq / Hkv) the main kernel's grid gets z = ceil(rows / 65536) splits, and the
 * splits' fp32 dK/dV sums go to dkv_accum: per key block of Bc rows of each (batch, KV head), 2 Bc
 * d floats and a 16-byte semaphore slot, placed right after the dQ accumulator (16-byte aligned);
 * p.dkv is 0 and z is 1 otherwise. GQA 4: Nq = 16384 is at the threshold, 16385 past it. */
static size_t dkv_bytes(int64_t B, int64_t Hkv, int64_t Nk, int64_t bc, int64_t d) {
  return (size_t)(B * Hkv * (int64_t)cdiv((uint64_t)Nk, (uint64_t)bc) * 4 * (2 * bc * d + 4));
}

Test(backward_launch, dkv_partial_sums_and_splits_only_past_the_threshold, .init = fake_setup,
     .fini = fake_teardown) {
  char pre[128], mn[128], post[128];
  fg_variant v;
  for (int det = 0; det < 2; det++)
    for (int causal = 0; causal < 2; causal++)
      for (int64_t Nq = 16384; Nq <= 16385; Nq++) {
        fake_reset();
        fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, causal, 3, 8, 2, Nq, 300, 64);
        a.deterministic = det;
        entries(&a, pre, mn, post, &v);
        const int past = Nq == 16385;
        const size_t sems = det ? (size_t)(3 * 8 * cdiv((uint64_t)Nq, 16) * 4) : 0;
        const size_t dq = (size_t)(3 * 8 * Nq * 64 * 4), dkv = past ? dkv_bytes(3, 2, 300, v.bc, 64) : 0;
        const size_t want = ws_bytes(3, 8, Nq, 64) + sems + dkv;
        size_t need = 0;
        cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK, "%s",
                     fg_context_last_error(ctx));
        cr_assert_eq(need, want, "Nq %lld, deterministic %d: %zu bytes, want %zu", (long long)Nq,
                     det, need, want);
        a.workspace = P(BASE(10));
        a.workspace_size = need;
        cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s",
                     fg_context_last_error(ctx));
        cr_assert_eq(fake_launch_count(), 3);
        for (int i = 0; i < 3; i++) {
          const fake_launch *l = launch(i);
          const fg_bwd_params *p = &l->params;
          cr_assert_eq(p->dkv, past ? BASE(10) + dq : 0,
                       "Nq %lld, deterministic %d, launch %d: dkv 0x%llx", (long long)Nq, det, i,
                       p->dkv);
          cr_assert_eq(p->dkv % 16, 0);
          cr_assert_eq(p->workspace, BASE(10));
          cr_assert_eq(p->dsum, BASE(10) + dq + dkv);
          /* 8 * 16385 / 2 = 65540 rows per KV head: two splits of the main kernel only. */
          cr_assert_eq(l->grid[2], i == 1 && past ? 2u : 1u, "launch %d: grid z %u", i, l->grid[2]);
        }
        cr_assert_eq(launch(1)->grid[0], (unsigned)cdiv(300, (uint64_t)v.bc));
        cr_assert_eq(launch(1)->grid[1], 3u * 2);
        /* Allocated for the call: the same bytes. */
        fake_reset();
        a.workspace = NULL;
        a.workspace_size = 0;
        cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s",
                     fg_context_last_error(ctx));
        int allocs, frees;
        size_t bytes;
        fake_mem_counts(&allocs, &frees, &bytes);
        cr_assert(allocs == 1 && bytes == want, "%d allocations, %zu bytes (want %zu)", allocs,
                  bytes, want);
        cr_assert_eq(launch(1)->params.dkv != 0, past);
      }
  /* MQA: the group is all of Hq (8 * 8193 = 65544 > 65536: 2 splits); Hkv = Hq: no group (8 *
   * 16385 rows are spread over 8 K/V heads: no split). */
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 1, 8, 1, 8193, 300, 64);
  entries(&a, pre, mn, post, &v);
  size_t need = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK);
  cr_assert_eq(need, ws_bytes(1, 8, 8193, 64) + dkv_bytes(1, 1, 300, v.bc, 64));
  fake_reset();
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(launch(1)->grid[2], 2u);
  a = bwd_problem(FG_DTYPE_BF16, 0, 1, 8, 8, 16385, 300, 64);
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK);
  cr_assert_eq(need, ws_bytes(1, 8, 16385, 64));
  fake_reset();
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(launch(1)->grid[2], 1u);
  /* check bwd/big's shape: 2^31 / 128 + 4097 rows, one head: ceil(16781313 / 65536) = 257. */
  a = bwd_problem(FG_DTYPE_BF16, 0, 1, 1, 1, 16781313, 64, 128);
  a.q = a.k = a.v = a.o = a.d_o = NULL;
  a.lse = NULL;
  a.dq = a.dk = a.dv = NULL;
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK);
  cr_assert_eq(need, ws_bytes(1, 1, 16781313, 128) + dkv_bytes(1, 1, 64, v.bc, 128));
}

/* The splits of the query range (fg_plan_step_splits, from the plan's main step): ceil(rows per
 * KV head / split_rows), capped at the grid's z limit (65535); 1 for a step that never splits. */
Test(backward_launch, splits_of_the_query_range) {
  fg_kernel_meta m;
  test_backward_plan(&m, "k", 64, 128, 256, 1000);
  const fg_plan_step *s = fg_kernel_main(&m);
  cr_assert_eq(s->split_rows, 65536);
  cr_assert_eq(fg_plan_step_splits(s, 1, 1, 65536), 1u);
  cr_assert_eq(fg_plan_step_splits(s, 1, 1, 65537), 2u);
  cr_assert_eq(fg_plan_step_splits(s, 8, 1, 8192), 1u);              /* MQA, at the threshold */
  cr_assert_eq(fg_plan_step_splits(s, 8, 1, 8193), 2u);
  cr_assert_eq(fg_plan_step_splits(s, 8, 8, 1 << 20), 16u);          /* no group: Nq only */
  cr_assert_eq(fg_plan_step_splits(s, 1, 1, 16781313), 257u);        /* check bwd/big */
  cr_assert_eq(fg_plan_step_splits(s, 64, 1, (int64_t)1 << 27), 65535u); /* 2^33 rows: capped */
  cr_assert_eq(fg_plan_step_splits(s, 64, 1, INT64_MAX), 65535u);    /* saturates */
  cr_assert_eq(fg_plan_step_splits(&m.steps[0], 1, 1, 1 << 30), 1u); /* _pre never splits */
  uint64_t g[3];
  fg_plan_grid(s, 132, 3, 16, 2, 100000, 1000, g);
  cr_assert(g[0] == 8 && g[1] == 6 && g[2] == 13, "grid %llu %llu %llu", (unsigned long long)g[0],
            (unsigned long long)g[1], (unsigned long long)g[2]);
  fg_plan_grid(&m.steps[2], 132, 3, 16, 2, 100000, 1000, g);
  cr_assert(g[0] == 1563 && g[1] == 48 && g[2] == 1);
}

/* Split along the batch past the grid's y limit, each chunk's p.dkv starts at its first batch's
 * partial sums: b0 * Hkv * ceil(Nk / Bc) * (2 Bc d + 4) * 4 bytes in, after the dQ accumulators
 * of all batches; D after the partial sums of all batches. Tensors 2^42 bytes apart (these are
 * larger than BASE's spacing). */
Test(backward_launch, dkv_partial_sums_follow_the_batch_split, .init = fake_setup,
     .fini = fake_teardown) {
  /* B * Hq = 80000 > 65535: chunks of 32767 batches; Nq * Hq / Hkv = 65538: 2 splits. */
  const int64_t B = 40000, Hq = 2, Hkv = 1, Nq = 32769, Nk = 100, d = 32;
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 0, B, Hq, Hkv, Nq, Nk, d);
  const void **in[6] = {&a.q, &a.k, &a.v, &a.o, (const void **)&a.lse, &a.d_o};
  void **out[3] = {&a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 6; i++) *in[i] = P((uintptr_t)(i + 1) << 42);
  for (int i = 0; i < 3; i++) *out[i] = P((uintptr_t)(i + 7) << 42);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  const uintptr_t ws = (uintptr_t)10 << 42;
  const size_t dq = (size_t)(B * Hq * Nq * d * 4), per_batch = dkv_bytes(1, Hkv, Nk, v.bc, d);
  size_t need = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK, "%s",
               fg_context_last_error(ctx));
  cr_assert_eq(need, ws_bytes(B, Hq, Nq, d) + (size_t)B * per_batch);
  a.workspace = P(ws);
  a.workspace_size = need;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 6, "%d launches", fake_launch_count());
  for (int c = 0; c < 2; c++) {
    const int64_t b0 = c * 32767;
    for (int i = 0; i < 3; i++) {
      const fake_launch *l = launch(3 * c + i);
      const fg_bwd_params *p = &l->params;
      cr_assert_eq(p->batch, c == 0 ? 32767 : B - 32767);
      cr_assert_eq(p->dkv, ws + dq + (uint64_t)b0 * per_batch, "chunk %d, launch %d: dkv 0x%llx",
                   c, i, p->dkv);
      cr_assert_eq(p->workspace, ws + (uint64_t)(b0 * Hq * Nq * d * 4), "chunk %d", c);
      cr_assert_eq(p->dsum, ws + dq + (uint64_t)B * per_batch + (uint64_t)(b0 * Hq * Nq * 4));
      cr_assert_eq(l->grid[2], i == 1 ? 2u : 1u);
    }
  }
}

/* The runtime runs the kernel's plan as data: another plan (auxiliary kernels of 32 rows and 64
 * threads, shared memory for the last, semaphores per 32 rows, and then two steps only) changes
 * the launches, the workspace size and the workspaces' places, with no constant of its own. */
Test(backward_launch, the_plan_is_data, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 2, 4, 2, 100, 130, 64);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  fg_kernel_meta *m = NULL;
  for (int i = 0; i < N_IMAGES; i++)
    if (strcmp(images[i].variant, mn + 3) == 0) m = &images[i].meta;
  cr_assert_not_null(m, "no image of %s", mn + 3);
  /* Before the first call: the registry loads the image from the table lazily. */
  m->steps[0].br = m->steps[2].br = 32;
  m->steps[0].threads = m->steps[2].threads = 64;
  m->steps[2].smem_bytes = 1024;
  m->workspaces[3].rows = 32; /* the semaphores */
  a.deterministic = 1;
  size_t need = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK, "%s",
               fg_context_last_error(ctx));
  const size_t acc = 2 * 4 * 100 * 64 * 4, dsum = 2 * 4 * 100 * 4, sems = 2 * 4 * 4 * 4;
  cr_assert_eq(need, acc + dsum + sems, "%zu bytes", need);
  a.workspace = P(BASE(10));
  a.workspace_size = need;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  expect_launch(0, pre, 4, 2 * 4, 64, 0);
  expect_launch(1, mn, (unsigned)cdiv(130, (uint64_t)v.bc), 2 * 2, (unsigned)v.warps * 32,
                70000 + 64);
  expect_launch(2, post, 4, 2 * 4, 64, 1024);
  const fg_bwd_params *p = &launch(1)->params;
  cr_assert_eq(p->workspace, BASE(10));
  cr_assert_eq(p->dsum, BASE(10) + acc);
  cr_assert_eq(p->sem, BASE(10) + acc + dsum);
  /* Not deterministic: the semaphores are not part of the workspace, and not passed. */
  fake_reset();
  a.deterministic = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK);
  cr_assert_eq(need, acc + dsum);
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(launch(0)->params.sem, 0);
  cr_assert_eq(launch(0)->params.dsum, BASE(10) + acc);
}

/* A plan of two steps launches two kernels, in its order. The registry reads the plan when it
 * loads the kernel, so this test changes it before the first call. */
Test(backward_launch, a_plan_of_two_steps_launches_two, .init = fake_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 1, 1, 2, 1, 64, 64, 32);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  fg_kernel_meta *m = NULL;
  for (int i = 0; i < N_IMAGES; i++)
    if (strcmp(images[i].variant, mn + 3) == 0) m = &images[i].meta;
  cr_assert_not_null(m);
  /* The main kernel first, then _pre: the runtime follows the plan, whatever it says. */
  const fg_plan_step s0 = m->steps[0];
  m->steps[0] = m->steps[1];
  m->steps[1] = s0;
  m->main_step = 0;
  m->n_steps = 2;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 2);
  expect_launch(0, mn, (unsigned)cdiv(64, (uint64_t)v.bc), 1, (unsigned)v.warps * 32, 70000 + 32);
  expect_launch(1, pre, 1, 2, 128, 0);
}

/* A plan whose workspace goes to a parameter the backward block lacks is refused, naming it. */
Test(backward_launch, a_workspace_for_an_unknown_parameter_is_refused, .init = fake_setup,
     .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_F16, 0, 1, 2, 1, 64, 64, 32);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  for (int i = 0; i < N_IMAGES; i++)
    if (strcmp(images[i].variant, mn + 3) == 0)
      snprintf(images[i].meta.workspaces[1].param, sizeof images[i].meta.workspaces[1].param,
               "dsum2");
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_ERROR_INTERNAL);
  cr_assert(strstr(fg_context_last_error(ctx), "'dsum2'") &&
                strstr(fg_context_last_error(ctx), "rebuild"),
            "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 0);
}

/* The tail (core/fg_tail.h): the fake H100's 132 SMs hold 3 blocks of the d = 32 kernel (70032
 * bytes of shared memory each, 256 threads), 396 at once; 50 heads of 8 key blocks are 400
 * blocks, so the last 4 are split, each into 8 pieces of one 128-row query block (1024 rows, at
 * least 128 per piece): 396 + 32 pieces in rows of 8 blocks, grid y 54. Their partial sums go to
 * dkv_tail, between the dQ accumulator and D; deterministic calls and whole waves run without. */
Test(backward_launch, the_tail_of_a_partial_last_wave, .init = fake_setup, .fini = fake_teardown) {
  fg_attention_backward_args a = bwd_problem(FG_DTYPE_BF16, 0, 1, 50, 50, 1024, 1024, 32);
  char pre[128], mn[128], post[128];
  fg_variant v;
  entries(&a, pre, mn, post, &v);
  cr_assert_eq(v.bc, 128);
  const size_t dq = (size_t)50 * 1024 * 32 * 4, tail = 4 * (size_t)(4 * (2 * 128 * 32 + 4));
  size_t need = 0;
  cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK, "%s",
               fg_context_last_error(ctx));
  cr_assert_eq(need, ws_bytes(1, 50, 1024, 32) + tail, "%zu bytes", need);
  a.workspace = P(BASE(10));
  a.workspace_size = need - 1;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(fake_launch_count(), 0, "nothing may be launched");
  a.workspace_size = need;
  cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
  cr_assert_eq(fake_launch_count(), 3);
  for (int i = 0; i < 3; i++) {
    const fg_bwd_params *p = &launch(i)->params;
    cr_assert(p->tail_first == 396 && p->tail_blocks == 4 && p->tail_splits == 8,
              "launch %d: tail %lld %lld %lld", i, p->tail_first, p->tail_blocks, p->tail_splits);
    cr_assert_eq(p->dkv_tail, BASE(10) + dq, "launch %d: dkv_tail 0x%llx", i, p->dkv_tail);
    cr_assert_eq(p->dsum, BASE(10) + dq + tail);
    cr_assert_eq(p->dkv, 0);
  }
  cr_assert_eq(launch(1)->grid[0], 8u);
  cr_assert_eq(launch(1)->grid[1], 54u, "grid y %u", launch(1)->grid[1]);
  cr_assert_eq(launch(0)->grid[1], 50u, "_pre keeps its grid");
  char text[8192];
  cr_assert_eq(fg_explain_backward(ctx, &a, text, sizeof text), FG_OK);
  cr_assert_not_null(strstr(text, "tail: the last 4 of its 400 blocks"), "%s", text);
  cr_assert_not_null(strstr(text, "split into 8 pieces"), "%s", text);
  /* No tail: deterministic (the pieces' additions would not be ordered), 396 blocks (whole
   * waves). */
  for (int w = 0; w < 2; w++) {
    fake_reset();
    a = bwd_problem(FG_DTYPE_BF16, 0, 1, w ? 50 : 99, w ? 50 : 99, w ? 1024 : 512, w ? 1024 : 512, 32);
    a.deterministic = w;
    cr_assert_eq(fg_attention_backward_workspace_size(ctx, &a, &need), FG_OK);
    cr_assert_eq(fg_attention_backward(ctx, &a, NULL), FG_OK, "%s", fg_context_last_error(ctx));
    const fg_bwd_params *p = &launch(1)->params;
    cr_assert(p->tail_splits == 0 && p->dkv_tail == 0, "case %d: tail %lld", w, p->tail_splits);
    cr_assert_eq(launch(1)->grid[1], w ? 50u : 99u);
  }
}
