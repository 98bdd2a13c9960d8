/* render.c: the generator's Lua side: a sandboxed Lua 5.4 state (base, string, table, math; no
 * io, os, package, no file loading), the template sources (embedded, or FLASHGEN_TEMPLATE_DIR),
 * rendering variants through templates/engine.lua and reading the launch contracts and resource
 * formulas from templates/fwd.lua. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "fg_gen.h"
#include "fg_templates.h"

struct fg_generator {
  lua_State *L;
  pthread_mutex_t mu;
  char template_dir[1024]; /* "" = embedded */
  uint64_t template_hash;
  int engine_ref, manifest_ref[FG_PASS_COUNT]; /* fwd.lua, bwd.lua */
};

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* Reads a template by name into a malloc'd buffer; NULL with err on failure. */
static char *read_template_text(const fg_generator *g, const char *name, size_t *len, char *err,
                                size_t errlen) {
  if (strchr(name, '/') || strstr(name, "..")) {
    snprintf(err, errlen, "template name '%s' must be a plain file name", name);
    return NULL;
  }
  if (g->template_dir[0]) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", g->template_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
      snprintf(err, errlen, "cannot read template %s: %s (FLASHGEN_TEMPLATE_DIR=%s)", path,
               strerror(errno), g->template_dir);
      return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
      if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
      size_t r = fread(buf + n, 1, cap - n - 1, f);
      if (r == 0) break;
      n += r;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
  }
  for (const fg_embedded_template *t = fg_embedded_templates; t->name; t++) {
    if (strcmp(t->name, name) == 0) {
      char *buf = malloc(t->length + 1);
      memcpy(buf, t->text, t->length);
      buf[t->length] = 0;
      *len = t->length;
      return buf;
    }
  }
  snprintf(err, errlen, "no template named '%s' is embedded in this build", name);
  return NULL;
}

/* Lua: read_template(name) -> text | nil, message */
static int l_read_template(lua_State *L) {
  const fg_generator *g = lua_touserdata(L, lua_upvalueindex(1));
  const char *name = luaL_checkstring(L, 1);
  char err[1400];
  size_t len = 0;
  char *text = read_template_text(g, name, &len, err, sizeof err);
  if (!text) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushlstring(L, text, len);
  free(text);
  return 1;
}

/* Message handler: keep the message (which starts with "template:line:"), add a traceback. */
static int msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = "(error object is not a string)";
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Calls the function on the stack with nargs/nres under msgh; on error copies the first line
 * of the message (template:line: message) and the template frames into err. */
static int pcall(lua_State *L, int nargs, int nres, char *err, size_t errlen) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  if (rc != LUA_OK) {
    const char *m = lua_tostring(L, -1);
    /* Keep the message and the traceback lines that name templates (not engine internals). */
    size_t w = 0;
    const char *nl = strchr(m, '\n');
    size_t first = nl ? (size_t)(nl - m) : strlen(m);
    w = (size_t)snprintf(err, errlen, "%.*s", (int)first, m);
    while (nl && w + 1 < errlen) {
      const char *line = nl + 1;
      nl = strchr(line, '\n');
      size_t ll = nl ? (size_t)(nl - line) : strlen(line);
      while (ll && (*line == '\t' || *line == ' ')) line++, ll--;
      if ((strstr(line, ".cu:") || strstr(line, ".cuh:") || strstr(line, ".h:")) && ll < 300 &&
          memcmp(line, "[C]", 3) != 0)
        w += (size_t)snprintf(err + w, errlen - w, "\n  from %.*s", (int)ll, line);
    }
    lua_pop(L, 1);
    return -1;
  }
  return 0;
}

/* Loads templates/NAME.lua as a chunk and runs it with one argument (or none) -> ref. */
static int load_lua_file(fg_generator *g, const char *name, int pass_reader, int *ref, char *err,
                         size_t errlen) {
  size_t len;
  char *text = read_template_text(g, name, &len, err, errlen);
  if (!text) return -1;
  char chunkname[128];
  snprintf(chunkname, sizeof chunkname, "=%s", name);
  int rc = luaL_loadbufferx(g->L, text, len, chunkname, "t");
  free(text);
  if (rc != LUA_OK) {
    snprintf(err, errlen, "%s", lua_tostring(g->L, -1));
    lua_pop(g->L, 1);
    return -1;
  }
  if (pass_reader) {
    lua_pushlightuserdata(g->L, g);
    lua_pushcclosure(g->L, l_read_template, 1);
  }
  if (pcall(g->L, pass_reader ? 1 : 0, 1, err, errlen)) return -1;
  if (!lua_istable(g->L, -1)) {
    snprintf(err, errlen, "%s must return a table", name);
    lua_pop(g->L, 1);
    return -1;
  }
  *ref = luaL_ref(g->L, LUA_REGISTRYINDEX);
  return 0;
}

static const char *const hashed_templates[] = {"engine.lua", "fwd.lua", "common.cuh",
                                               "fg_params.h", "fwd_q_outer.cu", "fwd_kv_outer.cu",
                                               "reference.cu", "fwd_wgmma.cu", "bwd.lua",
                                               "bwd.cu", NULL};

int fg_generator_create(fg_generator **out, char *err, size_t errlen) {
  *out = NULL;
  fg_generator *g = calloc(1, sizeof *g);
  if (!g) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  pthread_mutex_init(&g->mu, NULL);
  const char *dir = getenv("FLASHGEN_TEMPLATE_DIR");
  if (dir && *dir) snprintf(g->template_dir, sizeof g->template_dir, "%s", dir);

  /* Template hash: every template file's name and text. */
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *const *n = hashed_templates; *n; n++) {
    size_t len;
    char *text = read_template_text(g, *n, &len, err, errlen);
    if (!text) goto fail;
    h = fnv1a(h, *n, strlen(*n) + 1);
    h = fnv1a(h, text, len);
    free(text);
  }
  g->template_hash = h;

  g->L = luaL_newstate();
  if (!g->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    goto fail;
  }
  /* The sandbox: base, string, table and math only; no file loading from Lua. */
  luaL_requiref(g->L, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(g->L, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(g->L, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(g->L, LUA_MATHLIBNAME, luaopen_math, 1);
  lua_pop(g->L, 4);
  static const char *const removed[] = {"dofile", "loadfile", "collectgarbage", NULL};
  for (const char *const *r = removed; *r; r++) {
    lua_pushnil(g->L);
    lua_setglobal(g->L, *r);
  }
  if (load_lua_file(g, "engine.lua", 1, &g->engine_ref, err, errlen)) goto fail;
  if (load_lua_file(g, "fwd.lua", 0, &g->manifest_ref[FG_PASS_FWD], err, errlen)) goto fail;
  if (load_lua_file(g, "bwd.lua", 0, &g->manifest_ref[FG_PASS_BWD], err, errlen)) goto fail;
  *out = g;
  return 0;
fail:
  fg_generator_destroy(g);
  return -1;
}

void fg_generator_destroy(fg_generator *g) {
  if (!g) return;
  if (g->L) lua_close(g->L);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

uint64_t fg_generator_template_hash(const fg_generator *g) { return g->template_hash; }

const char *fg_generator_template_source(const fg_generator *g) {
  return g->template_dir[0] ? g->template_dir : "embedded";
}

/* Pushes the variant as a Lua table (the template parameters). */
static void push_variant(lua_State *L, const fg_variant *v) {
  char name[FG_VARIANT_NAME_MAX];
  fg_variant_name(v, name, sizeof name);
  lua_createtable(L, 0, 16);
  lua_pushstring(L, fg_pass_name(v->pass));
  lua_setfield(L, -2, "pass");
  lua_pushinteger(L, v->d);
  lua_setfield(L, -2, "d");
  lua_pushinteger(L, v->br);
  lua_setfield(L, -2, "br");
  lua_pushinteger(L, v->bc);
  lua_setfield(L, -2, "bc");
  lua_pushstring(L, fg_dtype_name(v->dtype));
  lua_setfield(L, -2, "dtype");
  lua_pushboolean(L, v->causal);
  lua_setfield(L, -2, "causal");
  lua_pushstring(L, fg_loop_name(v->loop));
  lua_setfield(L, -2, "loop");
  lua_pushinteger(L, v->warps);
  lua_setfield(L, -2, "warps");
  lua_pushinteger(L, v->stages);
  lua_setfield(L, -2, "stages");
  lua_pushstring(L, fg_arch_name(v->arch));
  lua_setfield(L, -2, "arch");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "name");
}

static int get_int_field(lua_State *L, int idx, const char *k) {
  lua_getfield(L, idx, k);
  int v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* Calls the manifest of op `pass`: manifest.fn(the nargs arguments at the top), leaving the
 * result on the stack. */
static int call_manifest(fg_generator *g, fg_pass pass, const char *fn, int nargs, char *err,
                         size_t errlen) {
  lua_State *L = g->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, g->manifest_ref[pass]);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_insert(L, -1 - nargs);
  return pcall(L, nargs, 1, err, errlen);
}

int fg_generator_resources(fg_generator *g, const fg_variant *v, fg_resources *out, char *err,
                           size_t errlen) {
  if (fg_variant_check(v, err, errlen)) return -1;
  pthread_mutex_lock(&g->mu);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  push_variant(L, v);
  int rc = call_manifest(g, v->pass, "resources", 1, err, errlen);
  if (rc == 0) {
    out->threads = get_int_field(L, -1, "threads");
    out->smem_bytes = get_int_field(L, -1, "smem");
    out->regs_estimate = get_int_field(L, -1, "regs");
  }
  lua_settop(L, top);
  pthread_mutex_unlock(&g->mu);
  return rc;
}

/* Template-specific rules (fwd.lua check): 0, or -1 with the reason. Lock held. */
static int manifest_check(fg_generator *g, const fg_variant *v, char *err, size_t errlen) {
  lua_State *L = g->L;
  int top = lua_gettop(L);
  push_variant(L, v);
  int rc = call_manifest(g, v->pass, "check", 1, err, errlen);
  if (rc == 0 && lua_isstring(L, -1)) {
    snprintf(err, errlen, "%s", lua_tostring(L, -1));
    rc = -1;
  }
  lua_settop(L, top);
  return rc;
}

/* Fills meta from a launch table at the top of the stack. */
static void read_launch(lua_State *L, fg_kernel_meta *meta) {
  memset(meta, 0, sizeof *meta);
  lua_getfield(L, -1, "entry");
  snprintf(meta->entry, sizeof meta->entry, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  meta->threads = get_int_field(L, -1, "threads");
  meta->smem_bytes = get_int_field(L, -1, "smem");
  meta->br = get_int_field(L, -1, "br");
  meta->workspace_floats_per_row = get_int_field(L, -1, "workspace");
  lua_getfield(L, -1, "grid");
  const char *gk = lua_tostring(L, -1);
  meta->grid = strcmp(gk, "q_tiles") == 0    ? FG_GRID_Q_TILES
               : strcmp(gk, "heads") == 0    ? FG_GRID_HEADS
               : strcmp(gk, "kv_tiles") == 0 ? FG_GRID_KV_TILES
                                             : FG_GRID_ROWS;
  lua_pop(L, 1);
  meta->regs = meta->spill_store_bytes = meta->spill_load_bytes = meta->stack_bytes = -1;
}

/* Renders template `tpl` with the params table at the top of the stack (popped). Lock held. */
static int render_with(fg_generator *g, const char *tpl, char **src, char *err, size_t errlen) {
  lua_State *L = g->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, g->engine_ref);
  lua_getfield(L, -1, "render");
  lua_remove(L, -2);
  lua_pushstring(L, tpl);
  lua_rotate(L, -3, -1); /* render, name, params */
  if (pcall(L, 2, 1, err, errlen)) return -1;
  size_t len;
  const char *s = lua_tolstring(L, -1, &len);
  *src = malloc(len + 1);
  memcpy(*src, s, len + 1);
  lua_pop(L, 1);
  return 0;
}

int fg_generator_render(fg_generator *g, const fg_variant *v, char **src, fg_kernel_meta *meta,
                        char *err, size_t errlen) {
  *src = NULL;
  if (fg_variant_check(v, err, errlen)) return -1;
  pthread_mutex_lock(&g->mu);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  int rc = manifest_check(g, v, err, errlen);
  if (rc == 0) {
    push_variant(L, v);
    rc = call_manifest(g, v->pass, "launch", 1, err, errlen);
  }
  if (rc == 0) {
    read_launch(L, meta);
    lua_getfield(L, -1, "template");
    char tpl[64];
    snprintf(tpl, sizeof tpl, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    /* Template parameters: the variant, plus the layout the manifest derives. */
    push_variant(L, v);
    int params = lua_gettop(L);
    lua_pushvalue(L, params);
    if ((rc = call_manifest(g, v->pass, "layout", 1, err, errlen)) == 0) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_settable(L, params);
      }
      lua_pop(L, 1);
      lua_pushvalue(L, params);
      if ((rc = call_manifest(g, v->pass, "q_in_regs", 1, err, errlen)) == 0) {
        lua_setfield(L, params, "q_in_regs");
        lua_pushstring(L, meta->entry);
        lua_setfield(L, params, "entry");
        lua_pushvalue(L, params);
        rc = render_with(g, tpl, src, err, errlen);
      }
    }
  }
  lua_settop(L, top);
  pthread_mutex_unlock(&g->mu);
  return rc;
}

int fg_generator_render_reference(fg_generator *g, fg_dtype dtype, int exact, char **src,
                                  fg_kernel_meta *meta, char *err, size_t errlen) {
  *src = NULL;
  pthread_mutex_lock(&g->mu);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  lua_pushstring(L, fg_dtype_name(dtype));
  lua_pushboolean(L, exact);
  int rc = call_manifest(g, FG_PASS_FWD, "reference", 2, err, errlen);
  if (rc == 0) {
    read_launch(L, meta);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, fg_dtype_name(dtype));
    lua_setfield(L, -2, "dtype");
    lua_pushboolean(L, exact);
    lua_setfield(L, -2, "exact");
    lua_pushstring(L, meta->entry);
    lua_setfield(L, -2, "entry");
    lua_getfield(L, -2, "name");
    lua_setfield(L, -2, "name");
    rc = render_with(g, "reference.cu", src, err, errlen);
  }
  lua_settop(L, top);
  pthread_mutex_unlock(&g->mu);
  return rc;
}

int fg_variant_fits(fg_generator *g, const fg_variant *v, const fg_device_limits *lim, char *why,
                    size_t whylen) {
  if (fg_variant_check(v, why, whylen)) return 0;
  pthread_mutex_lock(&g->mu);
  int rc = manifest_check(g, v, why, whylen);
  pthread_mutex_unlock(&g->mu);
  if (rc) return 0;
  fg_resources r;
  if (fg_generator_resources(g, v, &r, why, whylen)) return -1;
  if (r.smem_bytes > lim->smem_optin_per_block) {
    snprintf(why, whylen, "needs %d B of shared memory, %s allows %d B per block", r.smem_bytes,
             lim->name, lim->smem_optin_per_block);
    return 0;
  }
  if (r.smem_bytes > lim->smem_per_sm) {
    snprintf(why, whylen, "needs %d B of shared memory, %s has %d B per SM", r.smem_bytes,
             lim->name, lim->smem_per_sm);
    return 0;
  }
  if (r.threads > lim->max_threads_per_block) {
    snprintf(why, whylen, "needs %d threads per block, %s allows %d", r.threads, lim->name,
             lim->max_threads_per_block);
    return 0;
  }
  if (r.regs_estimate > 255) {
    snprintf(why, whylen,
             "needs about %d registers per thread, the limit is 255 (it would spill to local "
             "memory)",
             r.regs_estimate);
    return 0;
  }
  if ((long)r.regs_estimate * r.threads > lim->regs_per_sm) {
    snprintf(why, whylen, "needs about %ld registers per block, %s has %d per SM",
             (long)r.regs_estimate * r.threads, lim->name, lim->regs_per_sm);
    return 0;
  }
  snprintf(why, whylen, "fits: %d B of shared memory (of %d), %d threads, about %d registers",
           r.smem_bytes, lim->smem_optin_per_block, r.threads, r.regs_estimate);
  return 1;
}
