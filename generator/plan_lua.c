/* plan_lua.c: reading a manifest's launch plan (launch(v) of fwd.lua and bwd.lua, reference() of
 * fwd.lua) from the Lua stack into fg_kernel_meta: steps, workspaces, parameter block, tensor
 * maps, and the template constants it hands the renderer. render.c calls these with its lock
 * held; they touch only the stack. */
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "plan_lua.h"

int fg_lua_int_field(lua_State *L, int idx, const char *k) {
  lua_getfield(L, idx, k);
  int v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* Copies string field k of the table at idx into out; 0, or -1 when it is missing or too long. */
static int get_str_field(lua_State *L, int idx, const char *k, char *out, size_t n) {
  lua_getfield(L, idx, k);
  const char *v = lua_tostring(L, -1);
  int ok = v && *v && strlen(v) < n;
  if (ok) snprintf(out, n, "%s", v);
  lua_pop(L, 1);
  return ok ? 0 : -1;
}

/* Reads flag field k of the table at idx into *out: true / 1 is 1, false / 0 / absent is 0.
 * 0, or -1 when it is anything else (the manifest meant something this reader does not). */
static int get_flag_field(lua_State *L, int idx, const char *k, int *out) {
  lua_getfield(L, idx, k);
  int ok = 1;
  if (lua_isnil(L, -1) || lua_isboolean(L, -1))
    *out = lua_toboolean(L, -1);
  else if (lua_isinteger(L, -1) && (lua_tointeger(L, -1) == 0 || lua_tointeger(L, -1) == 1))
    *out = (int)lua_tointeger(L, -1);
  else
    ok = 0;
  lua_pop(L, 1);
  return ok ? 0 : -1;
}

/* Fills meta from the plan (a launch table: main, steps, workspaces, params, tmaps) at the top of
 * the stack; what names the manifest function for messages. 0, or -1 with the reason. */
int fg_lua_read_launch(lua_State *L, fg_pass pass, fg_kernel_meta *meta, const char *what,
                       char *err, size_t errlen) {
  memset(meta, 0, sizeof *meta);
  meta->regs = meta->spill_store_bytes = meta->spill_load_bytes = meta->stack_bytes = -1;
  const char *bad = NULL;
  meta->main_step = fg_lua_int_field(L, -1, "main") - 1; /* Lua counts from 1 */
  lua_getfield(L, -1, "steps");
  if (!lua_istable(L, -1)) bad = "returns no steps list";
  int n = bad ? 0 : (int)luaL_len(L, -1);
  if (!bad && (n < 1 || n > FG_PLAN_MAX_STEPS)) bad = "returns no steps, or more than the runtime takes";
  for (int i = 0; !bad && i < n; i++) {
    fg_plan_step *s = &meta->steps[meta->n_steps++];
    lua_rawgeti(L, -1, i + 1);
    char grid[16] = "";
    if (!lua_istable(L, -1) || get_str_field(L, -1, "entry", s->entry, sizeof s->entry) ||
        get_str_field(L, -1, "grid", grid, sizeof grid) || !(s->grid = fg_grid_kind_parse(grid)))
      bad = "returns a step without an entry (of up to 63 characters) or a known grid kind";
    else {
      s->br = fg_lua_int_field(L, -1, "br");
      s->threads = fg_lua_int_field(L, -1, "threads");
      s->smem_bytes = fg_lua_int_field(L, -1, "smem");
      /* split_rows = N: past N query rows per KV head the main step splits them (fg_kernel.h). */
      lua_getfield(L, -1, "split_rows");
      if (!lua_isnil(L, -1) && !lua_isinteger(L, -1))
        bad = "returns a step whose split_rows is not an integer";
      s->split_rows = (int)lua_tointeger(L, -1);
      lua_pop(L, 1);
      /* tail = true: the main step may run with a tail, into the plan's tail workspace. */
      if (get_flag_field(L, -1, "tail", &s->tail) && !bad)
        bad = "returns a step whose tail is neither a boolean nor 0 or 1";
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_getfield(L, -1, "workspaces");
  n = lua_istable(L, -1) ? (int)luaL_len(L, -1) : 0;
  if (!bad && n > FG_PLAN_MAX_WORKSPACES) bad = "returns more workspaces than the runtime takes";
  for (int i = 0; !bad && i < n; i++) {
    fg_plan_workspace *w = &meta->workspaces[meta->n_workspaces++];
    lua_rawgeti(L, -1, i + 1);
    if (!lua_istable(L, -1) || get_str_field(L, -1, "name", w->name, sizeof w->name) ||
        get_str_field(L, -1, "param", w->param, sizeof w->param))
      bad = "returns a workspace without a name (up to 23 characters) or param (up to 15)";
    else {
      w->bytes = fg_lua_int_field(L, -1, "bytes");
      w->rows = fg_lua_int_field(L, -1, "rows");
      lua_getfield(L, -1, "deterministic");
      w->deterministic_only = lua_toboolean(L, -1);
      lua_pop(L, 1);
      /* per = "key": units are key rows of each (batch, KV head); absent: query rows. */
      lua_getfield(L, -1, "per");
      const char *per = lua_tostring(L, -1);
      if (per && strcmp(per, "key") == 0)
        w->per_key = 1;
      else if (per)
        bad = "returns a workspace whose per is neither \"key\" nor absent";
      lua_pop(L, 1);
      lua_getfield(L, -1, "min_group_rows");
      if (!lua_isnil(L, -1) && !lua_isinteger(L, -1))
        bad = "returns a workspace whose min_group_rows is not an integer";
      w->min_group_rows = (long long)lua_tointeger(L, -1);
      lua_pop(L, 1);
      /* tail = true: holds the launch's tail key blocks (per launch, not per head). */
      if (get_flag_field(L, -1, "tail", &w->tail) && !bad)
        bad = "returns a workspace whose tail is neither a boolean nor 0 or 1";
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  /* The parameter block (absent: the pass's own) and the tensor maps the runtime encodes into
   * it (tmap[i] of fg_fwd_tma_params or fg_bwd_tma_params from tmaps[i]). */
  lua_getfield(L, -1, "params");
  if (!bad && !lua_isnil(L, -1)) {
    const char *pb = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    const int b = pb ? fg_param_block_parse(pb) : -1;
    if (b < 0) bad = "returns params other than \"fwd\", \"fwd_tma\" or \"bwd_tma\"";
    else meta->params = (fg_param_block)b;
  }
  lua_pop(L, 1);
  lua_getfield(L, -1, "tmaps");
  if (!bad && !lua_isnil(L, -1) && !lua_istable(L, -1)) bad = "returns tmaps that is not a list";
  n = !bad && lua_istable(L, -1) ? (int)luaL_len(L, -1) : 0;
  if (!bad && n > FG_PLAN_MAX_TMAPS)
    bad = "returns more than 4 tensor maps (a TMA parameter block holds 4)";
  if (!bad && n > 0 && meta->params == FG_PARAMS_DEFAULT)
    bad = "returns tmaps without params = \"fwd_tma\" or \"bwd_tma\" (the block that carries "
          "them)";
  for (int i = 0; !bad && i < n; i++) {
    fg_plan_tmap *t = &meta->tmaps[meta->n_tmaps++];
    char tensor[8] = "";
    lua_rawgeti(L, -1, i + 1);
    if (!lua_istable(L, -1) || get_str_field(L, -1, "tensor", tensor, sizeof tensor) ||
        !(t->tensor = fg_tmap_tensor_parse(tensor)))
      bad = "returns a tensor map whose tensor is not \"q\", \"k\", \"v\", \"o\" or \"do\"";
    else {
      lua_getfield(L, -1, "rows");
      int isint = 0;
      const lua_Integer rows = lua_tointegerx(L, -1, &isint);
      lua_pop(L, 1);
      if (!isint || rows < 1 || rows > 256)
        bad = "returns a tensor map whose rows is not an integer from 1 to 256 (a TMA box's "
              "limit)";
      else t->rows = (int)rows;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (!bad) bad = fg_kernel_meta_invalid_for(meta, pass);
  if (!bad) return 0;
  snprintf(err, errlen, "the manifest's %s %s: fix its plan (see templates/README.md)", what, bad);
  return -1;
}

/* Adds the plan's template constants (launch(v).constants, e.g. the backward's PRE_ROWS) to the
 * params table at index params, so a template and its manifest share one copy. The launch table
 * is at the top of the stack. */
void fg_lua_copy_fields(lua_State *L, int to) {
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_settable(L, to);
  }
}

void fg_lua_add_constants(lua_State *L, int params) {
  lua_getfield(L, -1, "constants");
  if (lua_istable(L, -1)) fg_lua_copy_fields(L, params);
  lua_pop(L, 1);
}

