/* nvrtc.c: NVRTC loaded with dlopen ($FLASHGEN_NVRTC_LIBRARY, libnvrtc.so.13, libnvrtc.so.12),
 * compilation of generated source to cubin + PTX, and the resource usage ptxas reports. */
#include <dlfcn.h>
#include <pthread.h>
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
static void preload_start(void) {
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &at, preload_thread, NULL) != 0) { /* no thread: load on first use */ }
  pthread_attr_destroy(&at);
}

void fg_nvrtc_preload(void) { pthread_once(&preload_once, preload_start); }

int fg_nvrtc_version(void) { return nv.lib ? nv.version : 0; }
const char *fg_nvrtc_path(void) { return nv.lib ? nv.path : ""; }

/* Reads "Used N registers", "N bytes stack frame, N bytes spill stores, N bytes spill loads"
 * from ptxas's verbose output in the NVRTC log. */
static void parse_ptxas(const char *log, fg_kernel_meta *m) {
  const char *p = strstr(log, "bytes stack frame");
  if (p) {
    const char *s = p;
    while (s > log && s[-1] != '\n' && s[-1] != '.') s--;
    sscanf(s, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &m->stack_bytes,
           &m->spill_store_bytes, &m->spill_load_bytes);
  }
  p = strstr(log, "Used ");
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
      *errlog = dupf("NVRTC failed to compile %s (%s)\noptions: %s\nlog:\n%s", name,
                     nv.GetErrorString(r), optline, log);
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
