/* export_write.c: the writer of `flashgen export` (cmd_export.c chooses and compiles): the set's
 * kernels as C in the layout of include/flashgen_export.h, <prefix>_kernels.h and
 * <prefix>_kernels.c: every cubin and its PTX as byte arrays, the launch contracts (steps,
 * workspaces, parameter block and tensor maps), the tuned choices, and the table (layout version 2
 * when a kernel takes tensor maps). Same inputs, same bytes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export_internal.h"

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
    case FG_GRID_PERSISTENT: return "FG_EXPORT_GRID_PERSISTENT";
    case FG_GRID_Q_TILE_PAIRS: return "FG_EXPORT_GRID_Q_TILE_PAIRS";
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
    case FG_PARAMS_BWD_TMA: return "FG_EXPORT_PARAMS_BWD_TMA";
  }
  return NULL;
}
static const char *tensor_name(fg_tmap_tensor t) {
  switch (t) {
    case FG_TMAP_Q: return "FG_EXPORT_TENSOR_Q";
    case FG_TMAP_K: return "FG_EXPORT_TENSOR_K";
    case FG_TMAP_V: return "FG_EXPORT_TENSOR_V";
    case FG_TMAP_O: return "FG_EXPORT_TENSOR_O";
    case FG_TMAP_DO: return "FG_EXPORT_TENSOR_DO";
  }
  return NULL;
}

/* Checks a compiled kernel's plan before it is written: well formed, its parameter block the
 * pass's (fwd_tma forward, bwd_tma backward), grid kinds the layout names, the main kernel's grid
 * the pass's (the backward's K/V tiles), and every step's entry in the module. NULL, or what is
 * wrong. */
const char *fg_export_check_contract(const export_kernel *k, char *why, size_t whylen) {
  const fg_kernel_meta *m = &k->img.meta;
  const char *bad = fg_kernel_meta_invalid_for(m, k->v.pass);
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
  if (!params_name(m->params)) {
    snprintf(why, whylen, "has parameter block %d, which include/flashgen_export.h does not name",
             (int)m->params);
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
      fprintf(f,
              ", .grid = %s, .br = %d, .threads = %d, .smem_bytes = %d, .split_rows = %d,"
              " .tail = %d},\n",
              grid_name(sp->grid), sp->br, sp->threads, sp->smem_bytes, sp->split_rows, sp->tail);
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
                " .min_group_rows = %lld, .tail = %d},\n",
                w->bytes, w->rows, w->deterministic_only, w->per_key, w->min_group_rows, w->tail);
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
int fg_export_write(const char *dir, const char *cname, const char *hname, const char *desc,
                    const export_info *in, const export_set *s, char *cpath, size_t clen,
                    char *hpath, size_t hlen) {
  write_args w = {cname, hname, desc, in, s};
  if (write_file(dir, hname, write_h_cb, &w, hpath, hlen) != 0 ||
      write_file(dir, cname, write_c_cb, &w, cpath, clen) != 0)
    return -1;
  return 0;
}
