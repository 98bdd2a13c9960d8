/* fg_cli.h: the subcommands of the flashgen command, one function each (argv[0] is the
 * subcommand's name). Each returns the exit status: 0 success, 1 failure, 2 bad usage. */
#ifndef FG_CLI_H
#define FG_CLI_H
#include "fg_jit.h"
#include "fg_variant.h"

/* Parses the comma-separated arch list of `CMD --arch LIST` (cli/main.c) into archs (room for
 * FG_ARCH_COUNT), in the order given, repeats dropped; spaces around a name are ignored.
 * Returns 0, or 2 (bad usage) after printing what is wrong with LIST: empty, an empty element
 * ("sm_80,,sm_90a", a lone ","), or an unknown name. */
int fg_cli_arch_list(const char *cmd, const char *list, fg_arch *archs, int *narch);
int fg_cmd_list(int argc, char **argv);
int fg_cmd_render(int argc, char **argv);
int fg_cmd_compile(int argc, char **argv);
int fg_cmd_info(int argc, char **argv);
int fg_cmd_build_default(int argc, char **argv);
int fg_cmd_check(int argc, char **argv);
int fg_cmd_explain(int argc, char **argv);
int fg_cmd_tune(int argc, char **argv);
int fg_cmd_cache(int argc, char **argv);
int fg_cmd_export(int argc, char **argv);
#endif
