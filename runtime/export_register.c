/* export_register.c: fg_register_export, the public way in for exported tables. Reads a table in
 * the stable layout of flashgen_export.h (by the sizes it records, so older and newer tables
 * both read, but a table from before kernel plans is refused: export it again), checks it (a
 * kernel's plan against its variant name: backward variants, and only they, with the K/V-tile
 * grid for their main kernel; tensor maps, in tables that have them, in the block of the
 * variant's pass: FWD_TMA for forward variants, BWD_TMA for backward ones),
 * turns it into the registry's
 * fg_exported_table and hands that to fg_register_exported. The converted tables live as long as
 * the process, like the tables. */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_runtime_internal.h"
#include "flashgen_export.h"

typedef struct fg_export_reg {
  const fg_export *pub;
  fg_exported_table table;
  struct fg_export_reg *next;
} fg_export_reg;

static pthread_mutex_t fg_export_lock = PTHREAD_MUTEX_INITIALIZER;
static fg_export_reg *fg_export_regs; /* reachable for the life of the process */

/* Copies the first `size` bytes written by the producer into a zeroed struct of this version:
 * fields the producer did not know are zero, fields this version does not know are ignored. */
static void fg_read_sized(void *dst, size_t dst_size, const void *src, size_t src_size) {
  memset(dst, 0, dst_size);
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
}

static fg_status fg_export_fail(char *err, size_t errlen, const char *desc, const char *fmt, ...)
    FG_PRINTF(4, 5);

/* "exported table '<desc>': <message>" into err; returns FG_ERROR_INVALID_ARGUMENT. */
static fg_status fg_export_fail(char *err, size_t errlen, const char *desc, const char *fmt, ...) {
  if (err && errlen) {
    int n = snprintf(err, errlen, "exported table '%s': ", desc ? desc : "");
    if (n >= 0 && (size_t)n < errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return FG_ERROR_INVALID_ARGUMENT;
}

/* Fills img from the producer's kernel k; returns NULL or what is wrong with it. */
static const char *fg_export_convert_kernel(const fg_export_kernel *k, size_t step_size,
                                            size_t ws_size, size_t tmap_size,
                                            fg_kernel_image *img, char *why, size_t whylen) {
  memset(img, 0, sizeof *img);
  fg_variant v;
  char perr[256];
  if (!k->variant || !k->variant[0]) return "has no variant name";
  if (strlen(k->variant) >= sizeof img->variant) return "has a variant name too long to be one";
  if (fg_variant_parse(k->variant, &v, perr, sizeof perr) != 0) {
    snprintf(why, whylen, "has a variant name that does not parse (%s)", perr);
    return why;
  }
  if (!k->arch || fg_arch_parse(k->arch, &img->arch) != 0) {
    snprintf(why, whylen, "has an unknown arch '%s'", k->arch ? k->arch : "(null)");
    return why;
  }
  if (img->arch != v.arch) {
    snprintf(why, whylen, "was compiled for %s but its name says %s", fg_arch_name(img->arch),
             fg_arch_name(v.arch));
    return why;
  }
  if ((!k->cubin || !k->cubin_size) && (!k->ptx || !k->ptx_size)) return "has neither cubin nor PTX";
  if (k->ptx && k->ptx_size && k->ptx[k->ptx_size] != '\0')
    return "has PTX that is not NUL-terminated at ptx_size";
  if (!k->steps || k->n_steps < 1 || k->n_steps > FG_PLAN_MAX_STEPS || k->main_step < 0 ||
      k->main_step >= k->n_steps || k->n_workspaces < 0 ||
      k->n_workspaces > FG_PLAN_MAX_WORKSPACES || (k->n_workspaces && !k->workspaces))
    return "has no plan, or a malformed one (steps, main_step or workspaces): the table is "
           "damaged or from another flashgen; export it again";
  fg_kernel_meta *m = &img->meta;
  const int ws_knows_tail =
      ws_size >= offsetof(fg_export_workspace, tail) + sizeof((fg_export_workspace *)0)->tail;
  m->n_steps = k->n_steps;
  m->main_step = k->main_step;
  for (int i = 0; i < k->n_steps; i++) {
    fg_export_step s;
    fg_read_sized(&s, sizeof s, (const char *)k->steps + (size_t)i * step_size, step_size);
    if (!s.entry || !s.entry[0] || strlen(s.entry) >= sizeof m->steps[i].entry) {
      snprintf(why, whylen, "has no entry point in step %d of its plan (or one too long)",
               i + 1);
      return why;
    }
    if (s.grid < FG_EXPORT_GRID_Q_TILES || s.grid > FG_EXPORT_GRID_Q_TILE_PAIRS) {
      snprintf(why, whylen,
               "has grid kind %d, which this runtime (flashgen %s) does not know (it knows 1 to "
               "%d: Q_TILES, HEADS, ROWS, KV_TILES, PERSISTENT, Q_TILE_PAIRS): the table is "
               "damaged or from a newer flashgen; export it again with flashgen %s",
               s.grid, fg_version(), FG_EXPORT_GRID_Q_TILE_PAIRS, fg_version());
      return why;
    }
    snprintf(m->steps[i].entry, sizeof m->steps[i].entry, "%s", s.entry);
    m->steps[i].grid = (fg_grid_kind)s.grid;
    m->steps[i].br = s.br;
    m->steps[i].threads = s.threads;
    m->steps[i].smem_bytes = s.smem_bytes;
    /* split_rows came later: a table whose step_size predates it reads it as 0 (never split),
     * what its steps were. */
    if (step_size >= offsetof(fg_export_step, split_rows) + sizeof s.split_rows)
      m->steps[i].split_rows = s.split_rows;
    /* tail came later still, into what was the struct's padding: a table written before it may
     * have the same step_size, so it is read only where the workspaces' size says the table knows
     * tail (fg_export_workspace.tail came with it); otherwise 0, what its steps were. */
    if (step_size >= offsetof(fg_export_step, tail) + sizeof s.tail && ws_knows_tail)
      m->steps[i].tail = s.tail;
  }
  m->n_workspaces = k->n_workspaces;
  for (int i = 0; i < k->n_workspaces; i++) {
    fg_export_workspace w;
    fg_read_sized(&w, sizeof w, (const char *)k->workspaces + (size_t)i * ws_size, ws_size);
    fg_plan_workspace *o = &m->workspaces[i];
    if (!w.name || !w.param || strlen(w.name) >= sizeof o->name || strlen(w.param) >= sizeof o->param)
      return "has a workspace without a name or param (or one too long): the table is damaged, "
             "export it again";
    snprintf(o->name, sizeof o->name, "%s", w.name);
    snprintf(o->param, sizeof o->param, "%s", w.param);
    o->bytes = w.bytes;
    o->rows = w.rows;
    o->deterministic_only = w.deterministic_only != 0;
    /* per_key and min_group_rows came later: a table whose workspace_desc_size predates them
     * holds neither (its struct's tail padding may overlap per_key: not read), so both are 0. */
    if (ws_size >= offsetof(fg_export_workspace, min_group_rows) + sizeof w.min_group_rows) {
      o->per_key = w.per_key;
      o->min_group_rows = w.min_group_rows;
    }
    /* tail came later: a table whose workspace_desc_size predates it reads it as 0. */
    if (ws_knows_tail) o->tail = w.tail;
  }
  /* Its parameter block and tensor maps (zero in tables from before them: none). */
  if (k->params != FG_EXPORT_PARAMS_DEFAULT && k->params != FG_EXPORT_PARAMS_FWD_TMA &&
      k->params != FG_EXPORT_PARAMS_BWD_TMA) {
    snprintf(why, whylen,
             "has parameter block %d, which this runtime (flashgen %s) does not know (it knows "
             "0 to 2: DEFAULT, FWD_TMA, BWD_TMA): the table is damaged or from a newer flashgen; "
             "export it again with flashgen %s",
             k->params, fg_version(), fg_version());
    return why;
  }
  m->params = (fg_param_block)k->params;
  if (k->n_tmaps < 0 || k->n_tmaps > FG_PLAN_MAX_TMAPS || (k->n_tmaps && (!k->tmaps || !tmap_size)))
    return "has a malformed list of tensor maps (n_tmaps, tmaps, or the table's tmap_size): the "
           "table is damaged, export it again";
  m->n_tmaps = k->n_tmaps;
  for (int i = 0; i < k->n_tmaps; i++) {
    fg_export_tmap t;
    fg_read_sized(&t, sizeof t, (const char *)k->tmaps + (size_t)i * tmap_size, tmap_size);
    m->tmaps[i].tensor = (fg_tmap_tensor)t.tensor;
    m->tmaps[i].rows = t.rows;
  }
  const char *bad = fg_kernel_meta_invalid(m);
  if (bad) {
    snprintf(why, whylen, "has a malformed launch contract: %s; export it again", bad);
    return why;
  }
  /* The backward plan and only it has the K/V-tile grid for its main kernel (runtime/backward.c
   * launches it; the forward would launch it wrongly). */
  const fg_plan_step *mk = fg_kernel_main(m);
  const int bwd = v.pass == FG_PASS_BWD, kv_tiles = mk->grid == FG_GRID_KV_TILES;
  if (bwd != kv_tiles) {
    snprintf(why, whylen,
             "is a %s variant whose main kernel has grid kind %d; a %s variant needs %s: the "
             "table is damaged, export it again",
             bwd ? "backward" : "forward", (int)mk->grid, bwd ? "backward" : "forward",
             bwd ? "FG_EXPORT_GRID_KV_TILES (4)" : "a forward grid kind (1 to 3, 5 or 6)");
    return why;
  }
  if (kv_tiles && mk->br != v.bc) {
    snprintf(why, whylen,
             "has br = %d in its launch contract, but its K/V blocks are %d rows (bc in its name): "
             "the table is damaged, export it again",
             mk->br, v.bc);
    return why;
  }
  if (bwd && m->params == FG_PARAMS_FWD_TMA)
    return "is a backward variant whose plan takes the forward's tensor-map block (FWD_TMA): the "
           "table is damaged, export it again";
  if (!bwd && m->params == FG_PARAMS_BWD_TMA)
    return "is a forward variant whose plan takes the backward's tensor-map block (BWD_TMA): the "
           "table is damaged, export it again";
  snprintf(img->variant, sizeof img->variant, "%s", k->variant);
  /* The registry never writes through these: the arrays stay in read-only storage. */
  img->cubin = k->cubin && k->cubin_size ? (unsigned char *)(uintptr_t)k->cubin : NULL;
  img->cubin_size = img->cubin ? k->cubin_size : 0;
  img->ptx = k->ptx && k->ptx_size ? (char *)(uintptr_t)k->ptx : NULL;
  img->ptx_size = img->ptx ? k->ptx_size : 0;
  img->meta.regs = k->regs;
  img->meta.spill_store_bytes = k->spill_store_bytes;
  img->meta.spill_load_bytes = k->spill_load_bytes;
  img->meta.stack_bytes = k->stack_bytes;
  img->compile_ms = 0;
  return NULL;
}

FG_API fg_status fg_register_export(const fg_export *table, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!table) {
    if (err && errlen) snprintf(err, errlen, "fg_register_export: the table is NULL");
    return FG_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&fg_export_lock);
  for (fg_export_reg *r = fg_export_regs; r; r = r->next)
    if (r->pub == table) {
      pthread_mutex_unlock(&fg_export_lock);
      return FG_OK;
    }
  pthread_mutex_unlock(&fg_export_lock);

  /* The header: abi_version and size come first in every version. */
  if ((table->abi_version != FG_EXPORT_ABI_VERSION &&
       table->abi_version != FG_EXPORT_ABI_VERSION_TMA) ||
      table->size < 4 * sizeof(uint32_t)) {
    if (err && errlen)
      snprintf(err, errlen,
               "fg_register_export: the table has layout version %u (size %u); this runtime (%s) "
               "reads versions %d and %d: export again with this flashgen",
               (unsigned)table->abi_version, (unsigned)table->size, fg_version(),
               FG_EXPORT_ABI_VERSION, FG_EXPORT_ABI_VERSION_TMA);
    return FG_ERROR_INVALID_ARGUMENT;
  }
  fg_export e;
  fg_read_sized(&e, sizeof e, table, table->size);
  const char *desc = e.description ? e.description : "";
  if ((e.n_kernels && (!e.kernels || !e.kernel_size)) || (e.n_choices && (!e.choices || !e.choice_size)))
    return fg_export_fail(err, errlen, desc,
                          "a count is set but its array or its element size is missing");
  /* Tables written before plans (the kernels' steps and workspaces) have no step size; their
   * backward kernels' auxiliary launches were implicit. */
  if (e.n_kernels && (!e.step_size || !e.workspace_desc_size))
    return fg_export_fail(err, errlen, desc,
                          "it was written by a flashgen from before kernel plans (its kernels "
                          "carry no steps and workspaces), which this runtime (flashgen %s) "
                          "needs: export it again with this flashgen (flashgen export ...) and "
                          "rebuild",
                          fg_version());

  fg_export_reg *reg = calloc(1, sizeof *reg);
  fg_kernel_image *imgs = e.n_kernels ? calloc(e.n_kernels, sizeof *imgs) : NULL;
  fg_exported_choice *chs = e.n_choices ? calloc(e.n_choices, sizeof *chs) : NULL;
  if (!reg || (e.n_kernels && !imgs) || (e.n_choices && !chs)) {
    free(reg), free(imgs), free(chs);
    if (err && errlen) snprintf(err, errlen, "out of host memory registering an exported table");
    return FG_ERROR_OUT_OF_MEMORY;
  }
  fg_status st = FG_OK;
  for (size_t i = 0; i < e.n_kernels && st == FG_OK; i++) {
    fg_export_kernel k;
    fg_read_sized(&k, sizeof k, (const char *)e.kernels + i * e.kernel_size, e.kernel_size);
    char why[512];
    const char *bad =
        fg_export_convert_kernel(&k, e.step_size, e.workspace_desc_size, e.tmap_size, &imgs[i],
                                 why, sizeof why);
    if (!bad && imgs[i].meta.params != FG_PARAMS_DEFAULT &&
        table->abi_version != FG_EXPORT_ABI_VERSION_TMA)
      bad = "takes tensor maps, but the table says layout version 1, which runtimes from before "
            "them read without them (flashgen export writes version 2 for such a table): the "
            "table is damaged or hand-written; export it again";
    if (bad)
      st = fg_export_fail(err, errlen, desc, "kernel %zu ('%s') %s", i,
                          k.variant ? k.variant : "(null)", bad);
  }
  for (size_t i = 0; i < e.n_choices && st == FG_OK; i++) {
    fg_export_choice c;
    fg_read_sized(&c, sizeof c, (const char *)e.choices + i * e.choice_size, e.choice_size);
    fg_variant v;
    char perr[256] = "";
    if (!c.bucket || !c.bucket[0] || !c.variant) {
      st = fg_export_fail(err, errlen, desc, "choice %zu has no bucket or no variant", i);
      break;
    }
    if (fg_variant_parse(c.variant, &v, perr, sizeof perr) != 0) {
      st = fg_export_fail(err, errlen, desc, "choice %zu (%s) names a variant that does not "
                          "parse: %s", i, c.bucket, perr);
      break;
    }
    size_t j = 0;
    while (j < e.n_kernels && strcmp(imgs[j].variant, c.variant) != 0) j++;
    if (j == e.n_kernels) {
      st = fg_export_fail(err, errlen, desc, "choice %zu (%s) names %s, which is not one of "
                          "the table's kernels", i, c.bucket, c.variant);
      break;
    }
    chs[i].bucket = c.bucket;
    chs[i].variant = c.variant;
  }
  if (st != FG_OK) {
    free(reg), free(imgs), free(chs);
    return st;
  }
  reg->pub = table;
  reg->table.description = desc;
  reg->table.kernels = imgs;
  reg->table.n_kernels = e.n_kernels;
  reg->table.choices = chs;
  reg->table.n_choices = e.n_choices;

  pthread_mutex_lock(&fg_export_lock);
  for (fg_export_reg *r = fg_export_regs; r; r = r->next)
    if (r->pub == table) { /* another thread registered it meanwhile */
      pthread_mutex_unlock(&fg_export_lock);
      free(reg), free(imgs), free(chs);
      return FG_OK;
    }
  st = fg_register_exported(&reg->table, err, errlen);
  if (st == FG_OK) {
    reg->next = fg_export_regs;
    fg_export_regs = reg;
  }
  pthread_mutex_unlock(&fg_export_lock);
  if (st != FG_OK) free(reg), free(imgs), free(chs);
  return st;
}
