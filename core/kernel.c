/* kernel.c: kernel images and their plans (core/fg_kernel.h): freeing images, checking a plan,
 * sizing its workspaces from the problem, and the plan's text form, shared by the generator that
 * fills them, the cache that stores them and the runtime that launches them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_kernel.h"

void fg_kernel_image_free(fg_kernel_image *img) {
  if (!img) return;
  free(img->cubin);
  free(img->ptx);
  img->cubin = NULL;
  img->cubin_size = 0;
  img->ptx = NULL;
  img->ptx_size = 0;
}

void fg_kernel_meta_single(fg_kernel_meta *m, const char *entry, fg_grid_kind grid, int br,
                           int threads, int smem_bytes) {
  memset(m, 0, sizeof *m);
  m->n_steps = 1;
  snprintf(m->steps[0].entry, sizeof m->steps[0].entry, "%s", entry);
  m->steps[0].grid = grid;
  m->steps[0].br = br;
  m->steps[0].threads = threads;
  m->steps[0].smem_bytes = smem_bytes;
  m->regs = m->spill_store_bytes = m->spill_load_bytes = m->stack_bytes = -1;
}

static const char *const grid_names[] = {NULL, "q_tiles", "heads", "rows", "kv_tiles",
                                         "persistent", "q_tile_pairs"};

const char *fg_grid_kind_name(fg_grid_kind g) {
  return g >= FG_GRID_Q_TILES && g <= FG_GRID_Q_TILE_PAIRS ? grid_names[g] : "?";
}

fg_grid_kind fg_grid_kind_parse(const char *s) {
  for (int g = FG_GRID_Q_TILES; s && g <= FG_GRID_Q_TILE_PAIRS; g++)
    if (strcmp(s, grid_names[g]) == 0) return (fg_grid_kind)g;
  return (fg_grid_kind)0;
}

static const char *const param_names[] = {"fwd", "fwd_tma", "bwd_tma"};
static const char *const tmap_names[] = {NULL, "q", "k", "v", "o", "do"};

const char *fg_param_block_name(fg_param_block p) {
  return p >= FG_PARAMS_DEFAULT && p <= FG_PARAMS_BWD_TMA ? param_names[p] : "?";
}

int fg_param_block_parse(const char *s) {
  for (int p = FG_PARAMS_DEFAULT; s && p <= FG_PARAMS_BWD_TMA; p++)
    if (strcmp(s, param_names[p]) == 0) return p;
  return -1;
}

const char *fg_tmap_tensor_name(fg_tmap_tensor t) {
  return t >= FG_TMAP_Q && t <= FG_TMAP_DO ? tmap_names[t] : "?";
}

fg_tmap_tensor fg_tmap_tensor_parse(const char *s) {
  for (int t = FG_TMAP_Q; s && t <= FG_TMAP_DO; t++)
    if (strcmp(s, tmap_names[t]) == 0) return (fg_tmap_tensor)t;
  return (fg_tmap_tensor)0;
}

const char *fg_kernel_meta_invalid(const fg_kernel_meta *m) {
  if (m->n_steps < 1 || m->n_steps > FG_PLAN_MAX_STEPS) return "its plan has no steps, or too many";
  if (m->main_step < 0 || m->main_step >= m->n_steps) return "its plan's main step is not a step";
  for (int i = 0; i < m->n_steps; i++) {
    const fg_plan_step *s = &m->steps[i];
    if (!s->entry[0] || !memchr(s->entry, 0, sizeof s->entry))
      return "a step of its plan has no entry point (or one too long)";
    if (s->grid < FG_GRID_Q_TILES || s->grid > FG_GRID_Q_TILE_PAIRS)
      return "a step of its plan has an unknown grid kind";
    if ((s->grid == FG_GRID_Q_TILES || s->grid == FG_GRID_KV_TILES ||
         s->grid == FG_GRID_PERSISTENT || s->grid == FG_GRID_Q_TILE_PAIRS) &&
        s->br <= 0)
      return "a step of its plan has no rows per block (br)";
    if (s->threads <= 0 || s->smem_bytes < 0)
      return "a step of its plan has malformed threads or shared memory";
    if (s->split_rows < 0 || (s->split_rows > 0 && (i != m->main_step || s->grid != FG_GRID_KV_TILES)))
      return "a step of its plan splits its query range (split_rows) but is not a kv_tiles main step";
    if (s->tail != 0 && s->tail != 1) return "a step of its plan is malformed (tail)";
    if (s->tail && (i != m->main_step || s->grid != FG_GRID_KV_TILES))
      return "a step of its plan runs with a tail but is not a kv_tiles main step";
  }
  if (m->n_workspaces < 0 || m->n_workspaces > FG_PLAN_MAX_WORKSPACES)
    return "its plan has too many workspaces";
  for (int i = 0; i < m->n_workspaces; i++) {
    const fg_plan_workspace *w = &m->workspaces[i];
    if (!w->name[0] || !memchr(w->name, 0, sizeof w->name) || !w->param[0] ||
        !memchr(w->param, 0, sizeof w->param) || w->bytes <= 0 || w->rows < 1)
      return "a workspace of its plan is malformed (name, param, bytes or rows)";
    if (w->min_group_rows < 0 || (w->per_key != 0 && w->per_key != 1))
      return "a workspace of its plan is malformed (per_key or min_group_rows)";
    if (w->per_key && (fg_kernel_main(m)->grid != FG_GRID_KV_TILES ||
                       fg_kernel_main(m)->br % w->rows != 0))
      return "a workspace of its plan is per key row but its main step's grid is not kv_tiles "
             "(or its rows does not divide the main step's br)";
    if (w->tail != 0 && w->tail != 1) return "a workspace of its plan is malformed (tail)";
    /* A tail workspace holds whole key blocks of the launch's tail, whatever the problem: the
     * runtime sizes it by those blocks alone (fg_plan_workspace_bytes_tail). */
    if (w->tail && (!w->per_key || w->rows != fg_kernel_main(m)->br || w->min_group_rows != 0 ||
                    w->deterministic_only))
      return "a tail workspace of its plan is not per key block of the main step (per_key 1, rows "
             "its br) or has a condition (min_group_rows, deterministic_only)";
    if (w->tail && !fg_kernel_main(m)->tail)
      return "its plan has a tail workspace but its main step runs without a tail";
  }
  if (fg_kernel_main(m)->tail) {
    int found = 0;
    for (int i = 0; i < m->n_workspaces; i++) found |= m->workspaces[i].tail;
    if (!found)
      return "its main step runs with a tail but no tail workspace takes the pieces' partial sums";
  }
  const int split = fg_kernel_main(m)->split_rows;
  if (split > 0) {
    int found = 0;
    for (int i = 0; i < m->n_workspaces; i++)
      found |= m->workspaces[i].per_key && m->workspaces[i].min_group_rows == split;
    if (!found)
      return "its main step splits its query range (split_rows) but no per-key workspace of the "
             "same threshold (min_group_rows) takes the splits' partial sums";
  }
  if (m->params < FG_PARAMS_DEFAULT || m->params > FG_PARAMS_BWD_TMA)
    return "its plan has an unknown parameter block";
  if (m->n_tmaps < 0 || m->n_tmaps > FG_PLAN_MAX_TMAPS)
    return "its plan has more tensor maps than a TMA parameter block holds (4)";
  if (m->n_tmaps && m->params == FG_PARAMS_DEFAULT)
    return "its plan has tensor maps but not a parameter block that carries them (fwd_tma or "
           "bwd_tma)";
  for (int i = 0; i < m->n_tmaps; i++) {
    const fg_tmap_tensor t = m->tmaps[i].tensor;
    if (t < FG_TMAP_Q || t > FG_TMAP_DO || m->tmaps[i].rows < 1 || m->tmaps[i].rows > 256)
      return "a tensor map of its plan is malformed (tensor q, k, v, o or do; rows 1 to 256)";
    /* The forward has no dO; the backward's maps are of its inputs (O is read through p). */
    if (m->params == FG_PARAMS_FWD_TMA && t == FG_TMAP_DO)
      return "a tensor map of its fwd_tma plan views do, which the forward does not have (its "
             "maps view q, k, v or o)";
    if (m->params == FG_PARAMS_BWD_TMA && t == FG_TMAP_O)
      return "a tensor map of its bwd_tma plan views o, which the backward's maps do not (they "
             "view q, k, v or do)";
  }
  return NULL;
}

const char *fg_kernel_meta_invalid_for(const fg_kernel_meta *m, fg_pass pass) {
  /* The pass first: a block of the other pass is the more basic mistake than its maps. */
  if (pass != FG_PASS_FWD && m->params == FG_PARAMS_FWD_TMA)
    return "its plan takes the forward's tensor-map block (fwd_tma) but the variant is a "
           "backward one, whose plan takes bwd_tma (or the default block)";
  if (pass != FG_PASS_BWD && m->params == FG_PARAMS_BWD_TMA)
    return "its plan takes the backward's tensor-map block (bwd_tma) but the variant is a "
           "forward one, whose plan takes fwd_tma (or the default block)";
  return fg_kernel_meta_invalid(m);
}

uint64_t fg_plan_group_rows(int64_t heads_q, int64_t heads_kv, int64_t seqlen_q) {
  uint64_t group = heads_kv > 0 ? (uint64_t)heads_q / (uint64_t)heads_kv : (uint64_t)heads_q;
  uint64_t rows;
  return __builtin_mul_overflow((uint64_t)seqlen_q, group, &rows) ? UINT64_MAX : rows;
}

uint64_t fg_plan_step_splits(const fg_plan_step *s, int64_t heads_q, int64_t heads_kv,
                             int64_t seqlen_q) {
  if (s->split_rows <= 0) return 1;
  const uint64_t rows = fg_plan_group_rows(heads_q, heads_kv, seqlen_q), per = (uint64_t)s->split_rows;
  if (rows <= per) return 1;
  const uint64_t n = rows / per + (rows % per != 0);
  return n < 65535 ? n : 65535;
}

uint64_t fg_plan_workspace_units(const fg_plan_workspace *w, int main_br, int64_t heads_q,
                                 int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                 int deterministic) {
  if (w->tail) return 0; /* per launch, not per head: fg_plan_workspace_bytes_tail */
  if (w->deterministic_only && !deterministic) return 0;
  if (w->min_group_rows > 0 &&
      fg_plan_group_rows(heads_q, heads_kv, seqlen_q) <= (uint64_t)w->min_group_rows)
    return 0;
  if (w->per_key) {
    if (main_br <= 0) return 0; /* not a well-formed plan (fg_kernel_meta_invalid) */
    uint64_t br = (uint64_t)main_br;
    return ((uint64_t)seqlen_k + br - 1) / br * br / (uint64_t)w->rows;
  }
  return ((uint64_t)seqlen_q + (uint64_t)w->rows - 1) / (uint64_t)w->rows;
}

int fg_plan_workspace_bytes(const fg_kernel_meta *m, int64_t batch, int64_t heads_q,
                            int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k, int deterministic,
                            uint64_t *bytes, uint64_t offsets[FG_PLAN_MAX_WORKSPACES]) {
  return fg_plan_workspace_bytes_tail(m, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                      deterministic, 0, bytes, offsets);
}

int fg_plan_workspace_bytes_tail(const fg_kernel_meta *m, int64_t batch, int64_t heads_q,
                                 int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                 int deterministic, uint64_t tail_blocks, uint64_t *bytes,
                                 uint64_t offsets[FG_PLAN_MAX_WORKSPACES]) {
  uint64_t total = 0;
  const int main_br = m->main_step >= 0 && m->main_step < FG_PLAN_MAX_STEPS
                          ? fg_kernel_main(m)->br
                          : 0;
  for (int i = 0; i < m->n_workspaces && i < FG_PLAN_MAX_WORKSPACES; i++) {
    const fg_plan_workspace *w = &m->workspaces[i];
    uint64_t n;
    if (offsets) offsets[i] = total;
    if (w->tail) { /* the launch's tail key blocks, in total (units 0: not per head) */
      if (__builtin_mul_overflow(tail_blocks, (uint64_t)w->bytes, &n) ||
          __builtin_add_overflow(total, n, &total))
        return -1;
      continue;
    }
    if (__builtin_mul_overflow((uint64_t)batch,
                               (uint64_t)fg_plan_workspace_heads(w, heads_q, heads_kv), &n) ||
        __builtin_mul_overflow(n,
                               fg_plan_workspace_units(w, main_br, heads_q, heads_kv, seqlen_q,
                                                       seqlen_k, deterministic),
                               &n) ||
        __builtin_mul_overflow(n, (uint64_t)w->bytes, &n) ||
        __builtin_add_overflow(total, n, &total))
      return -1;
  }
  *bytes = total;
  return 0;
}

int fg_kernel_plan_format(const fg_kernel_meta *m, char *buf, size_t len) {
  size_t n = 0;
  int r = snprintf(buf, len, "main %d\n", m->main_step);
#define FG_ADVANCE()                                      \
  do {                                                    \
    if (r < 0) return r;                                  \
    n += (size_t)r;                                       \
  } while (0)
  FG_ADVANCE();
  for (int i = 0; i < m->n_steps && i < FG_PLAN_MAX_STEPS; i++) {
    const fg_plan_step *s = &m->steps[i];
    /* split_rows only where a step splits, tail only where it has one (then split_rows too, even
     * 0, so that tail is always the 7th number): the step lines of every other plan (all forward
     * plans) read as they did before they existed. */
    if (s->tail > 0)
      r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0,
                   "step %.*s %s %d %d %d %d %d\n", (int)sizeof s->entry, s->entry,
                   fg_grid_kind_name(s->grid), s->br, s->threads, s->smem_bytes, s->split_rows,
                   s->tail);
    else if (s->split_rows > 0)
      r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "step %.*s %s %d %d %d %d\n",
                   (int)sizeof s->entry, s->entry, fg_grid_kind_name(s->grid), s->br, s->threads,
                   s->smem_bytes, s->split_rows);
    else
      r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "step %.*s %s %d %d %d\n",
                   (int)sizeof s->entry, s->entry, fg_grid_kind_name(s->grid), s->br, s->threads,
                   s->smem_bytes);
    FG_ADVANCE();
  }
  for (int i = 0; i < m->n_workspaces && i < FG_PLAN_MAX_WORKSPACES; i++) {
    const fg_plan_workspace *w = &m->workspaces[i];
    r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "workspace %.*s %.*s %d %d %d %d %lld",
                 (int)sizeof w->name, w->name, (int)sizeof w->param, w->param, w->bytes, w->rows,
                 w->deterministic_only, w->per_key, w->min_group_rows);
    FG_ADVANCE();
    /* tail only on a tail workspace: every other line reads as it did before tail existed. */
    r = w->tail ? snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, " %d\n", w->tail)
                : snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "\n");
    FG_ADVANCE();
  }
  /* Only plans that have them carry these lines: older plans' text (and checksums) stay as they
   * were. */
  if (m->params != FG_PARAMS_DEFAULT || m->n_tmaps > 0) {
    r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "params %s\n",
                 fg_param_block_name(m->params));
    FG_ADVANCE();
  }
  for (int i = 0; i < m->n_tmaps && i < FG_PLAN_MAX_TMAPS; i++) {
    r = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "tmap %s %d\n",
                 fg_tmap_tensor_name(m->tmaps[i].tensor), m->tmaps[i].rows);
    FG_ADVANCE();
  }
#undef FG_ADVANCE
  return (int)n;
}

const char *fg_kernel_plan_parse(const char *text, fg_kernel_meta *m) {
  m->n_steps = m->n_workspaces = m->n_tmaps = 0;
  m->main_step = -1;
  m->params = FG_PARAMS_DEFAULT; /* plans from before parameter blocks: the pass's own */
  for (const char *p = text; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    char line[256], a[64], b[64];
    if (n >= sizeof line) return "a line of its plan is too long";
    memcpy(line, p, n);
    line[n] = 0;
    p = nl ? nl + 1 : p + n;
    int x, y, z, pk, sr = 0, tl = 0, k, end = 0;
    long long mg;
    if (sscanf(line, "main %d%n", &x, &end) == 1 && !line[end]) {
      m->main_step = x;
    } else if ((k = sscanf(line, "step %63s %63s %d %d %d%n %d%n %d%n", a, b, &x, &y, &z, &end,
                           &sr, &end, &tl, &end)) >= 5 &&
               !line[end]) {
      /* Five numbers: written before split_rows, by plans that never split (split_rows 0); six:
       * before tail, or a step without one (tail 0). */
      if (m->n_steps == FG_PLAN_MAX_STEPS) return "its plan has too many steps";
      fg_plan_step *s = &m->steps[m->n_steps++];
      memset(s, 0, sizeof *s);
      snprintf(s->entry, sizeof s->entry, "%s", a);
      s->grid = fg_grid_kind_parse(b);
      s->br = x;
      s->threads = y;
      s->smem_bytes = z;
      s->split_rows = k >= 6 ? sr : 0;
      s->tail = k == 7 ? tl : 0;
    } else if ((k = sscanf(line, "workspace %63s %63s %d %d %d %d %lld%n %d%n", a, b, &x, &y, &z,
                           &pk, &mg, &end, &tl, &end)) >= 7 &&
               !line[end]) {
      /* A line of the shape before per_key and min_group_rows (5 numbers) does not match: the
       * caller takes the plan as malformed (a cache miss), never as a plan without them. Without
       * the 8th number (tail), as written before it and for every workspace but a tail one: 0. */
      if (m->n_workspaces == FG_PLAN_MAX_WORKSPACES) return "its plan has too many workspaces";
      fg_plan_workspace *w = &m->workspaces[m->n_workspaces++];
      memset(w, 0, sizeof *w);
      if (strlen(a) >= sizeof w->name || strlen(b) >= sizeof w->param)
        return "a workspace of its plan has a name too long";
      memcpy(w->name, a, strlen(a));
      memcpy(w->param, b, strlen(b));
      w->bytes = x;
      w->rows = y;
      w->deterministic_only = z;
      w->per_key = pk;
      w->min_group_rows = mg;
      w->tail = k == 8 ? tl : 0;
    } else if (sscanf(line, "params %63s%n", a, &end) == 1 && !line[end]) {
      const int pb = fg_param_block_parse(a);
      if (pb < 0) return "its plan names a parameter block this flashgen does not know";
      m->params = (fg_param_block)pb;
    } else if (sscanf(line, "tmap %63s %d%n", a, &x, &end) == 2 && !line[end]) {
      if (m->n_tmaps == FG_PLAN_MAX_TMAPS) return "its plan has too many tensor maps";
      fg_plan_tmap *t = &m->tmaps[m->n_tmaps++];
      if (!(t->tensor = fg_tmap_tensor_parse(a)))
        return "a tensor map of its plan names a tensor other than q, k, v, o or do";
      t->rows = x;
    } else {
      return "its plan has a line that is not main, step, workspace, params or tmap";
    }
  }
  return fg_kernel_meta_invalid(m);
}
