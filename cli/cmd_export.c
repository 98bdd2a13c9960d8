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

/* ------------------------------------------------------------------------------------------ */
/* The set being exported. */
typedef struct export_kernel {
  fg_variant v;
  char name[FG_VARIANT_NAME_MAX];
  fg_kernel_image img;
  char *err; /* compile error, malloc'd */
  int built;
} export_kernel;

typedef struct export_choice {
  char bucket[96];
  char variant[FG_VARIANT_NAME_MAX];
  char device[256];
} export_choice;

typedef struct export_set {
  export_kernel *k;
  int n, cap;
  export_choice *c;
  int nc, capc;
} export_set;

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
/* Writing. */
static void write_bytes(FILE *f, const unsigned char *b, size_t n, int nul) {
  static const char hex[] = "0123456789abcdef";
  char line[16 * 6 + 4];
  size_t total = n + (nul ? 1 : 0);
  for (size_t i = 0; i < total; i += 16) {
    char *p = line;
    *p++ = ' ';
    *p++ = ' ';
    for (size_t j = i; j < i + 16 && j < total; j++) {
      unsigned char c = j < n ? b[j] : 0;
      if (j > i) *p++ = ' ';
      *p++ = '0';
      *p++ = 'x';
      *p++ = hex[c >> 4];
      *p++ = hex[c & 15];
      *p++ = ',';
    }
    *p++ = '\n';
    fwrite(line, 1, (size_t)(p - line), f);
  }
}

/* A C string literal of s (ASCII; escapes quotes, backslashes and anything unprintable). */
static void write_cstr(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '?') fputs("\\?", f); /* no trigraphs */
    else if (c < 32 || c > 126) fprintf(f, "\\%03o", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

typedef struct export_info {
  const char *prefix;
  const char *mode_line;  /* how it was asked for, normalised (no paths) */
  char archs[128];        /* "sm_80, sm_90a" */
  char template_hash[17];
  int nvrtc_version;
  const char *tuned_on;   /* "" -> none */
  const char *fallbacks;
  int with_ptx;
} export_info;

static void write_banner(FILE *f, const char *file, const char *what, const export_info *in,
                         const export_set *s) {
  fprintf(f,
          "/* %s: %s. Do not edit.\n"
          " *\n"
          " * Produced by flashgen %s: flashgen export %s --arch %s --prefix %s%s\n"
          " * Template hash: %s\n"
          " * NVRTC: %d.%d\n"
          " * Tuning from: %s\n"
          " * Kernels: %d (%s), for %s; tuned choices: %d\n"
          " * Fallbacks: %s\n"
          " *\n"
          " * Regenerate it with the command above rather than editing it. Build it with your\n"
          " * sources (it needs include/flashgen.h and include/flashgen_export.h), link\n"
          " * flashgen_runtime, and register the table once:\n"
          " *     fg_register_export(%s_flashgen_export(), err, sizeof err); */\n",
          file, what, fg_version(), in->mode_line, in->archs, in->prefix,
          in->with_ptx ? "" : " --no-ptx", in->template_hash, in->nvrtc_version / 1000,
          (in->nvrtc_version % 1000) / 10, in->tuned_on[0] ? in->tuned_on : "none: built-in rule",
          s->n, in->with_ptx ? "cubin + PTX" : "cubin only", in->archs, s->nc, in->fallbacks,
          in->prefix);
}

static int write_header(FILE *f, const char *file, const export_info *in, const export_set *s) {
  char guard[160];
  size_t g = 0;
  for (const char *p = in->prefix; *p && g < sizeof guard - 16; p++)
    guard[g++] = (char)toupper((unsigned char)*p);
  snprintf(guard + g, sizeof guard - g, "_KERNELS_H");
  write_banner(f, file, "the declaration of a flashgen exported kernel table", in, s);
  fprintf(f,
          "#ifndef %s\n#define %s\n\n"
          "#include <flashgen.h>\n#include <flashgen_export.h>\n\n"
          "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
          "/* The exported table: %d kernels for %s, %d tuned choices. Static storage, valid for\n"
          " * the life of the process; pass it to fg_register_export. */\n"
          "const fg_export *%s_flashgen_export(void);\n\n"
          "#ifdef __cplusplus\n}\n#endif\n#endif /* %s */\n",
          guard, guard, s->n, in->archs, s->nc, in->prefix, guard);
  return ferror(f) ? -1 : 0;
}

/* The flashgen_export.h name of a grid kind; NULL for one the layout has no name for (checked
 * before anything is written). */
static const char *grid_name(fg_grid_kind g) {
  switch (g) {
    case FG_GRID_Q_TILES: return "FG_EXPORT_GRID_Q_TILES";
    case FG_GRID_HEADS: return "FG_EXPORT_GRID_HEADS";
    case FG_GRID_ROWS: return "FG_EXPORT_GRID_ROWS";
    case FG_GRID_KV_TILES: return "FG_EXPORT_GRID_KV_TILES";
  }
  return NULL;
}

/* Whether the PTX declares the kernel `name` (".entry name(" up to spacing). */
static int ptx_has_entry(const char *ptx, const char *name) {
  const size_t n = strlen(name);
  for (const char *p = ptx ? strstr(ptx, ".entry") : NULL; p; p = strstr(p + 1, ".entry")) {
    const char *q = p + 6;
    while (*q == ' ' || *q == '\t') q++;
    if (strncmp(q, name, n) == 0 && (q[n] == '(' || q[n] == ' ' || q[n] == '\t' || q[n] == '\n'))
      return 1;
  }
  return 0;
}

/* The names flashgen_export.h gives a parameter block and a map's tensor (NULL: none). */
static const char *params_name(fg_param_block p) {
  switch (p) {
    case FG_PARAMS_DEFAULT: return "FG_EXPORT_PARAMS_DEFAULT";
    case FG_PARAMS_FWD_TMA: return "FG_EXPORT_PARAMS_FWD_TMA";
  }
  return NULL;
}
static const char *tensor_name(fg_tmap_tensor t) {
  switch (t) {
    case FG_TMAP_Q: return "FG_EXPORT_TENSOR_Q";
    case FG_TMAP_K: return "FG_EXPORT_TENSOR_K";
    case FG_TMAP_V: return "FG_EXPORT_TENSOR_V";
    case FG_TMAP_O: return "FG_EXPORT_TENSOR_O";
  }
  return NULL;
}

/* Checks a compiled kernel's plan before it is written: well formed, grid kinds the layout
 * names, the main kernel's grid the pass's (the backward's K/V tiles), and every step's entry in
 * the module. NULL, or what is wrong. */
static const char *check_contract(const export_kernel *k, char *why, size_t whylen) {
  const fg_kernel_meta *m = &k->img.meta;
  const char *bad = fg_kernel_meta_invalid(m);
  if (bad) {
    snprintf(why, whylen, "has a malformed plan: %s", bad);
    return why;
  }
  for (int i = 0; i < m->n_steps; i++)
    if (!grid_name(m->steps[i].grid)) {
      snprintf(why, whylen, "has grid kind %d, which include/flashgen_export.h does not name",
               (int)m->steps[i].grid);
      return why;
    }
  const int bwd = k->v.pass == FG_PASS_BWD;
  if (!params_name(m->params) || (bwd && m->params != FG_PARAMS_DEFAULT)) {
    snprintf(why, whylen, "is a %s variant but its template declared parameter block %d",
             bwd ? "backward" : "forward", (int)m->params);
    return why;
  }
  const fg_plan_step *mk = fg_kernel_main(m);
  if (bwd != (mk->grid == FG_GRID_KV_TILES)) {
    snprintf(why, whylen, "is a %s variant but its template declared grid kind %d",
             bwd ? "backward" : "forward", (int)mk->grid);
    return why;
  }
  for (int i = 0; k->img.ptx && i < m->n_steps; i++)
    if (!ptx_has_entry(k->img.ptx, m->steps[i].entry)) {
      snprintf(why, whylen, "compiled to a module without the entry %s (step %d of its plan)",
               m->steps[i].entry, i + 1);
      return why;
    }
  return NULL;
}

/* fp32 floats per query row of a plan's workspaces, for runtimes from before plans (the
 * legacy workspace_floats_per_row: the forward's kv_outer reads it). */
static int legacy_floats_per_row(const fg_kernel_meta *m) {
  int n = 0;
  for (int i = 0; i < m->n_workspaces; i++)
    if (m->workspaces[i].rows == 1 && !m->workspaces[i].deterministic_only &&
        !m->workspaces[i].per_key && !m->workspaces[i].min_group_rows)
      n += m->workspaces[i].bytes / 4;
  return n;
}

static int write_source(FILE *f, const char *file, const char *hfile, const export_info *in,
                        const export_set *s, const char *desc) {
  const char *P = in->prefix;
  write_banner(f, file, "FlashAttention kernels exported by flashgen", in, s);
  fprintf(f, "#include \"%s\"\n\n", hfile);
  for (int i = 0; i < s->n; i++) {
    const export_kernel *k = &s->k[i];
    const fg_kernel_meta *m = &k->img.meta;
    fprintf(f, "/* %s (%s): %d threads, %d B dynamic shared memory, %d registers */\n", k->name,
            fg_arch_name(k->img.arch), fg_kernel_main(m)->threads, fg_kernel_main(m)->smem_bytes,
            m->regs);
    /* Its plan: the entries of its module in launch order, and its workspaces. */
    fprintf(f, "static const fg_export_step %s_%s_steps[%d] = {\n", P, k->name, m->n_steps);
    for (int j = 0; j < m->n_steps; j++) {
      const fg_plan_step *sp = &m->steps[j];
      fprintf(f, "    {.entry = ");
      write_cstr(f, sp->entry);
      fprintf(f, ", .grid = %s, .br = %d, .threads = %d, .smem_bytes = %d, .split_rows = %d},\n",
              grid_name(sp->grid), sp->br, sp->threads, sp->smem_bytes, sp->split_rows);
    }
    fprintf(f, "};\n");
    if (m->n_workspaces) {
      fprintf(f, "static const fg_export_workspace %s_%s_workspaces[%d] = {\n", P, k->name,
              m->n_workspaces);
      for (int j = 0; j < m->n_workspaces; j++) {
        const fg_plan_workspace *w = &m->workspaces[j];
        fprintf(f, "    {.name = ");
        write_cstr(f, w->name);
        fprintf(f, ", .param = ");
        write_cstr(f, w->param);
        fprintf(f,
                ", .bytes = %d, .rows = %d, .deterministic_only = %d, .per_key = %d,"
                " .min_group_rows = %lld},\n",
                w->bytes, w->rows, w->deterministic_only, w->per_key, w->min_group_rows);
      }
      fprintf(f, "};\n");
    }
    if (m->n_tmaps) {
      fprintf(f, "static const fg_export_tmap %s_%s_tmaps[%d] = {\n", P, k->name, m->n_tmaps);
      for (int j = 0; j < m->n_tmaps; j++)
        fprintf(f, "    {.tensor = %s, .rows = %d},\n", tensor_name(m->tmaps[j].tensor),
                m->tmaps[j].rows);
      fprintf(f, "};\n");
    }
    fprintf(f, "static const unsigned char %s_%s_cubin[%zu] = {\n", P, k->name, k->img.cubin_size);
    write_bytes(f, k->img.cubin, k->img.cubin_size, 0);
    fprintf(f, "};\n");
    if (in->with_ptx) {
      fprintf(f, "static const unsigned char %s_%s_ptx[%zu] = {\n", P, k->name, k->img.ptx_size + 1);
      write_bytes(f, (const unsigned char *)k->img.ptx, k->img.ptx_size, 1);
      fprintf(f, "};\n");
    }
    fprintf(f, "\n");
  }
  fprintf(f, "static const fg_export_kernel %s_kernels[%d] = {\n", P, s->n);
  for (int i = 0; i < s->n; i++) {
    const export_kernel *k = &s->k[i];
    const fg_kernel_meta *m = &k->img.meta;
    fprintf(f, "    {.variant = \"%s\",\n     .arch = \"%s\",\n", k->name, fg_arch_name(k->img.arch));
    fprintf(f, "     .cubin = %s_%s_cubin,\n     .cubin_size = sizeof %s_%s_cubin,\n", P, k->name, P,
            k->name);
    if (in->with_ptx)
      fprintf(f, "     .ptx = (const char *)%s_%s_ptx,\n     .ptx_size = sizeof %s_%s_ptx - 1,\n", P,
              k->name, P, k->name);
    else
      fprintf(f, "     .ptx = 0,\n     .ptx_size = 0,\n");
    const fg_plan_step *mk = fg_kernel_main(m);
    fprintf(f, "     .entry = ");
    write_cstr(f, mk->entry);
    fprintf(f,
            ",\n     .threads = %d,\n     .smem_bytes = %d,\n     .grid = %s,\n     .br = %d,\n"
            "     .workspace_floats_per_row = %d,\n     .regs = %d,\n     .spill_store_bytes = %d,\n"
            "     .spill_load_bytes = %d,\n     .stack_bytes = %d,\n",
            mk->threads, mk->smem_bytes, grid_name(mk->grid), mk->br, legacy_floats_per_row(m),
            m->regs, m->spill_store_bytes, m->spill_load_bytes, m->stack_bytes);
    fprintf(f, "     .steps = %s_%s_steps,\n     .n_steps = %d,\n     .main_step = %d,\n", P,
            k->name, m->n_steps, m->main_step);
    if (m->n_workspaces)
      fprintf(f, "     .workspaces = %s_%s_workspaces,\n     .n_workspaces = %d,\n", P, k->name,
              m->n_workspaces);
    else
      fprintf(f, "     .workspaces = 0,\n     .n_workspaces = 0,\n");
    fprintf(f, "     .params = %s,\n", params_name(m->params));
    if (m->n_tmaps)
      fprintf(f, "     .tmaps = %s_%s_tmaps,\n     .n_tmaps = %d},\n", P, k->name, m->n_tmaps);
    else
      fprintf(f, "     .tmaps = 0,\n     .n_tmaps = 0},\n");
  }
  fprintf(f, "};\n\n");
  if (s->nc) {
    fprintf(f, "/* Tuned choices: problem bucket -> variant, and the GPU it was measured on. */\n");
    fprintf(f, "static const fg_export_choice %s_choices[%d] = {\n", P, s->nc);
    for (int i = 0; i < s->nc; i++) {
      fprintf(f, "    {.bucket = \"%s\", .variant = \"%s\",\n     .device = ", s->c[i].bucket,
              s->c[i].variant);
      write_cstr(f, s->c[i].device);
      fprintf(f, "},\n");
    }
    fprintf(f, "};\n\n");
  }
  /* Version 2 when a kernel takes tensor maps: runtimes from before them refuse the table. */
  int tma = 0;
  for (int i = 0; i < s->n; i++) tma |= s->k[i].img.meta.params != FG_PARAMS_DEFAULT;
  fprintf(f, "static const fg_export %s_export = {\n", P);
  fprintf(f, "    .abi_version = %s,\n    .size = sizeof(fg_export),\n"
             "    .kernel_size = sizeof(fg_export_kernel),\n"
             "    .choice_size = sizeof(fg_export_choice),\n    .description = ",
          tma ? "FG_EXPORT_ABI_VERSION_TMA" : "FG_EXPORT_ABI_VERSION");
  write_cstr(f, desc);
  fprintf(f, ",\n    .flashgen_version = ");
  write_cstr(f, fg_version());
  fprintf(f, ",\n    .template_hash = \"%s\",\n    .nvrtc_version = %d,\n    .tuned_on = ",
          in->template_hash, in->nvrtc_version);
  write_cstr(f, in->tuned_on[0] ? in->tuned_on : "none: built-in rule");
  fprintf(f, ",\n    .kernels = %s_kernels,\n    .n_kernels = %d,\n", P, s->n);
  if (s->nc)
    fprintf(f, "    .choices = %s_choices,\n    .n_choices = %d,\n", P, s->nc);
  else
    fprintf(f, "    .choices = 0,\n    .n_choices = 0,\n");
  fprintf(f, "    .step_size = sizeof(fg_export_step),\n"
             "    .workspace_desc_size = sizeof(fg_export_workspace),\n"
             "    .tmap_size = sizeof(fg_export_tmap)};\n\n");
  fprintf(f, "const fg_export *%s_flashgen_export(void) { return &%s_export; }\n", P, P);
  return ferror(f) ? -1 : 0;
}

/* Writes path through a temporary file in the same directory and a rename. */
static int write_file(const char *dir, const char *name, int (*fn)(FILE *, const void *),
                      const void *arg, char *final_path, size_t plen) {
  char tmp[4096];
  snprintf(final_path, plen, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp%ld", dir, name, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "flashgen export: cannot write %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  static char buf[1 << 20];
  setvbuf(f, buf, _IOFBF, sizeof buf);
  int rc = fn(f, arg);
  if (fclose(f) != 0) rc = -1;
  if (rc != 0 || rename(tmp, final_path) != 0) {
    fprintf(stderr, "flashgen export: cannot write %s: %s\n", final_path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

typedef struct write_args {
  const char *file, *hfile, *desc;
  const export_info *in;
  const export_set *s;
} write_args;

static int write_h_cb(FILE *f, const void *arg) {
  const write_args *w = arg;
  return write_header(f, w->hfile, w->in, w->s);
}

static int write_c_cb(FILE *f, const void *arg) {
  const write_args *w = arg;
  return write_source(f, w->file, w->hfile, w->in, w->s, w->desc);
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
      fg_variant v[512];
      int n = fg_default_variants(archs[a], 0, v, 512);
      for (int i = 0; i < n && rc == 0; i++)
        if (set_add_kernel(&s, &v[i]) != 0) rc = 1;
      /* The backward of the same problems: what fg_attention_backward runs by the rule. */
      n = with_backward ? fg_default_backward_variants(archs[a], v, 512) : 0;
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
    } else if ((bad = check_contract(&s.k[i], why, sizeof why)) != NULL) {
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
  write_args w = {cname, hname, desc, &in, &s};
  if (write_file(outdir, hname, write_h_cb, &w, hpath, sizeof hpath) != 0 ||
      write_file(outdir, cname, write_c_cb, &w, cpath, sizeof cpath) != 0) {
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
