/* nvrtc.c: NVRTC loaded with dlopen ($FLASHGEN_NVRTC_LIBRARY, libnvrtc.so.13, libnvrtc.so.12),
 * compilation of generated source to cubin + PTX, the resource usage ptxas reports, and compile
 * errors located in both the template (through the source's #line directives) and the
 * generated source. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_gen.h"

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
  void *lib;
  char path[512];
  char err[2048];
  int version;
  const char *(*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int *, int *);
  nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                               const char *const *, const char *const *);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetPTX)(nvrtcProgram, char *);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void) {
  const char *override = getenv("FLASHGEN_NVRTC_LIBRARY");
  const char *candidates[] = {"libnvrtc.so.13", "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so.13",
                              "/usr/local/cuda/lib64/libnvrtc.so.12", NULL};
  size_t w = 0;
  if (override && *override) {
    nv.lib = dlopen(override, RTLD_NOW | RTLD_LOCAL);
    if (nv.lib) snprintf(nv.path, sizeof nv.path, "%s", override);
    else
      w += (size_t)snprintf(nv.err + w, sizeof nv.err - w, "FLASHGEN_NVRTC_LIBRARY=%s: %s", override,
                            dlerror());
  } else {
    for (const char **c = candidates; *c && !nv.lib; c++) {
      nv.lib = dlopen(*c, RTLD_NOW | RTLD_LOCAL);
      if (nv.lib) snprintf(nv.path, sizeof nv.path, "%s", *c);
      else if (w < sizeof nv.err)
        w += (size_t)snprintf(nv.err + w, sizeof nv.err - w, "%s%s", w ? ", " : "tried ", *c);
    }
  }
  if (!nv.lib) {
    if (w < sizeof nv.err)
      snprintf(nv.err + w, sizeof nv.err - w,
               ". Install the CUDA Toolkit's NVRTC (12 or 13), add its lib directory to "
               "LD_LIBRARY_PATH, or set FLASHGEN_NVRTC_LIBRARY to the library's path");
    return;
  }
#define SYM(field, name)                                                                  \
  do {                                                                                    \
    *(void **)(&nv.field) = dlsym(nv.lib, name);                                          \
    if (!nv.field) {                                                                      \
      snprintf(nv.err, sizeof nv.err, "%s has no symbol %s: not an NVRTC library", nv.path, name); \
      dlclose(nv.lib);                                                                    \
      nv.lib = NULL;                                                                      \
      return;                                                                             \
    }                                                                                     \
  } while (0)
  SYM(GetErrorString, "nvrtcGetErrorString");
  SYM(Version, "nvrtcVersion");
  SYM(CreateProgram, "nvrtcCreateProgram");
  SYM(DestroyProgram, "nvrtcDestroyProgram");
  SYM(CompileProgram, "nvrtcCompileProgram");
  SYM(GetPTXSize, "nvrtcGetPTXSize");
  SYM(GetPTX, "nvrtcGetPTX");
  SYM(GetCUBINSize, "nvrtcGetCUBINSize");
  SYM(GetCUBIN, "nvrtcGetCUBIN");
  SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
  SYM(GetProgramLog, "nvrtcGetProgramLog");
#undef SYM
  int major = 0, minor = 0;
  nv.Version(&major, &minor);
  nv.version = major * 1000 + minor * 10;
}

int fg_nvrtc_load(char *err, size_t errlen) {
  pthread_once(&nv_once, nv_load);
  if (!nv.lib) {
    snprintf(err, errlen, "NVRTC could not be loaded: %s", nv.err);
    return -1;
  }
  return 0;
}

static void *preload_thread(void *arg) {
  (void)arg;
  pthread_once(&nv_once, nv_load);
  return NULL;
}

static pthread_once_t preload_once = PTHREAD_ONCE_INIT;
static atomic_int preload_started;
static void preload_start(void) {
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &at, preload_thread, NULL) == 0) atomic_store(&preload_started, 1);
  /* (no thread: NVRTC loads on first use) */
  pthread_attr_destroy(&at);
}

void fg_nvrtc_preload(void) { pthread_once(&preload_once, preload_start); }

/* pthread_once returns once the thread's call has (and loads NVRTC here only if the thread has
 * not begun). */
void fg_nvrtc_preload_wait(void) {
  if (atomic_load(&preload_started)) pthread_once(&nv_once, nv_load);
}

int fg_nvrtc_version(void) { return nv.lib ? nv.version : 0; }
const char *fg_nvrtc_path(void) { return nv.lib ? nv.path : ""; }

/* Reads "Used N registers", "N bytes stack frame, N bytes spill stores, N bytes spill loads"
 * from ptxas's verbose output in the NVRTC log. */
/* Reads the resource usage of the plan's main kernel from ptxas's -v log: the lines after
 * "Function properties for <entry>" (a module with several entries reports each; their order is
 * ptxas's), else the first function's. */
static void parse_ptxas(const char *log, fg_kernel_meta *m) {
  char key[sizeof m->steps[0].entry + 32];
  snprintf(key, sizeof key, "Function properties for %s\n", fg_kernel_main(m)->entry);
  const char *from = strstr(log, key);
  if (!from) from = log;
  const char *p = strstr(from, "bytes stack frame");
  if (p) {
    const char *s = p;
    while (s > log && s[-1] != '\n' && s[-1] != '.') s--;
    sscanf(s, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &m->stack_bytes,
           &m->spill_store_bytes, &m->spill_load_bytes);
  }
  p = strstr(from, "Used ");
  if (p) sscanf(p, "Used %d registers", &m->regs);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *dupf(const char *fmt, const char *a, const char *b, const char *c, const char *d) {
  size_t n = strlen(fmt) + strlen(a) + strlen(b) + strlen(c) + strlen(d) + 1;
  char *s = malloc(n);
  snprintf(s, n, fmt, a, b, c, d);
  return s;
}

/* Follows src's lines and #line directives. With gen > 0: the template file and line of
 * generated line gen (file "" when no directive precedes it). Otherwise: the generated lines
 * that come from file:line (up to max, in out) and how many there are. */
static int walk_lines(const char *src, int gen, const char *file, int line, char *fout,
                      size_t foutlen, int *out, int max) {
  char cur[256] = "";
  int cur_line = 0, found = 0, g = 1;
  for (const char *p = src; *p; g++) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    int n;
    char f[256];
    if (gen > 0 && g == gen) {
      snprintf(fout, foutlen, "%s", cur);
      return cur_line;
    }
    if (len > 6 && strncmp(p, "#line ", 6) == 0 && sscanf(p + 6, "%d \"%255[^\"\n]\"", &n, f) == 2) {
      snprintf(cur, sizeof cur, "%s", f);
      cur_line = n;
    } else {
      if (gen <= 0 && cur_line == line && strcmp(cur, file) == 0) {
        if (found < max) out[found] = g;
        found++;
      }
      if (cur_line) cur_line++;
    }
    if (!nl) break;
    p = nl + 1;
  }
  return gen > 0 ? 0 : found;
}

/* For each diagnostic "FILE(LINE): ..." in log, a line "  template:line (generated line G):
 * ...": NVRTC names the template where the source has #line directives, the generated source
 * (program) otherwise; the other side is found from the directives. malloc'd. */
static char *locate_diagnostics(const char *log, const char *src, const char *program) {
  size_t cap = 4096, w = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  out[0] = 0;
  int shown = 0;
  for (const char *p = log; *p && shown < 20;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    const char *open = memchr(p, '(', len);
    char file[256];
    int line = 0, used = 0;
    if (open && open > p && (size_t)(open - p) < sizeof file &&
        sscanf(open, "(%d): %n", &line, &used) == 1 && used > 0 && line > 0) {
      snprintf(file, sizeof file, "%.*s", (int)(open - p), p);
      const char *what = open + used;
      int wlen = (int)(len - (size_t)(what - p));
      char where[512];
      if (strcmp(file, program) == 0) { /* a generated line: find its template line */
        char tf[256];
        int tl = walk_lines(src, line, NULL, 0, tf, sizeof tf, NULL, 0);
        if (tl > 0) snprintf(where, sizeof where, "%s:%d (generated line %d)", tf, tl, line);
        else snprintf(where, sizeof where, "generated line %d", line);
      } else { /* a template line: find the generated line(s) */
        int g[4];
        int n = walk_lines(src, 0, file, line, NULL, 0, g, 4);
        size_t k = (size_t)snprintf(where, sizeof where, "%s:%d", file, line);
        for (int i = 0; i < n && i < 4 && k < sizeof where; i++)
          k += (size_t)snprintf(where + k, sizeof where - k, "%s%d", i ? ", " : " (generated line ", g[i]);
        if (n > 4 && k < sizeof where) k += (size_t)snprintf(where + k, sizeof where - k, ", ...");
        if (n && k < sizeof where) snprintf(where + k, sizeof where - k, ")");
      }
      size_t need = strlen(where) + (size_t)wlen + 8;
      if (w + need >= cap) {
        char *no = realloc(out, cap = 2 * (w + need));
        if (!no) break;
        out = no;
      }
      w += (size_t)snprintf(out + w, cap - w, "  %s: %.*s\n", where, wlen, what);
      shown++;
    }
    if (!nl) break;
    p = nl + 1;
  }
  return out;
}

int fg_nvrtc_compile(const char *src, const char *name, fg_arch arch, const fg_kernel_meta *meta,
                     fg_kernel_image *img, char **errlog) {
  if (errlog) *errlog = NULL;
  memset(img, 0, sizeof *img);
  char lerr[2300];
  if (fg_nvrtc_load(lerr, sizeof lerr)) {
    if (errlog) *errlog = dupf("%s%s%s%s", lerr, "", "", "");
    return -1;
  }
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", fg_arch_name(arch));
  const char *opts[] = {archopt, "--std=c++17", "-default-device", "--ptxas-options=-v",
                        "--use_fast_math"};
  const int nopts = (int)(sizeof opts / sizeof opts[0]);
  char file[128];
  snprintf(file, sizeof file, "%s.cu", name);
  nvrtcProgram prog = NULL;
  double t0 = now_ms();
  nvrtcResult r = nv.CreateProgram(&prog, src, file, 0, NULL, NULL);
  if (r != 0) {
    if (errlog) *errlog = dupf("nvrtcCreateProgram failed for %s: %s%s%s", name, nv.GetErrorString(r), "", "");
    return -1;
  }
  r = nv.CompileProgram(prog, nopts, opts);
  size_t logsz = 0;
  nv.GetProgramLogSize(prog, &logsz);
  char *log = calloc(1, logsz + 1);
  nv.GetProgramLog(prog, log);
  if (r != 0) {
    if (errlog) {
      char optline[512];
      snprintf(optline, sizeof optline, "%s %s %s %s %s", opts[0], opts[1], opts[2], opts[3], opts[4]);
      char *where = locate_diagnostics(log, src, file);
      size_t n = strlen(name) + strlen(optline) + strlen(log) + (where ? strlen(where) : 0) + 300;
      *errlog = malloc(n);
      if (*errlog)
        snprintf(*errlog, n,
                 "NVRTC failed to compile %s (%s)\n%s%soptions: %s\nlog:\n%s", name,
                 nv.GetErrorString(r),
                 where && *where ? "where (template:line, and the line of the generated source "
                                   "as `flashgen render` prints it):\n"
                                 : "",
                 where ? where : "", optline, log);
      free(where);
    }
    free(log);
    nv.DestroyProgram(&prog);
    return -1;
  }
  /* ptxas serializes wgmma when other instructions write its accumulators while one runs
   * (C7515) or when registers run short (C7511): the kernel is correct but loses the tensor
   * cores' asynchrony. A variant that does this is a bug or a bad fit; refuse it rather than
   * hand it to a user (the tuner then counts it as rejected). */
  const char *serial = strstr(log, "wgmma.mma_async instructions are serialized");
  if (serial) {
    while (serial > log && serial[-1] != '\n') serial--;
    if (errlog) {
      const char *e = strchr(serial, '\n');
      char line[512];
      snprintf(line, sizeof line, "%.*s", (int)(e ? e - serial : (ptrdiff_t)strlen(serial)), serial);
      *errlog = dupf("NVRTC compiled %s, but ptxas serialized its wgmma pipeline, which the "
                     "template must not cause: %s%s%s",
                     name, line, "", "");
    }
    free(log);
    nv.DestroyProgram(&prog);
    return -1;
  }
  img->compile_ms = now_ms() - t0;
  img->meta = *meta;
  img->meta.regs = img->meta.spill_store_bytes = img->meta.spill_load_bytes = img->meta.stack_bytes = -1;
  parse_ptxas(log, &img->meta);
  free(log);
  size_t n = 0;
  nv.GetCUBINSize(prog, &n);
  img->cubin = malloc(n ? n : 1);
  img->cubin_size = n;
  nv.GetCUBIN(prog, (char *)img->cubin);
  nv.GetPTXSize(prog, &n); /* includes the NUL */
  img->ptx = malloc(n + 1);
  nv.GetPTX(prog, img->ptx);
  img->ptx[n] = 0;
  img->ptx_size = strlen(img->ptx);
  nv.DestroyProgram(&prog);
  img->arch = arch;
  snprintf(img->variant, sizeof img->variant, "%s", name);
  return 0;
}
