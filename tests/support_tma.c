/* support_tma.c: the helpers of tma_support.h (linked into every test; used by test_tma.c and
 * test_tma_bwd.c). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_runner.h"
#include "fg_gen.h"
#include "tma_support.h"

void fgt_template_dir(char dir[64], const char *tmpl, const char *file, const char *from,
                      const char *to) {
  cr_assert_lt(strlen(tmpl), 64, "directory template too long: %s", tmpl);
  strcpy(dir, tmpl);
  cr_assert_not_null(mkdtemp(dir));
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  char tdir[1024];
  snprintf(tdir, sizeof tdir, "%s/templates", src);
  DIR *d = opendir(tdir);
  cr_assert_not_null(d, "cannot list %s", tdir);
  for (struct dirent *e; (e = readdir(d));) {
    char in[2048], out[2048];
    snprintf(in, sizeof in, "%s/%s", tdir, e->d_name);
    struct stat st;
    if (stat(in, &st) || !S_ISREG(st.st_mode)) continue;
    FILE *fi = fopen(in, "rb");
    cr_assert_not_null(fi);
    char *text = calloc(1, (size_t)st.st_size + 1);
    cr_assert_eq(fread(text, 1, (size_t)st.st_size, fi), (size_t)st.st_size);
    fclose(fi);
    snprintf(out, sizeof out, "%s/%s", dir, e->d_name);
    FILE *fo = fopen(out, "wb");
    cr_assert_not_null(fo);
    const int mine = from && strcmp(e->d_name, file) == 0;
    char *at = mine ? strstr(text, from) : NULL;
    if (mine) cr_assert_not_null(at, "%s no longer holds '%s': update this test", file, from);
    if (at) {
      fwrite(text, 1, (size_t)(at - text), fo);
      fputs(to, fo);
      fputs(at + strlen(from), fo);
    } else {
      fputs(text, fo);
    }
    fclose(fo);
    free(text);
  }
  closedir(d);
}

void fgt_write_text(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

int fgt_render_in(const char *dir, const char *name, fg_kernel_meta *meta, char *err,
                  size_t errlen) {
  setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
  fg_generator *g = NULL;
  cr_assert_eq(fg_generator_create(&g, err, errlen), 0, "generator: %s", err);
  fg_variant v;
  cr_assert_eq(fg_variant_parse(name, &v, err, errlen), 0, "%s", err);
  char *src = NULL;
  const int rc = fg_generator_render(g, &v, &src, meta, err, errlen);
  free(src);
  fg_generator_destroy(g);
  unsetenv("FLASHGEN_TEMPLATE_DIR");
  return rc;
}

char *fgt_export_one(const char *dir, const char *variant, const char *prefix) {
  char line[160], env[256], args[256], path[256];
  snprintf(line, sizeof line, "%s\n", variant);
  fgt_write_text(dir, "v.txt", line);
  snprintf(env, sizeof env, "FLASHGEN_TEMPLATE_DIR='%s' FLASHGEN_CACHE_DIR='%s/cache'", dir, dir);
  snprintf(args, sizeof args, "export -q --arch sm_90a --variants v.txt --prefix %s -o out",
           prefix);
  cr_assert_eq(fg_test_run_cli(dir, env, args), 0, "%s", fg_test_err);
  const size_t cap = 1u << 22;
  char *text = malloc(cap);
  cr_assert_not_null(text);
  snprintf(path, sizeof path, "%s/out/%s_kernels.c", dir, prefix);
  fg_test_slurp(path, text, cap);
  return text;
}

const fg_export *fgt_export_load(const char *dir, const char *prefix) {
  const char *src = getenv("FLASHGEN_TEST_SOURCE_DIR");
  if (!src) cr_skip_test("FLASHGEN_TEST_SOURCE_DIR is not set (run through ctest)");
  char cmd[1024], so[160], path[256], fn_name[64];
  snprintf(path, sizeof path, "%s/out/%s_kernels.c", dir, prefix);
  snprintf(so, sizeof so, "%s/%s.so", dir, prefix);
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  snprintf(cmd, sizeof cmd,
           "%s -std=c11 -Wall -Wextra -Werror -pedantic -shared -fPIC -I'%s/include' -I'%s/out' "
           "-o '%s' '%s'",
           cc, src, dir, so, path);
  cr_assert_eq(system(cmd), 0, "the exported C does not compile: %s", cmd);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  const fg_export *(*fn)(void);
  snprintf(fn_name, sizeof fn_name, "%s_flashgen_export", prefix);
  *(void **)&fn = dlsym(h, fn_name);
  cr_assert_not_null(fn, "%s", dlerror());
  return fn();
}

fg_export fgt_export_table(const fg_export_kernel *k, size_t kernel_size, const char *description) {
  fg_export e;
  memset(&e, 0, sizeof e);
  e.abi_version = kernel_size > offsetof(fg_export_kernel, params) && k->params
                      ? FG_EXPORT_ABI_VERSION_TMA
                      : FG_EXPORT_ABI_VERSION;
  e.size = sizeof e;
  e.kernel_size = (uint32_t)kernel_size;
  e.choice_size = sizeof(fg_export_choice);
  e.description = description;
  e.kernels = k;
  e.n_kernels = 1;
  e.step_size = sizeof(fg_export_step);
  e.workspace_desc_size = sizeof(fg_export_workspace);
  e.tmap_size = sizeof(fg_export_tmap);
  return e;
}

void fgt_expect_plan_refused(const char *grid, const char *tail, const char *needle) {
  char text[512];
  snprintf(text, sizeof text, "main 0\nstep fg_x %s 64 128 0\n%s", grid, tail);
  fg_kernel_meta m;
  const char *why = fg_kernel_plan_parse(text, &m);
  cr_assert_not_null(why, "accepted: %s", text);
  cr_assert(strstr(why, needle), "'%s' for %s; want '%s'", why, tail, needle);
}

void fgt_expect_plan_tmaps(const fg_kernel_meta *m, fg_param_block params, int n,
                           const fg_tmap_tensor *t, const int *rows) {
  cr_assert_eq(m->params, params, "params %d, want %d", (int)m->params, (int)params);
  cr_assert_eq(m->n_tmaps, n);
  for (int i = 0; i < n; i++)
    cr_assert(m->tmaps[i].tensor == t[i] && m->tmaps[i].rows == rows[i],
              "map %d: tensor %d, %d rows; want %d, %d", i, (int)m->tmaps[i].tensor,
              m->tmaps[i].rows, (int)t[i], rows[i]);
}

fg_generator *fgt_generator(void) {
  char err[4096];
  fg_generator *g = NULL;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "generator: %s", err);
  return g;
}

fg_variant fgt_variant(const char *name) {
  fg_variant v;
  char err[256];
  cr_assert_eq(fg_variant_parse(name, &v, err, sizeof err), 0, "%s", err);
  return v;
}

void fgt_expect_unsupported(fg_context *ctx, fg_status st, const char *const *needles, size_t n) {
  const char *e = fg_context_last_error(ctx);
  cr_assert_eq(st, FG_ERROR_UNSUPPORTED, "%s: %s", fg_status_string(st), e);
  for (size_t i = 0; i < n; i++)
    cr_assert(strstr(e, needles[i]), "'%s' lacks '%s'", e, needles[i]);
}
