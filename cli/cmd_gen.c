/* cmd_gen.c: the generator's subcommands: list, render, compile, info, build-default. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fg_autotune.h"
#include "fg_cache.h"
#include "fg_cli.h"
#include "fg_cuda.h"
#include "fg_gen.h"
#include "fg_jit.h"

static int has_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
  return 0;
}

static fg_generator *make_generator(void) {
  char err[4096];
  fg_generator *g;
  if (fg_generator_create(&g, err, sizeof err)) {
    fprintf(stderr, "flashgen: cannot load the templates: %s\n", err);
    return NULL;
  }
  return g;
}

/* The live GPU's arch and limits when there is one; 0 on success. */
static int live_device(fg_arch *arch, fg_device_limits *lim, char *name, size_t namelen) {
  if (fg_cuda_load(NULL, 0) != 0) return -1;
  if (fg_cu.cuInit(0) != 0) return -1;
  CUdevice dev;
  if (fg_cu.cuDeviceGet(&dev, 0) != 0) return -1;
  int v[6] = {0};
  const int attrs[6] = {FG_CU_DEV_COMPUTE_CAPABILITY_MAJOR,
                        FG_CU_DEV_COMPUTE_CAPABILITY_MINOR,
                        FG_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                        FG_CU_DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                        FG_CU_DEV_MAX_REGISTERS_PER_MULTIPROCESSOR,
                        FG_CU_DEV_MULTIPROCESSOR_COUNT};
  for (int i = 0; i < 6; i++)
    if (fg_cu.cuDeviceGetAttribute(&v[i], attrs[i], dev) != 0) return -1;
  fg_cu.cuDeviceGetName(name, (int)namelen, dev);
  lim->name = name;
  lim->cc_major = v[0];
  lim->cc_minor = v[1];
  lim->smem_optin_per_block = v[2];
  lim->smem_per_sm = v[3];
  lim->regs_per_sm = v[4];
  lim->sm_count = v[5];
  lim->max_threads_per_block = 1024;
  *arch = fg_arch_for_cc(v[0], v[1]);
  return 0;
}

int fg_cmd_list(int argc, char **argv) {
  if (has_help(argc, argv)) {
    printf("usage: flashgen list [--arch ARCH] [--filter SUBSTRING] [--all]\n\n"
           "Lists the candidate variants that fit the device: the live GPU, or with --arch the\n"
           "typical limits of that arch (sm_80: A100, sm_86: RTX 3090, sm_89: RTX 4090,\n"
           "sm_90/sm_90a: H100), forward (fwd_...) then backward (bwd_...). --filter keeps names\n"
           "containing SUBSTRING (repeatable: all must match; --filter bwd_ for the backward).\n"
           "--all also prints the variants that do not fit, with the reason.\n");
    return 0;
  }
  const char *arch_s = NULL;
  const char *filters[16];
  int nf = 0, all = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) arch_s = argv[++i];
    else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc && nf < 16) filters[nf++] = argv[++i];
    else if (strcmp(argv[i], "--all") == 0) all = 1;
    else {
      fprintf(stderr, "flashgen list: unknown option '%s' (see flashgen list --help)\n", argv[i]);
      return 2;
    }
  }
  fg_arch arch;
  fg_device_limits lim;
  char devname[256];
  if (arch_s) {
    if (fg_arch_parse(arch_s, &arch)) {
      fprintf(stderr, "flashgen list: unknown arch '%s' (sm_80, sm_86, sm_89, sm_90, sm_90a)\n", arch_s);
      return 2;
    }
    lim = *fg_limits_for_arch(arch);
  } else if (live_device(&arch, &lim, devname, sizeof devname) != 0) {
    fprintf(stderr, "flashgen list: no GPU found; name an arch with --arch (e.g. --arch sm_90a)\n");
    return 1;
  }
  fg_generator *g = make_generator();
  if (!g) return 1;
  int shown = 0, total = 0;
  static const int ds_all[] = {32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152,
                               160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256};
  static const int brs[] = {16, 32, 64, 128, 256}, bcs[] = {16, 32, 64, 128, 256};
  static const int warps[] = {1, 2, 4, 8, 16};
  /* The forward's grid, then the backward's (kv_outer, and kv_wgmma and kv_tma on sm_90a; 1 or 2
   * stages, 3 too for kv_tma). */
  for (int pass = FG_PASS_FWD; pass <= FG_PASS_BWD; pass++)
  for (size_t di = 0; di < sizeof ds_all / sizeof ds_all[0]; di++)
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int causal = 0; causal <= 1; causal++)
        for (int loop = 0; loop < FG_LOOP_COUNT; loop++)
          for (size_t bi = 0; bi < 5; bi++)
            for (size_t ci = 0; ci < 5; ci++)
              for (size_t wi = 0; wi < sizeof warps / sizeof warps[0]; wi++)
                for (int st = 1; st <= 3; st++) {
                  if (pass == FG_PASS_BWD &&
                      ((loop != FG_LOOP_KV_OUTER && loop != FG_LOOP_KV_WGMMA &&
                        loop != FG_LOOP_KV_TMA) ||
                       (st > 2 && loop != FG_LOOP_KV_TMA)))
                    continue;
                  fg_variant v = {(fg_pass)pass, ds_all[di], brs[bi], bcs[ci], (fg_dtype)dt,
                                  causal, (fg_loop_order)loop, warps[wi], st, arch};
                  char name[FG_VARIANT_NAME_MAX], why[256];
                  if (fg_variant_check(&v, why, sizeof why)) continue;
                  fg_variant_name(&v, name, sizeof name);
                  int ok = 1;
                  for (int f = 0; f < nf; f++)
                    if (!strstr(name, filters[f])) ok = 0;
                  if (!ok) continue;
                  total++;
                  int fits = fg_variant_fits(g, &v, &lim, why, sizeof why);
                  if (fits == 1) {
                    printf("%s\n", name);
                    shown++;
                  } else if (all) {
                    printf("%s  # does not fit: %s\n", name, why);
                  }
                }
  fprintf(stderr, "%d of %d variants fit %s (%s)\n", shown, total, lim.name, fg_arch_name(arch));
  fg_generator_destroy(g);
  return 0;
}

int fg_cmd_render(int argc, char **argv) {
  if (argc != 2 || has_help(argc, argv)) {
    FILE *f = has_help(argc, argv) ? stdout : stderr;
    fprintf(f, "usage: flashgen render VARIANT\n\nPrints the CUDA source generated for VARIANT, e.g.\n"
               "  flashgen render fwd_d128_br128_bc64_bf16_causal_qouter_w8_s2_sm80\n");
    return has_help(argc, argv) ? 0 : 2;
  }
  fg_variant v;
  char err[4096];
  if (fg_variant_parse(argv[1], &v, err, sizeof err)) {
    fprintf(stderr, "flashgen render: %s\n", err);
    return 2;
  }
  fg_generator *g = make_generator();
  if (!g) return 1;
  char *src;
  fg_kernel_meta meta;
  int rc = fg_generator_render(g, &v, &src, &meta, err, sizeof err);
  if (rc) fprintf(stderr, "flashgen render: %s\n", err);
  else {
    fputs(src, stdout);
    free(src);
  }
  fg_generator_destroy(g);
  return rc ? 1 : 0;
}

static int write_all(int fd, const void *data, size_t size) {
  const char *p = data;
  while (size > 0) {
    ssize_t w = write(fd, p, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return -1;
    }
    p += w;
    size -= (size_t)w;
  }
  return 0;
}

/* Writes data to path whole or not at all: into a temporary file in the same directory, then
 * renamed over path, so a full disk or a size limit never leaves a truncated cubin (nor harms
 * an older one); the temporary file is removed on any error. A path that exists and is not a
 * regular file (/dev/stdout, a pipe) is written directly. 0, or -1 with the reason in why. */
static int write_whole_file(const char *path, const void *data, size_t size, char *why,
                            size_t whylen) {
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(data, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) snprintf(why, whylen, "%s", strerror(errno));
    return ok ? 0 : -1;
  }
  const char *slash = strrchr(path, '/');
  char tmp[4096];
  int n = slash ? snprintf(tmp, sizeof tmp, "%.*s/.%s.tmpXXXXXX", (int)(slash - path), path, slash + 1)
                : snprintf(tmp, sizeof tmp, ".%s.tmpXXXXXX", path);
  if (n < 0 || (size_t)n >= sizeof tmp) {
    snprintf(why, whylen, "the path is too long");
    return -1;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    snprintf(why, whylen, "cannot create a temporary file next to it: %s", strerror(errno));
    return -1;
  }
  /* mkstemp makes the file 0600; give it the mode fopen would have (0666 less the umask). */
  mode_t mask = umask(0);
  umask(mask);
  int rc = fchmod(fd, 0666 & ~mask) == 0 && write_all(fd, data, size) == 0 ? 0 : -1;
  int err = errno;
  if (close(fd) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  if (rc == 0 && rename(tmp, path) != 0) {
    rc = -1;
    err = errno;
  }
  if (rc != 0) {
    unlink(tmp);
    snprintf(why, whylen, "%s", strerror(err));
  }
  return rc;
}

int fg_cmd_compile(int argc, char **argv) {
  if (has_help(argc, argv)) {
    printf("usage: flashgen compile VARIANT [--arch ARCH] [-o FILE.cubin]\n\n"
           "Compiles VARIANT with NVRTC for ARCH (default: the arch in the name), writes the cubin\n"
           "to FILE (default VARIANT.cubin; whole or not at all: through a temporary file in the\n"
           "same directory) and prints compile time, registers, shared memory and spills.\n");
    return 0;
  }
  const char *name = NULL, *arch_s = NULL, *outpath = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) arch_s = argv[++i];
    else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) outpath = argv[++i];
    else if (argv[i][0] != '-' && !name) name = argv[i];
    else {
      fprintf(stderr, "flashgen compile: unexpected argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (!name) {
    fprintf(stderr, "usage: flashgen compile VARIANT [--arch ARCH] [-o FILE.cubin]\n");
    return 2;
  }
  fg_variant v;
  char err[4096];
  if (fg_variant_parse(name, &v, err, sizeof err)) {
    fprintf(stderr, "flashgen compile: %s\n", err);
    return 2;
  }
  if (arch_s && fg_arch_parse(arch_s, &v.arch)) {
    fprintf(stderr, "flashgen compile: unknown arch '%s' (sm_80, sm_86, sm_89, sm_90, sm_90a)\n", arch_s);
    return 2;
  }
  char canon[FG_VARIANT_NAME_MAX];
  fg_variant_name(&v, canon, sizeof canon);
  fg_generator *g = make_generator();
  if (!g) return 1;
  fg_kernel_image img;
  char *log = NULL;
  int rc = fg_generator_build(g, &v, &img, &log);
  fg_generator_destroy(g);
  if (rc) {
    fprintf(stderr, "flashgen compile: %s\n", log ? log : "failed");
    free(log);
    return 1;
  }
  char defpath[FG_VARIANT_NAME_MAX + 8];
  snprintf(defpath, sizeof defpath, "%s.cubin", canon);
  if (!outpath) outpath = defpath;
  char why[512];
  if (write_whole_file(outpath, img.cubin, img.cubin_size, why, sizeof why) != 0) {
    fprintf(stderr, "flashgen compile: cannot write %s: %s; it was neither created nor changed "
                    "(free some space or choose another file with -o)\n", outpath, why);
    fg_kernel_image_free(&img);
    return 1;
  }
  printf("%-56s %-7s %8s %5s %9s %6s %6s\n", "variant", "arch", "ms", "regs", "smem(B)", "spill", "stack");
  printf("%-56s %-7s %8.1f %5d %9d %6d %6d\n", canon, fg_arch_name(v.arch), img.compile_ms,
         img.meta.regs, fg_kernel_main(&img.meta)->smem_bytes, img.meta.spill_store_bytes + img.meta.spill_load_bytes,
         img.meta.stack_bytes);
  printf("wrote %s (%zu bytes)\n", outpath, img.cubin_size);
  fg_kernel_image_free(&img);
  return 0;
}

int fg_cmd_info(int argc, char **argv) {
  if (has_help(argc, argv)) {
    printf("usage: flashgen info\n\nPrints the GPU, the driver, NVRTC and the shared-memory limits, "
           "or in plain words what is missing and where flashgen looked.\n");
    return 0;
  }
  (void)argc;
  printf("flashgen %s\n", FG_VERSION_STRING);
  char err[4096];
  fg_generator *g;
  if (fg_generator_create(&g, err, sizeof err) == 0) {
    printf("templates: %s (hash %016llx)\n", fg_generator_template_source(g),
           (unsigned long long)fg_generator_template_hash(g));
    fg_generator_destroy(g);
  } else {
    printf("templates: cannot be loaded: %s\n", err);
  }
  if (fg_nvrtc_load(err, sizeof err) == 0)
    printf("NVRTC: %d.%d from %s\n", fg_nvrtc_version() / 1000, (fg_nvrtc_version() % 1000) / 10,
           fg_nvrtc_path());
  else
    printf("NVRTC: not available. %s\n", err);
  static char report[16384];
  int ok = fg_cuda_report(report, sizeof report);
  printf("%s", report);
  if (report[0] && report[strlen(report) - 1] != '\n') printf("\n");
  return ok == 0 ? 0 : 1;
}

int fg_cmd_build_default(int argc, char **argv) {
  if (has_help(argc, argv)) {
    printf("usage: flashgen build-default [--arch ARCH[,ARCH...]] [-j N] [--kv-outer]\n"
           "                              [--no-backward] [--d D[,D...]] [--cache]\n\n"
           "Renders and compiles the default kernel set (the built-in rule's forward and backward\n"
           "variants for every head dimension 32..256, f16 and bf16, causal or not; with\n"
           "--kv-outer also the Algorithm 1 variants, and on sm_90a the q_outer variants where\n"
           "the rule picks a wgmma kernel; with --no-backward the forward only; with --d only\n"
           "those head dimensions) for each ARCH (default: the live GPU's, else sm_80,sm_90a)\n"
           "and prints variant, NVRTC time, registers, shared memory and spills. A kernel that\n"
           "fails, or spills more than its pass allows (none for the forward, 128 B for the\n"
           "backward), counts as failed. --cache also stores every kernel that built into the\n"
           "kernel cache (FLASHGEN_CACHE_DIR, else the default directory: README.md), where the\n"
           "runtime finds it instead of compiling at the first call; no GPU is needed for that.\n");
    return 0;
  }
  const char *arch_list = NULL;
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), kv = 0, with_backward = 1, to_cache = 0;
  unsigned char want_d[257] = {0}; /* --d: the head dims asked for (none: all) */
  int any_d = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) arch_list = argv[++i];
    else if (strcmp(argv[i], "-j") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--kv-outer") == 0) kv = 1;
    else if (strcmp(argv[i], "--no-backward") == 0) with_backward = 0;
    else if (strcmp(argv[i], "--cache") == 0) to_cache = 1;
    else if (strcmp(argv[i], "--d") == 0 && i + 1 < argc) {
      const char *s = argv[++i];
      for (;;) {
        char *end;
        errno = 0;
        const long d = strtol(s, &end, 10);
        if (end == s || errno || d < 32 || d > 256 || d % 8 != 0 || (*end && *end != ',')) {
          fprintf(stderr,
                  "flashgen build-default: --d '%s': each head dimension must be a multiple of 8 "
                  "from 32 to 256, comma-separated (e.g. --d 40,72,200)\n",
                  argv[i]);
          return 2;
        }
        want_d[d] = 1;
        any_d = 1;
        if (!*end) break;
        s = end + 1;
      }
    } else {
      fprintf(stderr, "flashgen build-default: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  fg_arch archs[FG_ARCH_COUNT];
  int narch = 0;
  if (!arch_list) {
    fg_device_limits lim;
    char name[256];
    if (live_device(&archs[0], &lim, name, sizeof name) == 0) {
      narch = 1;
    } else {
      archs[0] = FG_ARCH_SM80;
      archs[1] = FG_ARCH_SM90A;
      narch = 2;
    }
  } else if (fg_cli_arch_list("build-default", arch_list, archs, &narch) != 0) {
    return 2;
  }
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  fg_generator *g = make_generator();
  if (!g) return 1;
  fg_cache *cache = NULL;
  fg_cache_key key;
  memset(&key, 0, sizeof key);
  if (to_cache) {
    char err[1024] = "", dir[1024];
    /* The key the runtime looks kernels up by; the arch is each image's (below). */
    if (fg_generator_cache_key(g, FG_ARCH_SM80, &key, err, sizeof err) != 0) {
      fprintf(stderr, "flashgen build-default: --cache: %s\n", err);
      fg_generator_destroy(g);
      return 1;
    }
    if (fg_cache_resolve_dir_why(NULL, dir, sizeof dir, err, sizeof err) != 0 ||
        !(cache = fg_cache_open(dir, err, sizeof err))) {
      /* (the cache's reason ends with what the runtime then does, which is not what happens here) */
      char *tail = strstr(err, "; compiling in memory");
      if (tail) *tail = '\0';
      fprintf(stderr,
              "flashgen build-default: --cache: the kernel cache cannot be used, nothing was "
              "compiled: %s\n",
              err);
      fg_generator_destroy(g);
      return 1;
    }
    fprintf(stderr, "flashgen build-default: storing the kernels in the cache at %s\n", dir);
  }
  int failed = 0, total = 0, stored = 0;
  printf("%-56s %-7s %8s %5s %9s %6s\n", "variant", "arch", "nvrtc ms", "regs", "smem(B)", "spill");
  for (int ai = 0; ai < narch; ai++) {
    const fg_arch arch = archs[ai];
    fg_variant v[2 * FG_DEFAULT_VARIANTS_MAX];
    int n = fg_default_variants(arch, kv, v, FG_DEFAULT_VARIANTS_MAX);
    if (with_backward) n += fg_default_backward_variants(arch, v + n, 2 * FG_DEFAULT_VARIANTS_MAX - n);
    if (any_d) { /* only the head dims asked for */
      int k = 0;
      for (int i = 0; i < n; i++)
        if (want_d[v[i].d]) v[k++] = v[i];
      n = k;
    }
    fg_compile_item *it = calloc((size_t)n + 1, sizeof *it);
    if (!it) {
      fprintf(stderr, "flashgen build-default: out of memory\n");
      fg_generator_destroy(g);
      return 1;
    }
    for (int i = 0; i < n; i++) it[i].v = v[i];
    fg_compile_pool(g, it, n, threads, NULL, NULL);
    double *ms = calloc((size_t)n + 1, sizeof(double));
    int ok = 0;
    for (int i = 0; i < n; i++) {
      char name[FG_VARIANT_NAME_MAX];
      fg_variant_name(&v[i], name, sizeof name);
      if (!it[i].ok) {
        printf("%-56s %-7s FAILED: %s\n", name, fg_arch_name(arch), it[i].log ? it[i].log : "");
        failed++;
      } else {
        fg_kernel_meta *m = &it[i].img.meta;
        printf("%-56s %-7s %8.0f %5d %9d %6d\n", name, fg_arch_name(arch), it[i].img.compile_ms, m->regs,
               fg_kernel_main(m)->smem_bytes, m->spill_store_bytes + m->spill_load_bytes);
        const int limit = fg_variant_spill_limit(&v[i]);
        if (m->spill_store_bytes > limit || m->spill_load_bytes > limit) {
          failed++;
        } else if (cache) {
          char warn[1024] = "";
          key.variant = name;
          key.arch = it[i].img.arch;
          if (fg_cache_put_kernel(cache, &key, &it[i].img, warn, sizeof warn) == 0) stored++;
          else fprintf(stderr, "flashgen build-default: %s not stored in the cache: %s\n", name, warn);
        }
        ms[ok++] = it[i].img.compile_ms;
      }
      fg_kernel_image_free(&it[i].img);
      free(it[i].log);
      total++;
    }
    for (int a = 1; a < ok; a++)
      for (int b = a; b > 0 && ms[b - 1] > ms[b]; b--) {
        double t = ms[b]; ms[b] = ms[b - 1]; ms[b - 1] = t;
      }
    fprintf(stderr, "%s: %d variants, median NVRTC time %.0f ms\n", fg_arch_name(arch), n, ok ? ms[ok / 2] : 0.0);
    free(ms);
    free(it);
  }
  fg_generator_destroy(g);
  printf("%d built, %d failed or spilled past their limit\n", total - failed, failed);
  if (cache) {
    printf("%d stored in the kernel cache\n", stored);
    fg_cache_close(cache);
  }
  return failed || (cache && stored < total - failed) ? 1 : 0;
}
