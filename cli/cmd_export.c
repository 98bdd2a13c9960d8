/* cmd_export.c: `flashgen export`: compiles a chosen kernel set (forward and backward variants)
 * for one or more arches and writes it as C (<prefix>_kernels.c / .h) in the layout of
 * include/flashgen_export.h: every cubin and its PTX as byte arrays, the launch contracts (a
 * backward variant: grid kind KV_TILES, one module holding <entry>_pre, <entry> and
 * <entry>_post), and the tuned choices per problem bucket. The output depends only on the
 * inputs (no time, no paths, sorted), so running it twice writes the same bytes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_cli.h"
#include "fg_runtime_internal.h"

#define EXPORT_MAX_ARCHS FG_ARCH_COUNT

static void export_usage(FILE *f) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  fprintf(f,
          "usage: flashgen export --arch ARCH[,ARCH...] [--default | --variants FILE] [--tuned]\n"
          "                       [--no-backward] [--prefix NAME] [-j N] [--no-ptx] -o DIR\n"
          "       flashgen export --arch ARCH[,ARCH...] [...] --dry-run\n\n"
          "Compiles a kernel set for each ARCH and writes it as C, for applications that must not\n"
          "compile at run time: DIR/NAME_kernels.c holds every cubin and its PTX as byte arrays,\n"
          "the launch contracts and the tuned choices; DIR/NAME_kernels.h declares\n"
          "  const fg_export *NAME_flashgen_export(void);\n"
          "Build the .c with your program, link flashgen_runtime (no Lua, NVRTC or SQLite) and\n"
          "register the table once: fg_register_export(NAME_flashgen_export(), err, sizeof err).\n"
          "The same inputs always give byte-identical files.\n\n"
          "what to export:\n"
          "  --default         the kernel set: the built-in rule's forward variant and its\n"
          "                    backward variant (bwd_..., for fg_attention_backward) for every\n"
          "                    head_dim 32..256, f16 and bf16, causal or not (116 + 116 per\n"
          "                    arch); the default\n"
          "  --no-backward     with --default: the 116 forward variants per arch only\n"
          "  --variants FILE   the kernel set: the variants named in FILE, forward (fwd_...) or\n"
          "                    backward (bwd_...), one canonical name per line ('#' starts a\n"
          "                    comment; a text file of at most 1 MiB); the arch in each name is\n"
          "                    replaced by each ARCH. Under the exported-only policy a backward\n"
          "                    call runs the built-in rule's backward variant of its problem,\n"
          "                    so list that one\n"
          "  --tuned           also the winners recorded by `flashgen tune` in the kernel cache,\n"
          "                    as tuned choices per problem bucket (the kernel set above stays\n"
          "                    as fallbacks), for the live GPU or, with no GPU or with\n"
          "                    --all-devices, for every GPU in the cache. A winner is exported\n"
          "                    for the arch in its name, which must be one of the ARCHs.\n\n"
          "options:\n"
          "  --arch LIST       sm_80, sm_86, sm_89, sm_90, sm_90a, comma-separated (required)\n"
          "  --prefix NAME     a C identifier naming the files and the symbol (default 'exported')\n"
          "  -o DIR            output directory (created when missing)\n"
          "  -j N              compile on N threads (default: the online CPUs, %ld here)\n"
          "  --no-ptx          cubins only (smaller; GPUs newer than the ARCHs then cannot run it)\n"
          "  --all-devices     with --tuned: every GPU recorded in the cache, not the live one\n"
          "  --cache-dir DIR   with --tuned: the kernel cache directory\n"
          "  --dry-run         print the kernel set (one variant name a line) and the tuned\n"
          "                    choices, compile and write nothing (no NVRTC needed)\n"
          "  -q, --quiet       no progress on stderr\n\n"
          "exit status: 0 written; 1 failure (a kernel did not compile, no tuning records, a file\n"
          "could not be written; nothing is written then); 2 bad usage (unknown option or arch, a\n"
          "variant list that is empty or names a variant that does not parse or fit).\n",
          cpus > 0 ? cpus : 1);
}

#include "export_internal.h"


static int set_add_kernel(export_set *s, const fg_variant *v) {
  char name[FG_VARIANT_NAME_MAX];
  if (fg_variant_name(v, name, sizeof name) < 0) return -1;
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->k[i].name, name) == 0) return 0;
  if (s->n == s->cap) {
    int nc = s->cap ? 2 * s->cap : 256;
    export_kernel *nk = realloc(s->k, (size_t)nc * sizeof *nk);
    if (!nk) return -1;
    s->k = nk;
    s->cap = nc;
  }
  memset(&s->k[s->n], 0, sizeof s->k[s->n]);
  s->k[s->n].v = *v;
  snprintf(s->k[s->n].name, sizeof s->k[s->n].name, "%s", name);
  s->n++;
  return 0;
}

static int cmp_kernel(const void *a, const void *b) {
  return strcmp(((const export_kernel *)a)->name, ((const export_kernel *)b)->name);
}

static int cmp_choice(const void *a, const void *b) {
  const export_choice *x = a, *y = b;
  int c = strcmp(x->bucket, y->bucket);
  return c ? c : strcmp(x->variant, y->variant);
}

static void set_free(export_set *s) {
  for (int i = 0; i < s->n; i++) {
    fg_kernel_image_free(&s->k[i].img);
    free(s->k[i].err);
  }
  free(s->k);
  free(s->c);
}

/* ------------------------------------------------------------------------------------------ */
/* --variants FILE. A list names at most a few thousand variants: anything longer than this is
 * not a list (e.g. /dev/zero, which would otherwise be read forever). */
#define VARIANT_LIST_MAX (1 << 20)

/* Reads all of path (at most VARIANT_LIST_MAX bytes) into a malloc'd NUL-terminated buffer.
 * Returns 0, or 2 with the message printed. */
static int slurp_variant_list(const char *path, char **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "flashgen export: cannot read the variant list %s: %s\n", path, strerror(errno));
    return 2;
  }
  char *buf = malloc(VARIANT_LIST_MAX + 2);
  if (!buf) {
    fclose(f);
    fprintf(stderr, "flashgen export: out of memory\n");
    return 1;
  }
  /* One byte more than the limit tells a file of exactly the limit from a longer one. */
  size_t n = fread(buf, 1, VARIANT_LIST_MAX + 1, f);
  int rerr = ferror(f);
  fclose(f);
  if (rerr) {
    fprintf(stderr, "flashgen export: error reading the variant list %s\n", path);
    free(buf);
    return 1;
  }
  if (n > VARIANT_LIST_MAX) {
    fprintf(stderr, "flashgen export: the variant list %s is larger than %d bytes (1 MiB), the "
                    "limit for a list of variant names; give a text file with one canonical name "
                    "per line\n", path, VARIANT_LIST_MAX);
    free(buf);
    return 2;
  }
  const char *nul = memchr(buf, '\0', n);
  if (nul) {
    fprintf(stderr, "flashgen export: the variant list %s is not a text file (a NUL byte at "
                    "offset %zu); give one canonical name per line\n", path, (size_t)(nul - buf));
    free(buf);
    return 2;
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

/* --variants FILE. Returns 0, or 2 with the message printed (naming the file and line). */
static int read_variant_list(const char *path, const fg_arch *archs, int narch, export_set *s,
                             int *nnames) {
  char *text;
  int rc = slurp_variant_list(path, &text);
  if (rc) return rc;
  int lineno = 0, names = 0;
  fg_generator *g = NULL;
  char gerr[4096];
  for (char *next = text; next;) {
    /* Lines one by one, empty ones included (strtok_r would skip them and miscount). */
    char *line = next;
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    next = nl ? nl + 1 : NULL;
    if (!nl && !*line) break;
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *p = line;
    while (isspace((unsigned char)*p)) p++;
    char *e = p + strlen(p);
    while (e > p && isspace((unsigned char)e[-1])) *--e = 0;
    if (!*p) continue;
    fg_variant v;
    char err[512];
    if (fg_variant_parse(p, &v, err, sizeof err) != 0 || fg_variant_check(&v, err, sizeof err) != 0) {
      fprintf(stderr, "flashgen export: %s:%d: '%.160s' is not a variant: %s\n", path, lineno, p,
              err);
      rc = 2;
      break;
    }
    if (!g && fg_generator_create(&g, gerr, sizeof gerr) != 0) {
      fprintf(stderr, "flashgen export: cannot load the templates: %s\n", gerr);
      rc = 1;
      break;
    }
    for (int a = 0; a < narch && rc == 0; a++) {
      v.arch = archs[a];
      char why[512];
      int fits = fg_variant_fits(g, &v, fg_limits_for_arch(archs[a]), why, sizeof why);
      if (fits != 1) {
        char name[FG_VARIANT_NAME_MAX];
        fg_variant_name(&v, name, sizeof name);
        fprintf(stderr, "flashgen export: %s:%d: '%s' as %s %s: %s\n", path, lineno, p, name,
                fits == 0 ? "does not fit" : "is rejected by its template", why);
        rc = 2;
      } else if (set_add_kernel(s, &v) != 0) {
        fprintf(stderr, "flashgen export: out of memory\n");
        rc = 1;
      }
    }
    if (rc) break;
    names++;
  }
  free(text);
  fg_generator_destroy(g);
  if (!rc && names == 0) {
    fprintf(stderr,
            "flashgen export: the variant list %s names no variant (%d line%s, all empty or "
            "comments); write one canonical name per line, e.g.\n"
            "  fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80\n",
            path, lineno, lineno == 1 ? "" : "s");
    rc = 2;
  }
  *nnames = names;
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* --tuned: the winners in the cache. */
typedef struct tuned_ctx {
  export_set *s;
  const fg_device_id *dev;
  const fg_arch *archs;
  int narch;
  int skipped, bad, dup;
  int quiet;
} tuned_ctx;

static void device_label(const fg_device_id *d, char *buf, size_t len) {
  snprintf(buf, len, "%.127s (cc %d.%d, %d SMs)", d->name, d->cc_major, d->cc_minor, d->sm_count);
}

static void tuned_cb(void *ud, const char *bucket, const char *winner, double tflops) {
  (void)tflops;
  tuned_ctx *t = ud;
  export_set *s = t->s;
  fg_variant v;
  char err[256];
  if (fg_variant_parse(winner, &v, err, sizeof err) != 0) {
    if (!t->quiet)
      fprintf(stderr, "flashgen export: note: ignoring the record for %s on %s: '%s' is not a "
                      "variant (%s)\n", bucket, t->dev->name, winner, err);
    t->bad++;
    return;
  }
  int wanted = 0;
  for (int a = 0; a < t->narch; a++) wanted |= t->archs[a] == v.arch;
  if (!wanted) {
    t->skipped++;
    return;
  }
  for (int i = 0; i < s->nc; i++) {
    fg_variant o;
    if (strcmp(s->c[i].bucket, bucket) == 0 &&
        fg_variant_parse(s->c[i].variant, &o, err, sizeof err) == 0 && o.arch == v.arch) {
      if (!t->quiet && strcmp(s->c[i].variant, winner) != 0)
        fprintf(stderr, "flashgen export: note: %s for %s: keeping %s (tuned on %s), not %s "
                        "(tuned on %s)\n", bucket, fg_arch_name(v.arch), s->c[i].variant,
                s->c[i].device, winner, t->dev->name);
      t->dup++;
      return;
    }
  }
  if (s->nc == s->capc) {
    int nc = s->capc ? 2 * s->capc : 64;
    export_choice *n = realloc(s->c, (size_t)nc * sizeof *n);
    if (!n) return;
    s->c = n;
    s->capc = nc;
  }
  export_choice *c = &s->c[s->nc++];
  memset(c, 0, sizeof *c);
  snprintf(c->bucket, sizeof c->bucket, "%s", bucket);
  snprintf(c->variant, sizeof c->variant, "%s", winner);
  device_label(t->dev, c->device, sizeof c->device);
  set_add_kernel(s, &v);
}

/* Every device with tuning records, read off fg_cache_list_tuning's lines
 * ("NAME (cc M.m, N SMs, driver D) BUCKET WINNER ..."). Returns the count (at most cap). */
static int cache_devices(fg_cache *c, fg_device_id *out, int cap) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return 0;
  int rows = fg_cache_list_tuning(c, f);
  fclose(f);
  int n = 0;
  char *save = NULL;
  for (char *line = rows > 0 ? strtok_r(buf, "\n", &save) : NULL; line;
       line = strtok_r(NULL, "\n", &save)) {
    char *cc = strstr(line, " (cc ");
    if (!cc) continue;
    fg_device_id d;
    memset(&d, 0, sizeof d);
    if (sscanf(cc, " (cc %d.%d, %d SMs, driver %d)", &d.cc_major, &d.cc_minor, &d.sm_count,
               &d.driver_version) != 4)
      continue;
    size_t nl = (size_t)(cc - line);
    if (nl >= sizeof d.name) nl = sizeof d.name - 1;
    memcpy(d.name, line, nl);
    int seen = 0;
    for (int i = 0; i < n; i++)
      seen |= strcmp(out[i].name, d.name) == 0 && out[i].cc_major == d.cc_major &&
              out[i].cc_minor == d.cc_minor && out[i].sm_count == d.sm_count &&
              out[i].driver_version == d.driver_version;
    if (!seen && n < cap) out[n++] = d;
  }
  free(buf);
  return n;
}

static int cmp_device(const void *a, const void *b) {
  const fg_device_id *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  if (x->cc_major != y->cc_major) return x->cc_major - y->cc_major;
  if (x->cc_minor != y->cc_minor) return x->cc_minor - y->cc_minor;
  if (x->sm_count != y->sm_count) return x->sm_count - y->sm_count;
  return x->driver_version - y->driver_version;
}

/* The live GPU's identity as the cache records it; 0 when there is one. */
static int live_device_id(fg_device_id *out) {
  fg_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.quiet = 1;
  o.no_disk_cache = 1;
  fg_context *ctx;
  if (fg_context_create(&ctx, &o) != FG_OK) return -1;
  fg_context_device_id(ctx, out);
  fg_context_destroy(ctx);
  return 0;
}

/* Fills the choices from the cache; writes the "tuned on" text. Returns 0 or an exit status. */
static int collect_tuned(const char *cache_dir, int all_devices, const fg_arch *archs, int narch,
                         int quiet, export_set *s, char *tuned_on, size_t tuned_len) {
  char warn[1024] = "";
  fg_cache *c = fg_cache_open(cache_dir, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "flashgen export: --tuned: the kernel cache cannot be opened: %s\n", warn);
    return 1;
  }
  fg_device_id devs[64];
  int ndev = 0;
  const char *scope;
  if (!all_devices && live_device_id(&devs[0]) == 0) {
    ndev = 1;
    scope = "the live GPU";
  } else {
    ndev = cache_devices(c, devs, 64);
    qsort(devs, (size_t)ndev, sizeof devs[0], cmp_device);
    scope = all_devices ? "every GPU in the cache" : "every GPU in the cache (no live GPU)";
  }
  tuned_on[0] = 0;
  int total = 0, skipped = 0;
  for (int i = 0; i < ndev; i++) {
    tuned_ctx t = {s, &devs[i], archs, narch, 0, 0, 0, quiet};
    int before = s->nc;
    fg_cache_each_winner(c, &devs[i], NULL, tuned_cb, &t);
    skipped += t.skipped;
    if (s->nc > before || t.dup) {
      char label[256];
      device_label(&devs[i], label, sizeof label);
      size_t l = strlen(tuned_on);
      snprintf(tuned_on + l, tuned_len - l, "%s%s", l ? "; " : "", label);
    }
    total += s->nc - before;
  }
  if (total == 0) {
    char label[300] = "";
    if (ndev == 1 && !all_devices && strcmp(scope, "the live GPU") == 0) {
      label[0] = ' ';
      device_label(&devs[0], label + 1, sizeof label - 1);
    }
    fprintf(stderr,
            "flashgen export: --tuned: the kernel cache %s has no tuning record for %s%s%s; run "
            "`flashgen tune` on the GPU first, or export without --tuned\n",
            fg_cache_path(c), scope, label,
            skipped ? " for the requested arches (it has records for other arches)" : "");
    fg_cache_close(c);
    return 1;
  }
  if (!quiet)
    fprintf(stderr, "flashgen export: %d tuned choice%s from %s (%s) in %s%s\n", total,
            total == 1 ? "" : "s", scope, tuned_on, fg_cache_path(c),
            skipped ? "; records for other arches skipped" : "");
  fg_cache_close(c);
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Compiling (fg_compile_pool): the progress line. */
typedef struct build_progress {
  int n, quiet;
} build_progress;

static void build_done(void *arg, int i, int ndone) {
  (void)i;
  const build_progress *p = arg;
  if (!p->quiet && (ndone % 16 == 0 || ndone == p->n))
    fprintf(stderr, "\rflashgen export: compiled %d of %d", ndone, p->n);
  if (!p->quiet && ndone == p->n) fputc('\n', stderr);
}

/* Compiles every kernel of s on `jobs` threads into its img (built, err). Returns 0, or -1 out
 * of memory (nothing built). */
static int build_all(fg_generator *g, export_set *s, int jobs, int quiet) {
  fg_compile_item *items = calloc((size_t)s->n + 1, sizeof *items);
  if (!items) return -1;
  for (int i = 0; i < s->n; i++) items[i].v = s->k[i].v;
  build_progress pr = {s->n, quiet};
  fg_compile_pool(g, items, s->n, jobs, build_done, &pr);
  for (int i = 0; i < s->n; i++) {
    s->k[i].built = items[i].ok;
    s->k[i].img = items[i].img;
    s->k[i].err = items[i].log;
  }
  free(items);
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
static int valid_identifier(const char *s) {
  if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return 0;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return 0;
  return 1;
}

static int mkdir_p(const char *dir) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", dir);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
  struct stat st;
  return stat(tmp, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

int fg_cmd_export(int argc, char **argv) {
  const char *arch_list = NULL, *variants_file = NULL, *outdir = NULL, *prefix = "exported";
  const char *cache_dir = NULL;
  int mode_default = 0, mode_tuned = 0, all_devices = 0, quiet = 0, with_ptx = 1;
  int with_backward = 1, dry_run = 0;
  long jobs = sysconf(_SC_NPROCESSORS_ONLN);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const int has_next = i + 1 < argc;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      export_usage(stdout);
      return 0;
    } else if (strcmp(a, "--arch") == 0 && has_next) arch_list = argv[++i];
    else if (strncmp(a, "--arch=", 7) == 0) arch_list = a + 7;
    else if (strcmp(a, "--default") == 0) mode_default = 1;
    else if (strcmp(a, "--tuned") == 0) mode_tuned = 1;
    else if (strcmp(a, "--variants") == 0 && has_next) variants_file = argv[++i];
    else if (strncmp(a, "--variants=", 11) == 0) variants_file = a + 11;
    else if (strcmp(a, "--prefix") == 0 && has_next) prefix = argv[++i];
    else if (strncmp(a, "--prefix=", 9) == 0) prefix = a + 9;
    else if (strcmp(a, "-o") == 0 && has_next) outdir = argv[++i];
    else if (strcmp(a, "-j") == 0 && has_next) jobs = strtol(argv[++i], NULL, 10);
    else if (strncmp(a, "-j", 2) == 0 && a[2]) jobs = strtol(a + 2, NULL, 10);
    else if (strcmp(a, "--no-ptx") == 0) with_ptx = 0;
    else if (strcmp(a, "--no-backward") == 0) with_backward = 0;
    else if (strcmp(a, "--dry-run") == 0) dry_run = 1;
    else if (strcmp(a, "--all-devices") == 0) all_devices = 1;
    else if (strcmp(a, "--cache-dir") == 0 && has_next) cache_dir = argv[++i];
    else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) quiet = 1;
    else {
      fprintf(stderr, "flashgen export: unknown option or missing value '%s' (see flashgen export "
                      "--help)\n", a);
      return 2;
    }
  }
  if (mode_default && variants_file) {
    fprintf(stderr, "flashgen export: --default and --variants FILE both name the kernel set; "
                    "choose one\n");
    return 2;
  }
  if (!with_backward && variants_file) {
    fprintf(stderr, "flashgen export: --no-backward applies to the default set; with --variants "
                    "FILE, list only the variants you want (bwd_... names are the backward)\n");
    return 2;
  }
  if (!arch_list || !*arch_list) {
    fprintf(stderr, "flashgen export: --arch is required (e.g. --arch sm_80,sm_90a)\n");
    return 2;
  }
  if (!dry_run && (!outdir || !*outdir)) {
    fprintf(stderr, "flashgen export: -o DIR is required\n");
    return 2;
  }
  if (!valid_identifier(prefix) || strlen(prefix) > 64) {
    fprintf(stderr, "flashgen export: --prefix '%s' is not a C identifier of at most 64 "
                    "characters (letters, digits, '_', not starting with a digit)\n", prefix);
    return 2;
  }
  if (jobs < 1) jobs = 1;
  if (jobs > 64) jobs = 64;

  /* The arches, in a fixed order whatever the order given. */
  int want[FG_ARCH_COUNT] = {0};
  {
    fg_arch given[FG_ARCH_COUNT];
    int ngiven = 0;
    if (fg_cli_arch_list("export", arch_list, given, &ngiven) != 0) return 2;
    for (int i = 0; i < ngiven; i++) want[given[i]] = 1;
  }
  fg_arch archs[EXPORT_MAX_ARCHS];
  int narch = 0;
  export_info in;
  memset(&in, 0, sizeof in);
  for (int a = 0; a < FG_ARCH_COUNT; a++)
    if (want[a]) {
      archs[narch++] = (fg_arch)a;
      size_t l = strlen(in.archs);
      snprintf(in.archs + l, sizeof in.archs - l, "%s%s", l ? "," : "", fg_arch_name((fg_arch)a));
    }

  export_set s;
  memset(&s, 0, sizeof s);
  int rc = 0, nnames = 0;
  char tuned_on[1024] = "", mode_line[64], fallbacks[256];
  if (mode_tuned)
    rc = collect_tuned(cache_dir, all_devices, archs, narch, quiet, &s, tuned_on, sizeof tuned_on);
  if (rc == 0 && variants_file) {
    rc = read_variant_list(variants_file, archs, narch, &s, &nnames);
    snprintf(fallbacks, sizeof fallbacks, "the listed kernels (%d names x %d arch%s)", nnames,
             narch, narch == 1 ? "" : "es");
  } else if (rc == 0) {
    snprintf(fallbacks, sizeof fallbacks,
             "the built-in rule's %s for every head_dim 32..256, f16/bf16, causal or not",
             with_backward ? "forward and backward variants" : "forward variant");
    for (int a = 0; a < narch && rc == 0; a++) {
      fg_variant v[FG_DEFAULT_VARIANTS_MAX];
      int n = fg_default_variants(archs[a], 0, v, FG_DEFAULT_VARIANTS_MAX);
      for (int i = 0; i < n && rc == 0; i++)
        if (set_add_kernel(&s, &v[i]) != 0) rc = 1;
      /* The backward of the same problems: what fg_attention_backward runs by the rule. */
      n = with_backward ? fg_default_backward_variants(archs[a], v, FG_DEFAULT_VARIANTS_MAX) : 0;
      for (int i = 0; i < n && rc == 0; i++)
        if (set_add_kernel(&s, &v[i]) != 0) rc = 1;
    }
    if (rc) fprintf(stderr, "flashgen export: out of memory\n");
  }
  snprintf(mode_line, sizeof mode_line, "%s%s%s", mode_tuned ? "--tuned " : "",
           variants_file ? "--variants LIST" : "--default",
           !variants_file && !with_backward ? " --no-backward" : "");
  if (rc) {
    set_free(&s);
    return rc;
  }
  qsort(s.k, (size_t)s.n, sizeof *s.k, cmp_kernel);
  if (s.nc) qsort(s.c, (size_t)s.nc, sizeof *s.c, cmp_choice);
  if (dry_run) { /* a variant list (what --variants reads), the choices as comments */
    int nbwd = 0;
    for (int i = 0; i < s.n; i++) nbwd += s.k[i].v.pass == FG_PASS_BWD;
    printf("# flashgen export %s --arch %s: %d kernels (%d forward, %d backward), %d tuned "
           "choices\n", mode_line, in.archs, s.n, s.n - nbwd, nbwd, s.nc);
    for (int i = 0; i < s.n; i++) printf("%s\n", s.k[i].name);
    for (int i = 0; i < s.nc; i++)
      printf("# choice %s -> %s (tuned on %s)\n", s.c[i].bucket, s.c[i].variant, s.c[i].device);
    set_free(&s);
    return ferror(stdout) ? 1 : 0;
  }

  char err[4096];
  if (fg_nvrtc_load(err, sizeof err) != 0) {
    fprintf(stderr, "flashgen export: NVRTC is needed to compile the kernels: %s\n", err);
    set_free(&s);
    return 1;
  }
  fg_generator *g;
  if (fg_generator_create(&g, err, sizeof err) != 0) {
    fprintf(stderr, "flashgen export: cannot load the templates: %s\n", err);
    set_free(&s);
    return 1;
  }
  snprintf(in.template_hash, sizeof in.template_hash, "%016llx",
           (unsigned long long)fg_generator_template_hash(g));
  in.nvrtc_version = fg_nvrtc_version();
  if (!quiet)
    fprintf(stderr, "flashgen export: compiling %d kernels for %s with NVRTC %d.%d on %ld threads\n",
            s.n, in.archs, in.nvrtc_version / 1000, (in.nvrtc_version % 1000) / 10, jobs);
  if (build_all(g, &s, (int)jobs, quiet) != 0) {
    fprintf(stderr, "flashgen export: out of memory\n");
    fg_generator_destroy(g);
    set_free(&s);
    return 1;
  }
  fg_generator_destroy(g);
  int failed = 0;
  for (int i = 0; i < s.n; i++) {
    char why[512];
    const char *bad = NULL;
    if (!s.k[i].built) {
      fprintf(stderr, "flashgen export: %s did not compile: %s\n", s.k[i].name,
              s.k[i].err ? s.k[i].err : "(no message)");
      failed++;
    } else if ((bad = fg_export_check_contract(&s.k[i], why, sizeof why)) != NULL) {
      fprintf(stderr, "flashgen export: %s %s; the templates and this flashgen disagree (check "
                      "FLASHGEN_TEMPLATE_DIR)\n", s.k[i].name, bad);
      failed++;
    }
  }
  if (failed) {
    fprintf(stderr, "flashgen export: %d of %d kernels did not compile or check; nothing written\n",
            failed, s.n);
    set_free(&s);
    return 1;
  }

  in.prefix = prefix;
  in.mode_line = mode_line;
  in.tuned_on = tuned_on;
  in.fallbacks = fallbacks;
  in.with_ptx = with_ptx;
  char desc[1536];
  snprintf(desc, sizeof desc,
           "%s: flashgen %s export %s, %d kernels for %s, templates %s, NVRTC %d.%d, tuning: %s",
           prefix, fg_version(), mode_line, s.n, in.archs, in.template_hash,
           in.nvrtc_version / 1000, (in.nvrtc_version % 1000) / 10,
           tuned_on[0] ? tuned_on : "none: built-in rule");
  char cname[128], hname[128], cpath[4352], hpath[4352];
  snprintf(cname, sizeof cname, "%s_kernels.c", prefix);
  snprintf(hname, sizeof hname, "%s_kernels.h", prefix);
  if (mkdir_p(outdir) != 0) {
    fprintf(stderr, "flashgen export: cannot create the directory %s: %s\n", outdir, strerror(errno));
    set_free(&s);
    return 1;
  }
  if (fg_export_write(outdir, cname, hname, desc, &in, &s, cpath, sizeof cpath, hpath,
                      sizeof hpath) != 0) {
    set_free(&s);
    return 1;
  }
  size_t cubin = 0, ptx = 0;
  int nbwd = 0;
  for (int i = 0; i < s.n; i++) {
    cubin += s.k[i].img.cubin_size;
    ptx += with_ptx ? s.k[i].img.ptx_size + 1 : 0;
    nbwd += s.k[i].v.pass == FG_PASS_BWD;
  }
  struct stat st;
  long long csize = stat(cpath, &st) == 0 ? (long long)st.st_size : -1;
  printf("wrote %s (%lld bytes) and %s: %d kernels for %s (%d forward, %d backward; %zu bytes of "
         "cubin, %zu of PTX), %d tuned choices\n",
         cpath, csize, hpath, s.n, in.archs, s.n - nbwd, nbwd, cubin, ptx, s.nc);
  set_free(&s);
  return 0;
}
