/* test_cli_inputs.c: the command line's smaller input cases (issue 11, item 9): empty --arch
 * lists and elements are refused, `compile -o` writes a cubin whole or not at all, and
 * `export --variants` refuses a file that is not a short text list (/dev/zero) at once. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_runner.h"
#include "fg_gen.h"

static char tmp_dir[64];

static void make_tmp(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/fg_cli_inputs_XXXXXX");
  cr_assert(mkdtemp(tmp_dir) != NULL);
}

static void remove_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

/* The names in tmp_dir, sorted, joined by spaces. */
static void list_dir(char *buf, size_t len) {
  struct dirent **ents;
  int n = scandir(tmp_dir, &ents, NULL, alphasort);
  cr_assert_geq(n, 0);
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (strcmp(ents[i]->d_name, ".") && strcmp(ents[i]->d_name, ".."))
      snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? " " : "", ents[i]->d_name);
    free(ents[i]);
  }
  free(ents);
}

Test(cli_inputs, build_default_refuses_an_empty_arch_list) {
  /* Each of these built nothing (or less than asked) and exited 0 before. */
  static const struct { const char *arg, *says; } cases[] = {
      {"','", "--arch ',': element 1 is empty"},
      {"''", "--arch names no arch"},
      {"' , '", "element 1 is empty"},
      {"sm_80,,sm_90a", "--arch 'sm_80,,sm_90a': element 2 is empty"},
      {"sm_80,", "--arch 'sm_80,': element 2 is empty"},
      {",sm_90a", "element 1 is empty"},
      {"sm_80,sm_75", "unknown arch 'sm_75'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char args[128];
    snprintf(args, sizeof args, "build-default -j 1 --arch %s", cases[i].arg);
    int rc = fg_test_run_cli(NULL, NULL, args);
    cr_assert_eq(rc, 2, "%s: exit %d\nstdout: %s\nstderr: %s", args, rc, fg_test_out, fg_test_err);
    cr_assert(strstr(fg_test_err, cases[i].says), "%s: %s", args, fg_test_err);
    cr_assert(strstr(fg_test_err, "sm_80, sm_86, sm_89, sm_90, sm_90a"), "%s", fg_test_err);
    cr_assert_eq(fg_test_out[0], '\0', "%s printed: %s", args, fg_test_out);
  }
}

Test(cli_inputs, export_refuses_an_empty_arch_element, .init = make_tmp, .fini = remove_tmp) {
  char args[512];
  snprintf(args, sizeof args, "export --arch sm_80,,sm_90a --variants '%s/none' -o '%s/out'",
           tmp_dir, tmp_dir);
  int rc = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "--arch 'sm_80,,sm_90a': element 2 is empty"), "%s", fg_test_err);
  rc = fg_test_run_cli(NULL, NULL, "export --arch , --default -o /nonexistent/out");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "--arch ','"), "%s", fg_test_err);
}

#define SMALL "fwd_d64_br64_bc64_f16_noncausal_qouter_w4_s2_sm80"

static void need_nvrtc(void) {
  char err[1024];
  if (fg_nvrtc_load(err, sizeof err) != 0) cr_skip_test("no NVRTC: %s", err);
}

/* A write that fails half-way (here a file size limit of a few KiB, with SIGXFSZ ignored so the
 * write returns EFBIG, as on a full disk) leaves neither a truncated cubin nor a temporary file,
 * and an older cubin of that name intact. */
Test(cli_inputs, compile_writes_the_cubin_whole_or_not_at_all, .init = make_tmp,
     .fini = remove_tmp, .timeout = 300) {
  need_nvrtc();
  static const char limited[] = "trap '' XFSZ; ulimit -f 4; FLASHGEN_CACHE_DIR=cache";
  char files[1024];
  int rc = fg_test_run_cli(tmp_dir, limited, "compile " SMALL " -o k.cubin");
  cr_assert_eq(rc, 1, "exit %d\nstdout: %s\nstderr: %s", rc, fg_test_out, fg_test_err);
  list_dir(files, sizeof files);
  cr_assert(strstr(files, "k.cubin") == NULL && strstr(files, "tmp") == NULL,
            "a failed write left files behind: %s", files);
  cr_assert(strstr(fg_test_err, "cannot write k.cubin"), "%s", fg_test_err);
  cr_assert(strstr(fg_test_err, "neither created nor changed"), "%s", fg_test_err);

  char path[256], got[64];
  snprintf(path, sizeof path, "%s/k.cubin", tmp_dir);
  FILE *f = fopen(path, "w");
  cr_assert(f != NULL);
  fputs("an older cubin\n", f);
  fclose(f);
  rc = fg_test_run_cli(tmp_dir, limited, "compile " SMALL " -o k.cubin");
  cr_assert_eq(rc, 1, "exit %d: %s", rc, fg_test_err);
  fg_test_slurp(path, got, sizeof got);
  cr_assert_str_eq(got, "an older cubin\n", "the older file was changed");
  list_dir(files, sizeof files);
  cr_assert(strstr(files, "tmp") == NULL, "a failed write left a temporary file: %s", files);

  /* Without the limit: written whole, mode 0666 less the umask, nothing else left. */
  rc = fg_test_run_cli(tmp_dir, "umask 022; FLASHGEN_CACHE_DIR=cache", "compile " SMALL " -o k.cubin");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_gt(st.st_size, 4096, "k.cubin is %lld bytes", (long long)st.st_size);
  cr_assert(strstr(fg_test_out, "wrote k.cubin"), "%s", fg_test_out);
  char wrote[64];
  snprintf(wrote, sizeof wrote, "(%lld bytes)", (long long)st.st_size);
  cr_assert(strstr(fg_test_out, wrote), "printed size differs from the file's: %s", fg_test_out);
  cr_assert_eq(st.st_mode & 0777, 0644, "mode %o", (unsigned)(st.st_mode & 0777));
  list_dir(files, sizeof files);
  cr_assert(strstr(files, "tmp") == NULL, "a temporary file was left: %s", files);
}

Test(cli_inputs, compile_into_a_missing_directory_says_so, .init = make_tmp, .fini = remove_tmp,
     .timeout = 300) {
  need_nvrtc();
  int rc = fg_test_run_cli(tmp_dir, "FLASHGEN_CACHE_DIR=cache", "compile " SMALL " -o no/k.cubin");
  cr_assert_eq(rc, 1, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "cannot write no/k.cubin") &&
                strstr(fg_test_err, "No such file or directory"), "%s", fg_test_err);
}

/* /dev/zero never ends: read forever before; now refused at the size limit, naming both. */
Test(cli_inputs, export_refuses_a_variant_list_that_never_ends, .init = make_tmp,
     .fini = remove_tmp, .timeout = 60) {
  char args[512];
  snprintf(args, sizeof args, "export --arch sm_80 --variants /dev/zero -o '%s/out'", tmp_dir);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = fg_test_run_cli(NULL, "timeout 20", args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  cr_assert_neq(rc, 124, "export --variants /dev/zero was still reading after 20 s");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "the variant list /dev/zero is larger than 1048576 bytes (1 MiB)"),
            "%s", fg_test_err);
  cr_assert_lt(s, 10.0, "took %.1f s", s);

  /* A text file just over the limit, and a short one with a NUL byte. */
  char path[256];
  snprintf(path, sizeof path, "%s/big.txt", tmp_dir);
  FILE *f = fopen(path, "w");
  cr_assert(f != NULL);
  for (int i = 0; i < (1 << 20) / 32 + 1; i++) fputs("# a comment of thirty-two bytes\n", f);
  fclose(f);
  snprintf(args, sizeof args, "export --arch sm_80 --variants '%s' -o '%s/out'", path, tmp_dir);
  rc = fg_test_run_cli(NULL, "timeout 20", args);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "larger than 1048576 bytes"), "%s", fg_test_err);

  snprintf(path, sizeof path, "%s/nul.txt", tmp_dir);
  f = fopen(path, "wb");
  cr_assert(f != NULL);
  fwrite(SMALL "\n\0x\n", 1, sizeof SMALL + 3, f);
  fclose(f);
  snprintf(args, sizeof args, "export --arch sm_80 --variants '%s' -o '%s/out'", path, tmp_dir);
  rc = fg_test_run_cli(NULL, NULL, args);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_err, "is not a text file (a NUL byte at offset 50)"), "%s", fg_test_err);
  char files[256];
  list_dir(files, sizeof files);
  cr_assert(strstr(files, "out") == NULL, "export wrote %s", files);
}

/* `flashgen list` lists the backward's variants too: every bwd_ name it prints fits (the built-in
 * one among them), none is of another loop order, and the forward's list is unchanged by it. */
Test(cli_inputs, list_includes_the_backward) {
  int rc = fg_test_run_cli(NULL, NULL, "list --arch sm_90a --filter bwd_d128_ --filter bf16_causal");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_out, "bwd_d128_br64_bc128_bf16_causal_kvouter_w8_s2_sm90a\n"),
            "the built-in backward variant is missing:\n%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "fwd_"), "%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "qouter"), "%s", fg_test_out);
  rc = fg_test_run_cli(NULL, NULL, "list --arch sm_90a --filter fwd_d128_br128_bc64_bf16_causal");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert_null(strstr(fg_test_out, "bwd_"), "%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "_w16_"), "16 warps are a backward-only size: %s", fg_test_out);
}

/* `flashgen check` has the backward's case past 2^31 elements (cli/check_bwd.c, run by
 * check_bwd_big.c): listed without a GPU, non-causal and causal, Q/dQ of more than 2^31
 * elements at d = 128 in bf16 over 64 keys, and left out of --quick (it needs about 24 GiB). */
Test(cli_inputs, check_lists_the_backward_past_2_31_elements) {
  int rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/big/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  const char *want[2] = {"noncausal", "causal"};
  const char *p = fg_test_out;
  for (int i = 0; i < 2; i++) {
    long long nq = 0;
    int d = 0, nk = 0, used = 0;
    char mask[16] = "";
    cr_assert_eq(sscanf(p, "bwd/big/q_over_2^31_elements_d%d_bf16_nq%lld_nk%d_%15[a-z]\n%n", &d,
                        &nq, &nk, mask, &used),
                 4, "line %d of:\n%s", i, fg_test_out);
    cr_assert_eq(d, 128);
    cr_assert_eq(nk, 64);
    cr_assert_str_eq(mask, want[i]);
    cr_assert_eq(nq, (1LL << 31) / 128 + 4097);
    cr_assert_gt(nq * d, 1LL << 31, "Q and dQ hold more than 2^31 elements");
    p += used;
  }
  cr_assert_str_eq(p, "", "only these two cases: %s", fg_test_out);
  rc = fg_test_run_cli(NULL, NULL, "check --list --quick --filter bwd/big/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert_str_eq(fg_test_out, "", "--quick leaves them out: %s", fg_test_out);
}

/* `flashgen check` forces the mma.sync backward at the shapes sm_80 and sm_90 run as built-ins
 * (bwd/portable/, cli/check_bwd.c) beside the Hopper kernels (bwd/hopper/): listed without a GPU
 * as for an sm_90a device, each variant on a ragged GQA shape, a short one and deterministic,
 * both masks, and without a mask on a grid with a tail; and the sm_80 built-ins at d = 64, 128,
 * 192 and 256 are among them. */
Test(cli_inputs, check_lists_the_forced_backward_variants) {
  int rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/portable/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  int n = 0;
  for (const char *p = fg_test_out; (p = strstr(p, "bwd/portable/bwd_")) != NULL; p++) n++;
  cr_assert_eq(n, 6 * (2 * 3 + 1), "six shapes, two masks, three cases each and a tail without one:\n%s",
               fg_test_out);
  cr_assert_null(strstr(fg_test_out, "kvtma"), "%s", fg_test_out);
  static const int pds[] = {64, 128, 192, 256};
  for (size_t di = 0; di < sizeof pds / sizeof pds[0]; di++) {
    const int d = pds[di];
    int found = 0;
    for (int dt = 0; dt < 2; dt++) { /* the cases alternate the dtypes */
      const fg_variant b = fg_builtin_backward_variant(d, dt ? FG_DTYPE_F16 : FG_DTYPE_BF16, 0, FG_ARCH_SM80);
      char name[FG_VARIANT_NAME_MAX];
      fg_variant_name(&b, name, sizeof name);
      char *arch = strstr(name, "_sm80");
      cr_assert_not_null(arch, "%s", name);
      strcpy(arch, "_sm90a"); /* the same kernel, listed for the sm_90a device */
      char nm[FG_VARIANT_NAME_MAX + 64];
      snprintf(nm, sizeof nm, "bwd/portable/%s_gqa_nq300_nk257\n", name);
      found += strstr(fg_test_out, nm) != NULL;
    }
    cr_assert_eq(found, 1, "the sm_80 built-in at d = %d is missing:\n%s", d, fg_test_out);
  }
  rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/hopper/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  n = 0;
  for (const char *p = fg_test_out; (p = strstr(p, "bwd/hopper/bwd_")) != NULL; p++) n++;
  cr_assert_eq(n, 11 * (2 * 3 + 1), "eleven Hopper variants, two masks, three cases each, a tail:\n%s",
               fg_test_out);
  /* ... two of them on tiles padded past the head dim (cli/check_bwd.c), and three above d = 128
   * (bwd_tmat.cu: d = 256, and 200 and 136 on padded tiles) */
  cr_assert(strstr(fg_test_out, "bwd/hopper/bwd_d72_br64_bc128_") && strstr(fg_test_out, "bwd/hopper/bwd_d40_br128_bc128_"),
            "%s", fg_test_out);
  cr_assert(strstr(fg_test_out, "bwd/hopper/bwd_d256_br64_bc64_") && strstr(fg_test_out, "bwd/hopper/bwd_d200_br64_bc64_") &&
                strstr(fg_test_out, "bwd/hopper/bwd_d136_br64_bc64_"),
            "%s", fg_test_out);
}

/* `check --filter A,B` runs the cases whose names contain A or B, in the full run's order (so a
 * failure that needs the cases before it can be repeated with just those): the bwd/big and
 * bwd/bad cases, then the forced Hopper ones, as the full list has them. */
Test(cli_inputs, check_filter_takes_alternatives_in_the_full_order) {
  int rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/hopper/,bwd/big/,bwd/bad/d_o_null");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  const char *big = strstr(fg_test_out, "bwd/big/"), *bad = strstr(fg_test_out, "bwd/bad/d_o_null\n"),
             *hop = strstr(fg_test_out, "bwd/hopper/");
  cr_assert(big && bad && hop && big < bad && bad < hop, "%s", fg_test_out);
  int n = 0;
  for (const char *p = fg_test_out; (p = strchr(p, '\n')) != NULL; p++) n++;
  cr_assert_eq(n, 2 + 1 + 11 * (2 * 3 + 1), "two big, one bad, 77 Hopper cases:\n%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "bwd/bad/lse_null"), "%s", fg_test_out);
  /* An empty alternative selects nothing by itself. */
  rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/bad/d_o_null,");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert_str_eq(fg_test_out, "bwd/bad/d_o_null\n");
}

/* `!S` leaves out the cases whose names contain S: with plain alternatives, from what they
 * select; alone, from every case. */
Test(cli_inputs, check_filter_excludes_with_a_bang) {
  int rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/,!bwd/portable/,!bwd/head_dim/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert(strstr(fg_test_out, "bwd/hopper/") && strstr(fg_test_out, "bwd/big/"), "%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "bwd/portable/"), "%s", fg_test_out);
  cr_assert_null(strstr(fg_test_out, "bwd/head_dim/"), "%s", fg_test_out);
  for (const char *p = fg_test_out; *p; p = strchr(p, '\n') + 1)
    cr_assert(!strncmp(p, "bwd/", 4), "a case outside bwd/: %.60s", p);
  /* Only exclusions: every case but theirs (the forward's included). */
  rc = fg_test_run_cli(NULL, NULL, "check --list --filter !bwd/");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert(fg_test_out[0] && !strstr(fg_test_out, "bwd/"), "%.300s", fg_test_out);
  /* An exclusion wins over a plain alternative that selects the same case. */
  rc = fg_test_run_cli(NULL, NULL, "check --list --filter bwd/bad/d_o_null,!d_o_null");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, fg_test_err);
  cr_assert_str_eq(fg_test_out, "");
}
