/* main.c: the flashgen command: dispatches to one function per subcommand (fg_cli.h), and the
 * argument parsing the subcommands share (the --arch list). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "fg_cli.h"
#include "flashgen.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"list", fg_cmd_list, "list variants valid for an arch or the live GPU"},
    {"render", fg_cmd_render, "print the generated CUDA source of a variant"},
    {"compile", fg_cmd_compile, "compile a variant with NVRTC: cubin to a file, resource report"},
    {"info", fg_cmd_info, "GPU, driver, NVRTC and shared-memory limits"},
    {"build-default", fg_cmd_build_default, "compile the default kernel set and print a table"},
    {"check", fg_cmd_check, "check the forward and backward kernels against fp64 references on the GPU"},
    {"explain", fg_cmd_explain, "say which variant a problem would run and why"},
    {"tune", fg_cmd_tune, "find the fastest correct variant of each problem on the GPU, record it"},
    {"cache", fg_cmd_cache, "the kernel cache: ls, stats, verify, clear, tuning"},
    {"export", fg_cmd_export, "write kernels as C for builds that must not compile at run time"},
};

int fg_cli_arch_list(const char *cmd, const char *list, fg_arch *archs, int *narch) {
  static const char known[] = "sm_80, sm_86, sm_89, sm_90, sm_90a";
  *narch = 0;
  const char *p = list ? list : "";
  for (int elem = 1;; elem++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *b = p, *e = p + len;
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    if (b == e) {
      if (!end && elem == 1)
        fprintf(stderr, "flashgen %s: --arch names no arch; give one or more of %s, separated by "
                        "commas (e.g. --arch sm_80,sm_90a)\n", cmd, known);
      else
        fprintf(stderr, "flashgen %s: --arch '%s': element %d is empty; give one or more of %s, "
                        "separated by single commas (e.g. --arch sm_80,sm_90a)\n", cmd, list, elem,
                known);
      return 2;
    }
    char name[16];
    fg_arch a;
    if ((size_t)(e - b) >= sizeof name ||
        (memcpy(name, b, (size_t)(e - b)), name[e - b] = '\0', fg_arch_parse(name, &a) != 0)) {
      fprintf(stderr, "flashgen %s: --arch '%s': unknown arch '%.*s' (%s)\n", cmd, list,
              (int)(e - b), b, known);
      return 2;
    }
    int seen = 0;
    for (int i = 0; i < *narch; i++) seen |= archs[i] == a;
    if (!seen) archs[(*narch)++] = a;
    if (!end) return 0;
    p = end + 1;
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "flashgen %s: FlashAttention kernels generated, compiled at run time and tuned\n\n"
          "usage: flashgen <command> [options]    (flashgen <command> --help for its options)\n\n"
          "commands:\n",
          fg_version());
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nenvironment: FLASHGEN_CACHE_DIR, FLASHGEN_TEMPLATE_DIR, FLASHGEN_NVRTC_LIBRARY,\n"
             "             FLASHGEN_CUDA_LIBRARY, FLASHGEN_HANG_TIMEOUT (see README.md)\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("flashgen %s\n", fg_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "flashgen: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
