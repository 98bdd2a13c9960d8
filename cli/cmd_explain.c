/* cmd_explain.c: `flashgen explain [--backward]`: parses a problem from the command line and
 * prints what fg_explain (or fg_explain_backward) says: the key, the tuning record or rule, the
 * variant, where its binary comes from and the launch shape (the backward: its plan's three
 * launches and workspace). Compiles and launches nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_cli.h"
#include "fg_runtime_internal.h"

static void explain_usage(FILE *f) {
  fprintf(f,
          "usage: flashgen explain [options]\n\n"
          "Says which kernel fg_attention_forward (with --backward: which plan\n"
          "fg_attention_backward) would run for a problem, and why: the key, the record or\n"
          "rule, the variant, where its binary comes from, the launch (and the tensor maps of a\n"
          "TMA kernel).\n\n"
          "  --backward       the backward pass (dQ, dK, dV): key bwd_..., its plan's launches\n"
          "                   (and the tensor maps each is passed, for a kvtma plan)\n"
          "  --d N            head dimension (32..256, multiple of 8; default 128)\n"
          "  --dtype T        f16 or bf16 (default bf16)\n"
          "  --causal         causal masking (bottom-right aligned when nq != nk)\n"
          "  --nq N           query length (default 4096)\n"
          "  --nk N           key length (default: nq)\n"
          "  --batch N        batch size (default 1)\n"
          "  --heads N        query heads (default 16)\n"
          "  --heads-kv N     key/value heads (default: heads)\n"
          "  --scale X        softmax scale (default 1/sqrt(d))\n"
          "  --lse            the call also writes the log-sum-exp (forward)\n"
          "  --device N       CUDA device (default 0)\n"
          "  --policy P       jit, exported-and-cache or exported-only (default jit)\n"
          "  --no-disk-cache  do not use the kernel cache\n");
}

static int parse_i64(const char *opt, const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) {
    fprintf(stderr, "flashgen explain: %s expects an integer, got '%s'\n", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

int fg_cmd_explain(int argc, char **argv) {
  fg_attention_args a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.dtype = FG_DTYPE_BF16;
  a.head_dim = 128;
  a.batch = 1;
  a.heads_q = 16;
  a.heads_kv = -1;
  a.seqlen_q = 4096;
  a.seqlen_k = -1;
  int64_t device = 0;
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.policy = FG_POLICY_DEFAULT;
  int want_lse = 0, backward = 0;
  for (int i = 1; i < argc; i++) {
    const char *opt = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t x;
    if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
      explain_usage(stdout);
      return 0;
    } else if (!strcmp(opt, "--causal")) {
      a.causal = 1;
    } else if (!strcmp(opt, "--backward") || !strcmp(opt, "--bwd")) {
      backward = 1;
    } else if (!strcmp(opt, "--lse")) {
      want_lse = 1;
    } else if (!strcmp(opt, "--no-disk-cache")) {
      o.no_disk_cache = 1;
    } else if (!val) {
      fprintf(stderr, "flashgen explain: unknown option or missing value: %s\n\n", opt);
      explain_usage(stderr);
      return 2;
    } else if (!strcmp(opt, "--dtype")) {
      if (fg_dtype_parse(val, &a.dtype) != 0) {
        fprintf(stderr, "flashgen explain: --dtype expects f16 or bf16, got '%s'\n", val);
        return 2;
      }
      i++;
    } else if (!strcmp(opt, "--policy")) {
      if (!strcmp(val, "jit")) o.policy = FG_POLICY_JIT;
      else if (!strcmp(val, "exported-and-cache")) o.policy = FG_POLICY_EXPORTED_AND_CACHE;
      else if (!strcmp(val, "exported-only")) o.policy = FG_POLICY_EXPORTED_ONLY;
      else {
        fprintf(stderr,
                "flashgen explain: --policy expects jit, exported-and-cache or exported-only, "
                "got '%s'\n",
                val);
        return 2;
      }
      i++;
    } else if (!strcmp(opt, "--scale")) {
      char *end;
      a.scale = strtof(val, &end);
      if (end == val || *end) {
        fprintf(stderr, "flashgen explain: --scale expects a number, got '%s'\n", val);
        return 2;
      }
      i++;
    } else {
      int64_t *dst = !strcmp(opt, "--d") || !strcmp(opt, "--head-dim") ? &a.head_dim
                     : !strcmp(opt, "--nq")                             ? &a.seqlen_q
                     : !strcmp(opt, "--nk")                             ? &a.seqlen_k
                     : !strcmp(opt, "--batch")                          ? &a.batch
                     : !strcmp(opt, "--heads")                          ? &a.heads_q
                     : !strcmp(opt, "--heads-kv")                       ? &a.heads_kv
                     : !strcmp(opt, "--device")                         ? &device
                                                                        : NULL;
      if (!dst) {
        fprintf(stderr, "flashgen explain: unknown option: %s\n\n", opt);
        explain_usage(stderr);
        return 2;
      }
      if (parse_i64(opt, val, &x) != 0) return 2;
      *dst = x;
      i++;
    }
  }
  if (a.heads_kv < 0) a.heads_kv = a.heads_q;
  if (a.seqlen_k < 0) a.seqlen_k = a.seqlen_q;
  /* fg_explain checks alignment of pointers it is given; a placeholder marks that LSE is wanted
   * without pointing anywhere real (it is never dereferenced). */
  static _Alignas(16) float lse_marker[4];
  if (want_lse) a.lse = lse_marker;
  o.device = (int)device;

  fg_context *ctx;
  fg_status st = fg_context_create(&ctx, &o);
  if (st != FG_OK) {
    fprintf(stderr, "flashgen explain: %s: %s\n", fg_status_string(st), fg_last_create_error());
    return 1;
  }
  char buf[8192];
  if (backward) {
    /* The backward call of the same problem: the forward's shapes, scale and masking. */
    fg_attention_backward_args b;
    memset(&b, 0, sizeof b);
    b.size = sizeof b;
    b.dtype = a.dtype;
    b.causal = a.causal;
    b.batch = a.batch;
    b.heads_q = a.heads_q;
    b.heads_kv = a.heads_kv;
    b.seqlen_q = a.seqlen_q;
    b.seqlen_k = a.seqlen_k;
    b.head_dim = a.head_dim;
    b.scale = a.scale;
    st = fg_explain_backward(ctx, &b, buf, sizeof buf);
  } else {
    st = fg_explain(ctx, &a, buf, sizeof buf);
  }
  fputs(buf, stdout);
  if (st != FG_OK)
    fprintf(stderr, "flashgen explain: %s: %s\n", fg_status_string(st), fg_context_last_error(ctx));
  fg_context_destroy(ctx);
  return st == FG_OK ? 0 : 1;
}
