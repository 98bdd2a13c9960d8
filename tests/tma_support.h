/* tma_support.h: what the tests of plans (test_plans.c) and of plans that load through tensor
 * maps (test_tma.c, the forward's fwd_tma; test_tma_bwd.c, the backward's bwd_tma) share: a
 * generator and a variant asserted, a copy of templates/ with one text
 * replaced and rendering with it, `flashgen export` of one variant and loading its table, an
 * exported table's header, a plan's maps, and a variant and a refusal asserted
 * (tests/support_tma.c). */
#ifndef FG_TMA_SUPPORT_H
#define FG_TMA_SUPPORT_H
#include <stddef.h>

#include "fg_kernel.h"
#include "fg_variant.h"
#include "flashgen.h"
#include "flashgen_export.h"

/* A copy of templates/ in a new directory made from the mkdtemp template tmpl (its name into
 * dir), with the text `from` of the template `file` replaced by `to` (from NULL: all unchanged),
 * asserting that file still holds it. Skips the test when FLASHGEN_TEST_SOURCE_DIR is not set. */
void fgt_template_dir(char dir[64], const char *tmpl, const char *file, const char *from,
                      const char *to);
/* Writes text into the file dir/name (a template stub, a list of variants), asserted. */
void fgt_write_text(const char *dir, const char *name, const char *text);
/* Renders variant name with the templates in dir: 0 with *meta, or -1 with err. */
int fgt_render_in(const char *dir, const char *name, fg_kernel_meta *meta, char *err,
                  size_t errlen);

/* Runs `flashgen export` for sm_90a on the one variant `variant` with the templates in dir (also
 * its working directory and, under cache/, its cache), into dir/out with the prefix `prefix`,
 * asserting it succeeds, and returns the text of the C it wrote (dir/out/<prefix>_kernels.c;
 * free() it). */
char *fgt_export_one(const char *dir, const char *variant, const char *prefix);
/* Compiles that C warning-free (-Wall -Wextra -Werror -pedantic) into dir/<prefix>.so, loads it
 * and returns its table, <prefix>_flashgen_export(); each step asserted. */
const fg_export *fgt_export_load(const char *dir, const char *prefix);

/* The header of an exported table of the one kernel k, whose struct is kernel_size bytes (less
 * than sizeof *k: a table from before the fields past it). Version 2 when the kernel takes tensor
 * maps (a nonzero params within kernel_size), as flashgen export writes it; else version 1. */
fg_export fgt_export_table(const fg_export_kernel *k, size_t kernel_size, const char *description);

/* Asserts that the plan text of one step, fg_x on the grid `grid` (q_tiles, kv_tiles), followed by
 * the lines tail is refused, for a reason that holds needle. */
void fgt_expect_plan_refused(const char *grid, const char *tail, const char *needle);
/* Asserts that m's parameter block is `params` and that its maps are the n of tensors t with
 * rows[i] rows each, in that order. */
void fgt_expect_plan_tmaps(const fg_kernel_meta *m, fg_param_block params, int n,
                           const fg_tmap_tensor *t, const int *rows);

/* The variant name, asserted to parse. */
fg_variant fgt_variant(const char *name);
/* A generator on the templates FLASHGEN_TEMPLATE_DIR names (else the embedded ones), asserted;
 * fg_generator_destroy it. */
typedef struct fg_generator fg_generator;
fg_generator *fgt_generator(void);
/* Asserts that st is FG_ERROR_UNSUPPORTED and that ctx's last error holds each of the n needles. */
void fgt_expect_unsupported(fg_context *ctx, fg_status st, const char *const *needles, size_t n);
/* Calls check(st, needles, n) with the needles listed after st (one at least) as an array: a
 * test's EXPECT_REFUSED(call, "needle", ...) over its own check, which takes the status first. */
#define FGT_WITH_NEEDLES(check, st, ...)                                         \
  do {                                                                           \
    const char *const n_[] = {__VA_ARGS__};                                      \
    check((st), n_, sizeof n_ / sizeof n_[0]);                                   \
  } while (0)
#endif
