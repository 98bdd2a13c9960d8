/* test_compile.c: kernels render and compile with NVRTC for the archs CI has no GPU for, and what
 * ptxas made of them is checked against the plan and the device: forward (every (d, dtype, causal,
 * loop order) of the default set for sm_80 and sm_90a, the whole candidate set for d = 128 bf16,
 * every wgmma candidate of d = 64 and 256 on sm_90a) and backward (the built-in variant of every
 * head dim and mask for sm_80, sm_86, sm_89 and sm_90a, and the tune candidates of d = 64 and 128
 * on an A100 and an H100). Each kernel must:
 *   - render and compile (fg_nvrtc_compile refuses a wgmma pipeline that ptxas serialized);
 *   - spill at most fg_variant_spill_limit bytes (stores and loads; stack at most twice that),
 *     as ptxas reports for the plan's main kernel (kernel meta: regs, spill_*_bytes);
 *   - hold every entry of its plan (meta steps) as a global function with code in the cubin, and
 *     report the main one's numbers: the meta's registers and stack frame equal the main entry's
 *     in the cubin's .nv.info (REGCOUNT, FRAME_SIZE), and in a plan of several kernels the main
 *     one uses more registers than any other (backward: > 64; its _pre and _post use about 30);
 *   - fit the device the arch stands for (fg_variant_fits, and per step: the plan's dynamic
 *     shared memory within the opt-in limit, no static shared memory the manifest does not count,
 *     threads and registers x threads within a block's).
 * The checks themselves are tested on a doctored backward image (the last test).
 * A failing kernel prints one line "FAIL <variant>: <what>; <its numbers>"; each set prints its
 * count, wall time, mean NVRTC time, most registers and spill; FLASHGEN_TEST_VERBOSE=1 adds a line
 * "ok <variant>: <numbers>" per kernel. The compiles run on fg_compile_pool (every CPU).
 * FLASHGEN_TEST_SAMPLE=1 (the sanitizer build) compiles every 8th kernel of each set. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_runner.h"
#include "fg_autotune.h"
#include "fg_gen.h"

/* ---- the cubin: a 64-bit little-endian ELF (what NVRTC writes) ---- */

typedef struct cubin_entry {
  int found_text;    /* a .text.<entry> section with code */
  int symbol;        /* index of the global function symbol <entry> in .symtab, -1 if none */
  int regs;          /* EIATTR_REGCOUNT of .nv.info for the symbol (what the driver allocates) */
  int frame;         /* EIATTR_FRAME_SIZE: the stack frame ptxas reports */
  int static_smem;   /* size of .nv.shared.<entry>, 0 when absent */
} cubin_entry;

static uint64_t rd(const unsigned char *p, int n) {
  uint64_t x = 0;
  for (int i = n - 1; i >= 0; i--) x = x << 8 | p[i];
  return x;
}

/* The NUL-terminated string at off of a string table [base, base + size), or NULL. */
static const char *elf_str(const unsigned char *c, size_t n, uint64_t base, uint64_t size,
                           uint64_t off) {
  if (base > n || size > n - base || off >= size) return NULL;
  const char *s = (const char *)c + base + off;
  return memchr(s, 0, size - off) ? s : NULL;
}

/* Fills e for `entry` from the cubin's sections, symbol table and .nv.info attributes (format
 * byte, attribute byte, payload: none, 1 byte, 2 bytes, or a 2-byte size and that many bytes;
 * REGCOUNT (0x2f) and FRAME_SIZE (0x11) hold a symbol index and a value, 4 bytes each). NULL, or
 * what is wrong with the file. */
static const char *cubin_find(const unsigned char *c, size_t n, const char *entry, cubin_entry *e) {
  memset(e, 0, sizeof *e);
  e->symbol = e->regs = e->frame = -1;
  if (n < 64 || memcmp(c, "\177ELF", 4) != 0 || c[4] != 2 || c[5] != 1)
    return "not a 64-bit little-endian ELF";
  const uint64_t shoff = rd(c + 0x28, 8), shentsize = rd(c + 0x3a, 2), shnum = rd(c + 0x3c, 2),
                 shstrndx = rd(c + 0x3e, 2);
  if (shentsize < 64 || shstrndx >= shnum || shoff > n || shnum * shentsize > n - shoff)
    return "section headers out of the file";
  const unsigned char *sh = c + shoff, *ss = sh + shstrndx * shentsize;
  const uint64_t shstr = rd(ss + 0x18, 8), shstr_size = rd(ss + 0x20, 8);
  char text[128], shared[128];
  snprintf(text, sizeof text, ".text.%s", entry);
  snprintf(shared, sizeof shared, ".nv.shared.%s", entry);
  const unsigned char *info = NULL;
  uint64_t info_size = 0;
  for (uint64_t i = 0; i < shnum; i++) {
    const unsigned char *h = sh + i * shentsize;
    const char *name = elf_str(c, n, shstr, shstr_size, rd(h, 4));
    const uint32_t type = (uint32_t)rd(h + 4, 4);
    const uint64_t off = rd(h + 0x18, 8), size = rd(h + 0x20, 8), link = rd(h + 0x28, 4),
                   entsize = rd(h + 0x38, 8);
    if (!name) return "a section name out of the string table";
    const int in_file = type != 8 /* SHT_NOBITS */ && off <= n && size <= n - off;
    if (strcmp(name, text) == 0) {
      e->found_text = size > 0;
    } else if (strcmp(name, shared) == 0) {
      e->static_smem = (int)size;
    } else if (strcmp(name, ".nv.info") == 0 && in_file) {
      info = c + off;
      info_size = size;
    } else if (type == 2 /* SHT_SYMTAB */ && entsize >= 24 && link < shnum && in_file) {
      const unsigned char *l = sh + link * shentsize;
      const uint64_t str = rd(l + 0x18, 8), str_size = rd(l + 0x20, 8);
      for (uint64_t k = 0; k < size / entsize; k++) {
        const unsigned char *sym = c + off + k * entsize;
        const char *sname = elf_str(c, n, str, str_size, rd(sym, 4));
        /* st_info: binding GLOBAL (1) << 4 | type FUNC (2) */
        if (sname && strcmp(sname, entry) == 0 && sym[4] == (1 << 4 | 2)) e->symbol = (int)k;
      }
    }
  }
  if (!info) return "no .nv.info section";
  for (uint64_t i = 0; i + 2 <= info_size;) {
    const int fmt = info[i], attr = info[i + 1];
    i += 2;
    uint64_t len = fmt == 1 ? 0 : fmt == 2 ? 1 : fmt == 3 ? 2 : 0;
    if (fmt == 4) {
      if (i + 2 > info_size) return ".nv.info cut short";
      len = rd(info + i, 2);
      i += 2;
    } else if (fmt < 1 || fmt > 3) {
      return ".nv.info has an attribute of an unknown format";
    }
    if (i + len > info_size) return ".nv.info cut short";
    if (fmt == 4 && len == 8 && e->symbol >= 0 && rd(info + i, 4) == (uint64_t)e->symbol) {
      if (attr == 0x2f) e->regs = (int)rd(info + i + 4, 4);
      if (attr == 0x11) e->frame = (int)rd(info + i + 4, 4);
    }
    i += len;
  }
  return NULL;
}

/* ---- one set of kernels through the compile pool ---- */

typedef struct compile_set {
  fg_generator *g;
  const fg_device_limits *lim; /* the device the kernels must fit */
  fg_compile_item *items;
  int verbose; /* FLASHGEN_TEST_VERBOSE=1: a line for every kernel, with its numbers */
  int failures, max_regs, max_spill;
  double total_ms;
  char first_error[8192];
} compile_set;

/* Appends to buf (of len, holding w bytes). */
#define ADD(...) (w += (size_t)snprintf(buf + w, w < len ? len - w : 0, __VA_ARGS__))

/* Whether a built kernel fails a check: 1 with what is wrong in buf, then its numbers; 0 with buf
 * empty, or with only its numbers when verbose. */
static int check_image(compile_set *s, const fg_variant *v, const fg_kernel_image *img, char *buf,
                       size_t len, int verbose) {
  size_t w = 0;
  const fg_kernel_meta *m = &img->meta;
  const fg_device_limits *lim = s->lim;
  const int limit = fg_variant_spill_limit(v);
  const char *bad = fg_kernel_meta_invalid(m);
  buf[0] = 0;
  char name[FG_VARIANT_NAME_MAX], entry[FG_VARIANT_NAME_MAX + 8], why[512];
  fg_variant_name(v, name, sizeof name);
  snprintf(entry, sizeof entry, "fg_%s", name);
  if (bad) ADD(" the plan is malformed (%s);", bad);
  else if (strcmp(fg_kernel_main(m)->entry, entry) != 0)
    ADD(" the main step is %s, not %s;", fg_kernel_main(m)->entry, entry);
  if (v->pass == FG_PASS_BWD && m->n_steps != 3) ADD(" %d steps, not _pre, main, _post;", m->n_steps);
  if (m->spill_store_bytes < 0 || m->spill_store_bytes > limit || m->spill_load_bytes < 0 ||
      m->spill_load_bytes > limit)
    ADD(" spills past the limit of %d B;", limit);
  if (m->stack_bytes < 0 || m->stack_bytes > 2 * limit) ADD(" a stack past %d B;", 2 * limit);
  if (m->regs <= 0 || m->regs > 255) ADD(" no register count from ptxas;");
  if (img->cubin_size < 1000 || img->ptx_size < 1000) ADD(" an empty cubin or PTX;");
  const int fits = fg_variant_fits(s->g, v, lim, why, sizeof why);
  if (fits != 1) ADD(" does not fit an %s: %s;", lim->name, why);
  /* The cubin: every step's entry, its registers and shared memory. */
  char nums[1024];
  size_t nw = (size_t)snprintf(nums, sizeof nums, "regs %d (cubin:", m->regs);
  int main_regs = -1, main_frame = -1, aux_max = 0;
  for (int i = 0; !bad && i < m->n_steps; i++) {
    const fg_plan_step *st = &m->steps[i];
    cubin_entry e;
    const char *elf = cubin_find(img->cubin, img->cubin_size, st->entry, &e);
    if (elf) {
      ADD(" the cubin cannot be read (%s);", elf);
      break;
    }
    if (!e.found_text || e.symbol < 0)
      ADD(" the cubin has no %s %s;", e.found_text ? "global function" : "code for", st->entry);
    const char *tag = i == m->main_step ? "main" : strncmp(st->entry, entry, strlen(entry)) == 0
                                                       ? st->entry + strlen(entry)
                                                       : st->entry;
    if (nw < sizeof nums)
      nw += (size_t)snprintf(nums + nw, sizeof nums - nw, " %s %d", tag, e.regs);
    if (i == m->main_step) main_regs = e.regs, main_frame = e.frame;
    else if (e.regs > aux_max) aux_max = e.regs;
    if (e.regs <= 0) ADD(" no register count for %s in the cubin;", st->entry);
    /* Shared memory is the manifest's, dynamic (extern __shared__): a static array would escape
     * the fit rule. The .nv.shared section holds the arch's reserved 1 KB from sm_90 on. */
    const int reserved = v->arch >= FG_ARCH_SM90 ? 1024 : 0;
    if (e.static_smem > reserved)
      ADD(" %s declares %d B of static shared memory, which the manifest does not count;", tag,
          e.static_smem - reserved);
    if (st->smem_bytes > lim->smem_optin_per_block)
      ADD(" %s needs %d B of shared memory, an %s allows %d;", tag, st->smem_bytes, lim->name,
          lim->smem_optin_per_block);
    if (st->threads > lim->max_threads_per_block || e.regs * st->threads > lim->regs_per_sm)
      ADD(" %s: %d threads x %d registers do not fit a block;", tag, st->threads, e.regs);
  }
  if (!bad && main_regs >= 0 && m->regs != main_regs)
    ADD(" the meta's registers (%d) are not the main kernel's (%d);", m->regs, main_regs);
  if (!bad && main_frame >= 0 && m->stack_bytes != main_frame)
    ADD(" the meta's stack frame (%d B) is not the main kernel's (%d B);", m->stack_bytes, main_frame);
  if (!bad && m->n_steps > 1 && m->regs <= aux_max)
    ADD(" the main kernel's registers (%d) are not above the other kernels' (%d): whose are they?;",
        m->regs, aux_max);
  if (v->pass == FG_PASS_BWD && m->regs <= 64)
    ADD(" %d registers: the backward's main kernel uses more than 64;", m->regs);
  const int failed = w > 0;
  if (!failed && !verbose) return 0;
  if (nw < sizeof nums)
    snprintf(nums + nw, sizeof nums - nw, "), spill stores %d B, loads %d B (limit %d), stack %d B, "
             "smem %d B, %d threads",
             m->spill_store_bytes, m->spill_load_bytes, limit, m->stack_bytes,
             bad ? -1 : fg_kernel_main(m)->smem_bytes, bad ? -1 : fg_kernel_main(m)->threads);
  ADD(" %s", nums);
  return failed;
}

static void compiled(void *ud, int i, int ndone) {
  (void)ndone;
  compile_set *s = ud;
  fg_compile_item *it = &s->items[i];
  char name[FG_VARIANT_NAME_MAX], what[2048] = "";
  fg_variant_name(&it->v, name, sizeof name);
  int failed = 1;
  if (!it->ok) {
    /* One line: the log's first line naming an error (else its first line); the whole log goes
     * into the assertion's message. */
    const char *log = it->log ? it->log : "failed without a log";
    const char *e = strstr(log, "error");
    while (e && e > log && e[-1] != '\n') e--;
    if (!e) e = log;
    const char *nl = strchr(e, '\n');
    snprintf(what, sizeof what, " %.*s", (int)(nl ? nl - e : (ptrdiff_t)strlen(e)), e);
    if (!s->failures) snprintf(s->first_error, sizeof s->first_error, "%s: %s", name, log);
  } else {
    failed = check_image(s, &it->v, &it->img, what, sizeof what, s->verbose);
    s->total_ms += it->img.compile_ms;
    if (it->img.meta.regs > s->max_regs) s->max_regs = it->img.meta.regs;
    const int sp = it->img.meta.spill_store_bytes > it->img.meta.spill_load_bytes
                       ? it->img.meta.spill_store_bytes : it->img.meta.spill_load_bytes;
    if (sp > s->max_spill) s->max_spill = sp;
    if (failed && !s->failures) snprintf(s->first_error, sizeof s->first_error, "%s:%s", name, what);
  }
  if (failed) {
    s->failures++;
    fprintf(stderr, "FAIL %s:%s\n", name, what);
  } else if (s->verbose) {
    printf("ok %s:%s\n", name, what);
  }
  fg_kernel_image_free(&it->img);
  memset(&it->img, 0, sizeof it->img);
  free(it->log);
  it->log = NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Compiles v[0..n) (every 8th with FLASHGEN_TEST_SAMPLE) on every CPU and checks each against
 * lim; asserts that none failed. */
static void compile_all_on(const fg_variant *v, int n, const char *what, const fg_device_limits *lim) {
  char err[4096];
  if (fg_nvrtc_load(err, sizeof err)) cr_assert_fail("%s", err);
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  cr_assert_gt(n, 0, "%s: no kernels to compile", what);
  fg_compile_item *items = calloc((size_t)n, sizeof *items);
  cr_assert_not_null(items);
  int m = 0;
  const int sample = getenv("FLASHGEN_TEST_SAMPLE") && atoi(getenv("FLASHGEN_TEST_SAMPLE"));
  for (int i = 0; i < n; i++)
    if (!sample || i % 8 == 0) items[m++].v = v[i];
  compile_set *s = calloc(1, sizeof *s);
  cr_assert_not_null(s);
  s->g = g;
  s->lim = lim;
  s->items = items;
  s->verbose = getenv("FLASHGEN_TEST_VERBOSE") && atoi(getenv("FLASHGEN_TEST_VERBOSE"));
  const double t0 = now_s();
  fg_compile_pool(g, items, m, 0, compiled, s);
  printf("%s (%s): %d kernels compiled on %d threads in %.1f s, %d failed, mean NVRTC time %.0f "
         "ms, most registers %d, most spill %d B\n",
         what, lim->name, m, fg_online_cpus(), now_s() - t0, s->failures,
         m ? s->total_ms / m : 0.0, s->max_regs, s->max_spill);
  fflush(stdout);
  const int failures = s->failures;
  char first[sizeof s->first_error];
  memcpy(first, s->first_error, sizeof first);
  free(s);
  free(items);
  fg_generator_destroy(g);
  cr_assert_eq(failures, 0, "%s: %d of %d failed (one FAIL line each above); first: %s", what,
               failures, m, first);
}

/* The forward sets: every kernel for the arch's typical device. */
static void compile_all(const fg_variant *v, int n, const char *what) {
  cr_assert_gt(n, 0);
  compile_all_on(v, n, what, fg_limits_for_arch(v[0].arch));
}

static void default_set(fg_arch arch) {
  fg_variant v[FG_DEFAULT_VARIANTS_MAX];
  int n = fg_default_variants(arch, 1, v, FG_DEFAULT_VARIANTS_MAX);
  cr_assert_lt(n, FG_DEFAULT_VARIANTS_MAX, "the default set fills its cap: raise FG_DEFAULT_VARIANTS_MAX");
  /* sm_90a: the Hopper kernels and their q_outer twins: TMA at every head dim (padded tiles off
   * 64-column blocks) but d = 64 causal, wgmma there; on the persistent grid (q_tma_p): d <= 64
   * (5 head dims without a mask, 4 with one), and with or without one the head dims padded to 128
   * or 192 (d = 72..192, 16 of them). The built-ins by key length too (fg_builtin_variant_for):
   * with a causal mask at d = 64 the wgmma kernel with K/V blocks of 64 (512) and the TMA kernel
   * persistent with two consumer warpgroups and 4 stages (1k) and three (2k-4k) and plain (8k+);
   * below 64 (d = 32..56) the persistent one with three (2k+) and with 4 stages (up to 1k);
   * without one at d = 32..64 4 stages (up to 1k); at the head dims padded to 128 (d =
   * 72..120, 7 of them) three consumers (2k+; without a mask only d = 80, 96, 112, 120: the other
   * three have them at every length; with one d = 88 and 104 at 1k too, Bc 96: d = 88's is
   * one more, d = 104's is its 2k+ kernel); with one at d = 144, 160, 176 the plain grid
   * (4k+), three consumers at d = 136 and 152 (1k+, plain) and 168 (2k persistent);
   * without one at d = 136..256 but 136, 152, 168 (which have three consumers at every length,
   * d = 136 and 152 on the plain grid) and 200, 216, 232 (10 head dims) K/V blocks of 64 on the
   * persistent grid (512; d = 256 up to 4k, the same kernel); without one clusters of two
   * blocks (q_tma_c, 13 kernels): d = 200 and
   * 216 with K/V blocks of 64 (512) and 80 (1k+), d = 232 (64, every length), 248 (64, 1k+), 184
   * (64, 2k+), and from 4k at d = 72, 88, 104, 136, 152 (three consumers) and 168 (two, Bc 96);
   * with one clusters too (11 kernels): d = 200, 216, 232 (1k+) and 248 (4k+) with K/V blocks of
   * 64, 184 with 80 (4k+), 168 on two consumers (Bc 96, 4k+), and from 8k on three consumers at
   * d = 72, 88, 104, 136, 152; the persistent grid taking its tiles from a counter (q_tma_d, 29
   * kernels, 22 of them new: the others replace the q_tma_p kernel of the lengths they took):
   * with a mask up to 1k keys on two consumers (d <= 160 but 72, 176 and 192), d = 64 on three at
   * 2k-4k, d = 240 and 256 at 1k-8k, without one at 512 keys d = 32-72, up to 1k d = 128 and 192
   * (core/problem.c, fg_builtin_dynamic); with a mask at 512 keys d = 128 its consumers in
   * ping-pong (q_tma_dp, one more kernel); each in 2 dtypes. */
  const int twins = arch == FG_ARCH_SM90A ? 2 * (29 + 29) : 0;
  const int lengths = arch == FG_ARCH_SM90A ? (4 + 4 + 4 + 5 + 7 + 1 + 3 + 7 + 10 + 13 + 11 + 22 + 1) * 2 : 0;
  cr_assert_eq(n, 29 * 2 * 2 * 2 + twins + lengths,
               "29 head dims x 2 dtypes x 2 maskings x (built-in, kv_outer), plus %d and %d", twins,
               lengths);
  int wg = 0, persistent = 0, dynamic = 0, pingpong = 0;
  for (int i = 0; i < n; i++) {
    wg += v[i].loop == FG_LOOP_Q_WGMMA || v[i].loop == FG_LOOP_Q_WGMMA_OV ||
          v[i].loop == FG_LOOP_Q_TMA || v[i].loop == FG_LOOP_Q_TMA_P || v[i].loop == FG_LOOP_Q_TMA_C ||
          v[i].loop == FG_LOOP_Q_TMA_D || v[i].loop == FG_LOOP_Q_TMA_DP;
    persistent += v[i].loop == FG_LOOP_Q_TMA_P;
    dynamic += v[i].loop == FG_LOOP_Q_TMA_D;
    pingpong += v[i].loop == FG_LOOP_Q_TMA_DP;
  }
  cr_assert_eq(dynamic, arch == FG_ARCH_SM90A ? 29 * 2 : 0, "q_tma_d kernels in the %s default set",
               fg_arch_name(arch));
  cr_assert_eq(pingpong, arch == FG_ARCH_SM90A ? 1 * 2 : 0, "q_tma_dp kernels in the %s default set",
               fg_arch_name(arch));
  cr_assert_eq(wg, twins + lengths, "Hopper kernels in the %s default set", fg_arch_name(arch));
  cr_assert_eq(persistent, arch == FG_ARCH_SM90A ? (5 + 14 + 16 + 2 + 8 + 4 + 5 + 11 + 1 + 1 + 10 - 7) * 2 : 0,
               "persistent kernels in the %s default set: d <= 64 non-causal, d = 72..192 "
               "non-causal but 136 and 152, causal, d = 64 causal 1k and 2k-4k, d = 32..56 causal "
               "(two and three consumers, and 4 stages), d = 32..64 non-causal 4 stages, d = 72..120 three consumers (and d = 88 causal 1k), "
               "d = 168 causal 2k, d = 136..256 non-causal 512 but 136, 152, 168, 200, 216, 232, "
               "2 dtypes; less the 7 that q_tma_d replaced at every length they took",
               fg_arch_name(arch));
  char what[128];
  snprintf(what, sizeof what, "forward default set %s", fg_arch_name(arch));
  compile_all(v, n, what);
}

Test(compile, default_set_sm80, .timeout = 1800) { default_set(FG_ARCH_SM80); }
Test(compile, default_set_sm90a, .timeout = 1800) { default_set(FG_ARCH_SM90A); }

static void candidate_set(fg_arch arch, const fg_device_limits *lim) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant v[256];
  int n = 0;
  for (int causal = 0; causal <= 1; causal++)
    n += fg_candidates(g, &(fg_problem){FG_PASS_FWD, 128, FG_DTYPE_BF16, causal, 0, 0}, arch, lim,
                       v + n, 256 - n, NULL);
  fg_generator_destroy(g);
  cr_assert_gt(n, 20);
  char what[128];
  snprintf(what, sizeof what, "forward candidates d=128 %s", fg_arch_name(arch));
  compile_all_on(v, n, what, lim);
}

Test(compile, candidates_d128_bf16_h100_sm90a, .timeout = 1800) { candidate_set(FG_ARCH_SM90A, &fg_limits_h100); }

/* The Hopper candidates (wgmma and TMA) of the other head dims they take (d = 128 is in the set
 * above). */
Test(compile, hopper_candidates_d64_d192_d256_h100, .timeout = 1800) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant all[768], v[384];
  int n = 0, m = 0, tma = 0;
  static const int ds[] = {64, 192, 256};
  for (int i = 0; i < 3; i++)
    for (int causal = 0; causal <= 1; causal++)
      n += fg_candidates(g, &(fg_problem){FG_PASS_FWD, ds[i], FG_DTYPE_BF16, causal, 0, 0},
                         FG_ARCH_SM90A, &fg_limits_h100, all + n, 768 - n, NULL);
  fg_generator_destroy(g);
  for (int i = 0; i < n && m < 384; i++)
    if (all[i].loop == FG_LOOP_Q_WGMMA || all[i].loop == FG_LOOP_Q_WGMMA_OV ||
        all[i].loop == FG_LOOP_Q_TMA) {
      tma += all[i].loop == FG_LOOP_Q_TMA;
      v[m++] = all[i];
    }
  cr_assert_gt(m, 10, "Hopper candidates of d = 64, 192 and 256 on an H100");
  cr_assert_gt(tma, 4, "TMA candidates among them");
  compile_all_on(v, m, "forward Hopper candidates d=64/192/256 sm_90a", &fg_limits_h100);
}
Test(compile, candidates_d128_bf16_a100_sm80, .timeout = 1800) { candidate_set(FG_ARCH_SM80, &fg_limits_a100); }

/* The persistent TMA kernels (q_tma_p, q_tma_d taking its tiles from a counter, q_tma_dp) that
 * `flashgen check` forces (cases tma_persistent/..., read from `flashgen check --list`): each
 * compiles for sm_90a without spilling, so a check on the GPU runs the kernel it names. */
Test(compile, tma_persistent_check_variants, .timeout = 1800) {
  cr_assert_eq(fg_test_run_cli(NULL, NULL, "check --list --filter tma_persistent/"), 0, "%s",
               fg_test_err);
  fg_variant v[64];
  int n = 0;
  for (const char *line = fg_test_out; line && *line;) {
    const char *end = strchr(line, '\n');
    const char *name = strstr(line, "/fwd_");
    const char *tail = name ? strstr(name, "_sm90a_") : NULL;
    if (name && tail && (!end || tail < end)) {
      char buf[FG_VARIANT_NAME_MAX], err[256];
      const size_t len = (size_t)(tail - name - 1) + strlen("_sm90a");
      cr_assert_lt(len, sizeof buf);
      memcpy(buf, name + 1, len);
      buf[len] = 0;
      fg_variant x;
      cr_assert_eq(fg_variant_parse(buf, &x, err, sizeof err), 0, "%s: %s", buf, err);
      cr_assert(x.loop == FG_LOOP_Q_TMA_P || x.loop == FG_LOOP_Q_TMA_D || x.loop == FG_LOOP_Q_TMA_DP, "%s",
                buf);
      int seen = 0;
      for (int i = 0; i < n && !seen; i++) seen = memcmp(&v[i], &x, sizeof x) == 0;
      if (!seen && n < 64) v[n++] = x;
    }
    line = end ? end + 1 : NULL;
  }
  int dyn = 0, pp = 0;
  for (int i = 0; i < n; i++) dyn += v[i].loop == FG_LOOP_Q_TMA_D, pp += v[i].loop == FG_LOOP_Q_TMA_DP;
  cr_assert_geq(n - dyn - pp, 10, "q_tma_p variants among the check's cases: %d\n%s", n - dyn - pp,
                fg_test_out);
  cr_assert_geq(dyn, 8, "q_tma_d variants among the check's cases: %d\n%s", dyn, fg_test_out);
  cr_assert_geq(pp, 8, "q_tma_dp variants among the check's cases: %d\n%s", pp, fg_test_out);
  compile_all_on(v, n, "persistent TMA kernels of flashgen check, sm_90a", &fg_limits_h100);
}

/* ---- the backward ---- */

/* The built-in backward variants of one arch: every head dim the library takes (32..256 step 8,
 * so every padding case: d = 40, 72, 200 ...) and both masks in bf16, and f16 at the head dims
 * in f16_ds (the dtype changes no shape, only the element type). ds (NULL: every head dim) cuts
 * the bf16 list to a subset, which must still hold every shape (Br, Bc, warps, stages, loop) the
 * rule picks for the arch: asserted here, so a change of the rule that adds a shape fails until
 * the subset covers it. */
static int builtin_backward(fg_arch arch, const int *ds, const int *f16_ds, fg_variant *out, int cap) {
  int n = 0;
  fg_variant all[64];
  int nall = 0;
  for (int d = 32; d <= 256; d += 8) all[nall++] = fg_builtin_backward_variant(d, FG_DTYPE_BF16, 0, arch);
  for (int t = 0; t < 2; t++) {
    const int *list = t ? f16_ds : ds;
    if (t && !list) break;
    for (int k = 0; list ? list[k] : k < nall; k++) {
      const int d = list ? list[k] : all[k].d;
      for (int causal = 0; causal <= 1; causal++) {
        cr_assert_lt(n, cap);
        out[n++] = fg_builtin_backward_variant(d, t ? FG_DTYPE_F16 : FG_DTYPE_BF16, causal, arch);
      }
    }
  }
  /* Every shape of the rule is in the list, and every variant is the backward's. */
  for (int i = 0; i < nall; i++) {
    int covered = 0;
    for (int j = 0; j < n && !covered; j++)
      covered = out[j].br == all[i].br && out[j].bc == all[i].bc && out[j].warps == all[i].warps &&
                out[j].stages == all[i].stages && out[j].loop == all[i].loop;
    char name[FG_VARIANT_NAME_MAX];
    fg_variant_name(&all[i], name, sizeof name);
    cr_assert(covered, "the %s list lacks the built-in rule's shape of %s: add its d", fg_arch_name(arch),
              name);
  }
  for (int j = 0; j < n; j++) {
    cr_assert_eq(out[j].pass, FG_PASS_BWD);
    cr_assert_eq(fg_variant_spill_limit(&out[j]), 128, "the backward's spill limit (core/variant.c)");
  }
  return n;
}

/* f16 at a small, a padded, the two wgmma (on sm_90a) and a large head dim. */
static const int f16_ds[] = {40, 64, 128, 200, 0};

Test(compile, backward_builtin_sm80, .timeout = 1800) {
  fg_variant v[160];
  int n = builtin_backward(FG_ARCH_SM80, NULL, f16_ds, v, 160);
  cr_assert_eq(n, 29 * 2 + 4 * 2);
  compile_all_on(v, n, "backward built-in sm_80", fg_limits_for_arch(FG_ARCH_SM80));
}

/* sm_86: the 99 KB rule (Bc 128 only to d = 64, one stage, 32 x 32 on 4 warps above d = 128). */
Test(compile, backward_builtin_sm86, .timeout = 1800) {
  fg_variant v[160];
  int n = builtin_backward(FG_ARCH_SM86, NULL, NULL, v, 160);
  cr_assert_eq(n, 29 * 2);
  compile_all_on(v, n, "backward built-in sm_86", fg_limits_for_arch(FG_ARCH_SM86));
}

/* sm_89 has sm_86's rule (the same shapes): a subset holding each shape, each side of each step
 * of the rule (d = 64 | 72, 128 | 136) and the ends. */
Test(compile, backward_builtin_sm89, .timeout = 1800) {
  static const int ds[] = {32, 64, 72, 128, 136, 256, 0};
  fg_variant v[160];
  int n = builtin_backward(FG_ARCH_SM89, ds, NULL, v, 160);
  cr_assert_eq(n, 6 * 2);
  compile_all_on(v, n, "backward built-in sm_89", fg_limits_for_arch(FG_ARCH_SM89));
}

/* sm_90a: the warp-specialised wgmma kernel (kv_tma) at d = 64 and 128, kv_outer elsewhere. */
Test(compile, backward_builtin_sm90a, .timeout = 1800) {
  fg_variant v[160];
  int n = builtin_backward(FG_ARCH_SM90A, NULL, f16_ds, v, 160);
  cr_assert_eq(n, 29 * 2 + 4 * 2);
  int tma = 0;
  for (int i = 0; i < n; i++) tma += v[i].loop == FG_LOOP_KV_TMA && (v[i].d == 64 || v[i].d == 128);
  cr_assert_eq(tma, 2 * 2 * 2, "kv_tma at d = 64 and 128, both masks, bf16 and f16");
  compile_all_on(v, n, "backward built-in sm_90a", fg_limits_for_arch(FG_ARCH_SM90A));
}

/* The backward tune candidates (fg_candidates of a backward problem) of d = 64 and 128, bf16,
 * both masks, on a device: the candidate rule is to keep only what compiles within the spill
 * limit. */
static void backward_candidates(fg_arch arch, const fg_device_limits *lim) {
  char err[4096];
  fg_generator *g;
  cr_assert_eq(fg_generator_create(&g, err, sizeof err), 0, "%s", err);
  fg_variant v[256];
  int n = 0;
  static const int ds[] = {64, 128};
  for (int i = 0; i < 2; i++)
    for (int causal = 0; causal <= 1; causal++) {
      const fg_problem p = {FG_PASS_BWD, ds[i], FG_DTYPE_BF16, causal, 0, 0};
      const int k = fg_candidates(g, &p, arch, lim, v + n, 256 - n, NULL);
      cr_assert_gt(k, 0, "no backward candidate of d = %d on an %s", ds[i], lim->name);
      const fg_variant b = fg_builtin_backward_variant(ds[i], FG_DTYPE_BF16, causal, arch);
      cr_assert(memcmp(&v[n], &b, sizeof b) == 0, "the built-in variant comes first");
      for (int j = n; j < n + k; j++) cr_assert_eq(v[j].pass, FG_PASS_BWD);
      n += k;
    }
  fg_generator_destroy(g);
  char what[128];
  snprintf(what, sizeof what, "backward candidates d=64/128 %s", fg_arch_name(arch));
  compile_all_on(v, n, what, lim);
}

Test(compile, backward_candidates_h100_sm90a, .timeout = 1800) {
  backward_candidates(FG_ARCH_SM90A, &fg_limits_h100);
}
Test(compile, backward_candidates_a100_sm80, .timeout = 1800) {
  backward_candidates(FG_ARCH_SM80, &fg_limits_a100);
}

/* The checks above fail where they should: a backward kernel passes as built, and fails with the
 * numbers of its _pre kernel in its meta (what reading ptxas's first entry once gave), with a
 * spill past the limit, a stack frame not the main kernel's, a step the cubin lacks, or shared
 * memory past the device's. */
Test(compile, backward_checks_fail_where_they_should, .timeout = 600) {
  char err[4096];
  if (fg_nvrtc_load(err, sizeof err)) cr_assert_fail("%s", err);
  compile_set s = {.lim = &fg_limits_a100};
  cr_assert_eq(fg_generator_create(&s.g, err, sizeof err), 0, "%s", err);
  const fg_variant v = fg_builtin_backward_variant(64, FG_DTYPE_BF16, 1, FG_ARCH_SM80);
  fg_kernel_image img;
  char *log = NULL, what[2048];
  cr_assert_eq(fg_generator_build(s.g, &v, &img, &log), 0, "%s", log ? log : "");
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 0, "as built:%s", what);
  cr_assert_eq(img.meta.n_steps, 3);
  cubin_entry pre;
  const fg_plan_step *pre_step = &img.meta.steps[img.meta.main_step == 0 ? 1 : 0];
  cr_assert_null(cubin_find(img.cubin, img.cubin_size, pre_step->entry, &pre));
  cr_assert(pre.regs > 0 && pre.regs < 64, "%s uses %d registers", pre_step->entry, pre.regs);

  const fg_kernel_meta good = img.meta;
  img.meta.regs = pre.regs;
  img.meta.spill_store_bytes = img.meta.spill_load_bytes = img.meta.stack_bytes = 0;
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 1);
  cr_assert(strstr(what, "not the main kernel's"), "%s", what);
  img.meta = good;
  img.meta.spill_store_bytes = fg_variant_spill_limit(&v) + 4;
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 1);
  cr_assert(strstr(what, "spills past the limit of 128 B"), "%s", what);
  img.meta = good;
  img.meta.stack_bytes = good.stack_bytes + 8;
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 1);
  cr_assert(strstr(what, "stack frame"), "%s", what);
  img.meta = good;
  snprintf(img.meta.steps[img.meta.n_steps - 1].entry, sizeof img.meta.steps[0].entry, "fg_missing");
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 1);
  cr_assert(strstr(what, "no code for fg_missing"), "%s", what);
  img.meta = good;
  fg_kernel_main_mut(&img.meta)->smem_bytes = fg_limits_a100.smem_optin_per_block + 16;
  cr_assert_eq(check_image(&s, &v, &img, what, sizeof what, 0), 1);
  cr_assert(strstr(what, "B of shared memory, an NVIDIA A100 allows"), "%s", what);
  img.meta = good;
  fg_kernel_image_free(&img);
  fg_generator_destroy(s.g);
}
