/* render.c: the generator's Lua side: a sandboxed Lua 5.4 state (base, string, table, math; no
 * io, os, package, no file loading, text chunks only) with limits on instructions, memory and
 * output per call, the template sources (embedded, or a snapshot of FLASHGEN_TEMPLATE_DIR) and
 * their hash, rendering variants through templates/engine.lua and reading the launch contracts
 * and resource formulas from templates/fwd.lua. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "fg_gen.h"
#include "fg_templates.h"
#include "plan_lua.h"

/* The sandbox's limits, per call into the generator (a render, a resource or fit query, or
 * loading engine.lua and fwd.lua). One fg_generator_render of the largest real variant from
 * scratch (a fresh generator: the manifest's functions, translating fwd_wgmma.cu and
 * common.cuh, running them) took 54 thousand Lua instructions (d=256 q_wgmma_ov; q_outer 49
 * thousand, kv_outer 43 thousand; about half of that once the templates are translated); the
 * budget is 100 times that, a few tens of milliseconds of Lua. */
#define FG_RENDER_MEASURED 54000LL
#define FG_LUA_TICK 1000 /* instructions between two calls of the count hook */
#define FG_LUA_MAX_INSTRUCTIONS (100 * FG_RENDER_MEASURED)
#define FG_LUA_MAX_MEMORY ((size_t)256 << 20)  /* bytes the Lua state may hold */
#define FG_RENDER_MAX_OUTPUT ((size_t)16 << 20) /* bytes of generated source */
/* What FLASHGEN_TEMPLATE_DIR may hold (all of it is read, hashed and kept). */
#define FG_TEMPLATE_FILE_MAX ((size_t)16 << 20)
#define FG_TEMPLATE_DIR_MAX ((size_t)64 << 20)
#define FG_TEMPLATE_DIR_FILES 1024

/* One template file: a name the renderer can be asked for, and its text. */
typedef struct tpl_file {
  char *name;
  char *text;
  size_t len;
} tpl_file;

struct fg_generator {
  lua_State *L;
  pthread_mutex_t mu;
  char template_dir[1024]; /* "" = embedded */
  uint64_t template_hash;
  int engine_ref, manifest_ref[FG_PASS_COUNT]; /* fwd.lua, bwd.lua */
  /* Every file the renderer can read, sorted by name; the hash covers exactly these. In a
   * directory they are read once, at creation, so what is hashed is what is rendered. */
  tpl_file *files;
  size_t nfiles;
  int owns_files;
  /* The sandbox's accounting for the current call. */
  size_t mem_used;     /* bytes the Lua state holds (its allocator counts) */
  long long ticks;     /* count-hook calls in this call */
  int limit_hit;       /* 0, or which limit was hit (then every instruction raises) */
  /* The template (or manifest) line that last began, for out-of-memory errors: its chunk's
   * source (compared, never read), short name and line. */
  const char *line_source;
  char line_file[LUA_IDSIZE];
  int line_no;
};

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* A name the renderer can load: a plain file name (no directory part, no ".."). */
static int plain_name(const char *name) {
  return name[0] && strcmp(name, ".") != 0 && !strchr(name, '/') && !strstr(name, "..");
}

static int cmp_files(const void *a, const void *b) {
  return strcmp(((const tpl_file *)a)->name, ((const tpl_file *)b)->name);
}

static void free_files(fg_generator *g) {
  if (g->owns_files)
    for (size_t i = 0; i < g->nfiles; i++) free(g->files[i].name), free(g->files[i].text);
  free(g->files);
  g->files = NULL;
  g->nfiles = 0;
}

/* Reads one regular file of the template directory into f (name set by the caller); 1 when it
 * is not a regular file (skipped), 0, or -1 with err. */
static int read_dir_file(const char *dir, const char *name, tpl_file *f, size_t *total, char *err,
                         size_t errlen) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "rb");
  struct stat st;
  if (!fp) {
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return 1; /* a directory we cannot open */
    snprintf(err, errlen, "cannot read template %s: %s (FLASHGEN_TEMPLATE_DIR=%s)", path,
             strerror(errno), dir);
    return -1;
  }
  if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(fp);
    return 1; /* directories, fifos, devices: nothing a template could include */
  }
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = malloc(cap + 1);
  for (;;) {
    if (!buf) break;
    if (n == cap) {
      char *nb = cap > FG_TEMPLATE_FILE_MAX ? NULL : realloc(buf, (cap *= 2) + 1);
      if (!nb) break;
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n, fp);
    if (r == 0) break;
    n += r;
  }
  int bad = ferror(fp);
  fclose(fp);
  if (!buf || bad || n > FG_TEMPLATE_FILE_MAX || *total + n > FG_TEMPLATE_DIR_MAX) {
    free(buf);
    if (bad) snprintf(err, errlen, "cannot read template %s: read error", path);
    else
      snprintf(err, errlen,
               "template %s is too large (a file may have %zu MiB, the directory %zu MiB): keep "
               "only templates in FLASHGEN_TEMPLATE_DIR=%s",
               path, FG_TEMPLATE_FILE_MAX >> 20, FG_TEMPLATE_DIR_MAX >> 20, dir);
    return -1;
  }
  buf[n] = 0;
  *total += n;
  f->text = buf;
  f->len = n;
  return 0;
}

/* Takes the snapshot of every file the renderer can read (the embedded table, or every regular
 * file of the template directory with a plain name), sorted by name, and hashes it: each file's
 * name, length and text. */
static int load_files(fg_generator *g, char *err, size_t errlen) {
  if (!g->template_dir[0]) {
    size_t n = 0;
    while (fg_embedded_templates[n].name) n++;
    g->files = calloc(n ? n : 1, sizeof *g->files);
    if (!g->files) goto oom;
    for (size_t i = 0; i < n; i++) {
      g->files[i].name = (char *)fg_embedded_templates[i].name;
      g->files[i].text = (char *)fg_embedded_templates[i].text;
      g->files[i].len = fg_embedded_templates[i].length;
    }
    g->nfiles = n;
    g->owns_files = 0;
  } else {
    DIR *d = opendir(g->template_dir);
    if (!d) {
      snprintf(err, errlen, "cannot list the template directory FLASHGEN_TEMPLATE_DIR=%s: %s",
               g->template_dir, strerror(errno));
      return -1;
    }
    g->owns_files = 1;
    size_t cap = 0, total = 0;
    for (struct dirent *e; (e = readdir(d));) {
      if (!plain_name(e->d_name)) continue;
      if (g->nfiles == FG_TEMPLATE_DIR_FILES) {
        snprintf(err, errlen,
                 "FLASHGEN_TEMPLATE_DIR=%s holds more than %d files: point it at a directory of "
                 "templates",
                 g->template_dir, FG_TEMPLATE_DIR_FILES);
        closedir(d);
        return -1;
      }
      if (g->nfiles == cap) {
        tpl_file *nf = realloc(g->files, (cap = cap ? 2 * cap : 16) * sizeof *nf);
        if (!nf) {
          closedir(d);
          goto oom;
        }
        g->files = nf;
      }
      tpl_file *f = &g->files[g->nfiles];
      int rc = read_dir_file(g->template_dir, e->d_name, f, &total, err, errlen);
      if (rc < 0) {
        closedir(d);
        return -1;
      }
      if (rc > 0) continue;
      if (!(f->name = strdup(e->d_name))) {
        free(f->text);
        closedir(d);
        goto oom;
      }
      g->nfiles++;
    }
    closedir(d);
  }
  qsort(g->files, g->nfiles, sizeof *g->files, cmp_files);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < g->nfiles; i++) {
    unsigned char len[8];
    for (int b = 0; b < 8; b++) len[b] = (unsigned char)((uint64_t)g->files[i].len >> (8 * b));
    h = fnv1a(h, g->files[i].name, strlen(g->files[i].name) + 1);
    h = fnv1a(h, len, sizeof len);
    h = fnv1a(h, g->files[i].text, g->files[i].len);
  }
  g->template_hash = h;
  return 0;
oom:
  snprintf(err, errlen, "out of memory reading the templates");
  return -1;
}

/* The template named name, or NULL with err. */
static const tpl_file *find_template(const fg_generator *g, const char *name, char *err,
                                     size_t errlen) {
  if (!plain_name(name)) {
    snprintf(err, errlen, "template name '%s' must be a plain file name", name);
    return NULL;
  }
  tpl_file key = {.name = (char *)name};
  const tpl_file *f = bsearch(&key, g->files, g->nfiles, sizeof key, cmp_files);
  if (f) return f;
  if (g->template_dir[0])
    snprintf(err, errlen,
             "no template named '%s' in FLASHGEN_TEMPLATE_DIR=%s (as it was when the generator "
             "was created)",
             name, g->template_dir);
  else snprintf(err, errlen, "no template named '%s' is embedded in this build", name);
  return NULL;
}

/* ---- The sandbox's limits ---- */
static fg_generator *gen_of(lua_State *L) { return *(fg_generator **)lua_getextraspace(L); }

/* The allocator: counts what the state holds and refuses to go past FG_LUA_MAX_MEMORY (Lua
 * then raises a memory error, which pcall below turns into a message with template:line). */
static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fg_generator *g = ud;
  size_t old = ptr ? osize : 0; /* without ptr, osize is the object's type */
  if (nsize == 0) {
    free(ptr);
    g->mem_used -= old;
    return NULL;
  }
  if (nsize > old && g->mem_used - old + nsize > FG_LUA_MAX_MEMORY) return NULL;
  void *p = realloc(ptr, nsize);
  if (p) g->mem_used = g->mem_used - old + nsize;
  return p;
}

/* "file:line" of the innermost frame running template (or manifest) code: engine.lua's own
 * frames (the output functions) are skipped in favour of the template that called them; out
 * unchanged when there is no Lua frame. */
static void note_where(lua_State *L, char *out, size_t n) {
  lua_Debug d;
  for (int level = 0; lua_getstack(L, level, &d); level++) {
    if (!lua_getinfo(L, "Sl", &d) || d.currentline <= 0) continue;
    if (strcmp(d.short_src, "engine.lua") == 0 && lua_getstack(L, level + 1, &(lua_Debug){0}))
      continue;
    snprintf(out, n, "%s:%d", d.short_src, d.currentline);
    return;
  }
}

enum { LIMIT_NONE, LIMIT_INSTRUCTIONS, LIMIT_MEMORY };

static const char *limit_message(int which, char *buf, size_t n) {
  if (which == LIMIT_INSTRUCTIONS)
    snprintf(buf, n,
             "the template ran more than %lld million Lua instructions in one call, the sandbox's "
             "limit (about 100 times what the largest real variant needs): a loop that never "
             "ends?",
             (long long)FG_LUA_MAX_INSTRUCTIONS / 1000000);
  else
    snprintf(buf, n,
             "the template's Lua memory reached the sandbox's limit of %zu MiB: a table or "
             "string that grows without end?",
             FG_LUA_MAX_MEMORY >> 20);
  return buf;
}

/* The sandbox's hook. On each new line of template (or manifest) code it notes where it is,
 * for out-of-memory errors (Lua raises those without running a message handler, so this is
 * their only way to name the line). Every FG_LUA_TICK instructions it raises "template:line:
 * ..." once the call's instruction budget is spent, or the memory nearly is; from then on it
 * runs after every instruction, so a pcall in the template cannot swallow the error and go on. */
static void sandbox_hook(lua_State *L, lua_Debug *ar) {
  fg_generator *g = gen_of(L);
  if (ar->event == LUA_HOOKLINE) {
    if (!lua_getinfo(L, "S", ar)) return;
    if (ar->source != g->line_source) {
      if (strcmp(ar->short_src, "engine.lua") == 0) return;
      g->line_source = ar->source;
      memcpy(g->line_file, ar->short_src, sizeof g->line_file);
    }
    g->line_no = ar->currentline;
    return;
  }
  if (!g->limit_hit) {
    if (++g->ticks > FG_LUA_MAX_INSTRUCTIONS / FG_LUA_TICK) g->limit_hit = LIMIT_INSTRUCTIONS;
    else if (g->mem_used > FG_LUA_MAX_MEMORY / 8 * 7) {
      lua_gc(L, LUA_GCCOLLECT); /* garbage is not a reason to stop */
      if (g->mem_used > FG_LUA_MAX_MEMORY / 8 * 7) g->limit_hit = LIMIT_MEMORY;
    }
    if (!g->limit_hit) return;
    lua_sethook(L, sandbox_hook, LUA_MASKCOUNT, 1);
  }
  char where[LUA_IDSIZE + 16] = "template", msg[400];
  note_where(L, where, sizeof where);
  lua_pushfstring(L, "%s: %s", where, limit_message(g->limit_hit, msg, sizeof msg));
  lua_error(L);
}

/* Starts a call into the Lua state (lock held): a fresh instruction budget and location. */
static void begin_call(fg_generator *g) {
  g->ticks = 0;
  g->limit_hit = LIMIT_NONE;
  g->line_source = NULL;
  g->line_file[0] = 0;
  if (g->mem_used > FG_LUA_MAX_MEMORY / 4) lua_gc(g->L, LUA_GCCOLLECT); /* a failed call's garbage */
  lua_sethook(g->L, sandbox_hook, LUA_MASKCOUNT | LUA_MASKLINE, FG_LUA_TICK);
}

/* load(chunk [, chunkname [, mode [, env]]]) for the sandbox: always mode "t", so binary chunks
 * (string.dump output, which can break the VM's invariants) are refused whatever is asked. */
static int l_load_text(lua_State *L) {
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, 1);
  if (n >= 2) lua_pushvalue(L, 2);
  else lua_pushnil(L);
  lua_pushliteral(L, "t");
  if (n >= 4) lua_pushvalue(L, 4);
  lua_call(L, n >= 4 ? 4 : 3, LUA_MULTRET);
  return lua_gettop(L) - n;
}

/* Lua: read_template(name) -> text | nil, message */
static int l_read_template(lua_State *L) {
  const fg_generator *g = lua_touserdata(L, lua_upvalueindex(1));
  const char *name = luaL_checkstring(L, 1);
  char err[1400];
  const tpl_file *f = find_template(g, name, err, sizeof err);
  if (!f) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushlstring(L, f->text, f->len);
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
  if (rc == LUA_ERRMEM) { /* no message handler runs: name the place the hook saw last */
    fg_generator *g = gen_of(L);
    char msg[400];
    if (g->line_file[0])
      snprintf(err, errlen, "%s:%d: %s", g->line_file, g->line_no,
               limit_message(LIMIT_MEMORY, msg, sizeof msg));
    else snprintf(err, errlen, "template: %s", limit_message(LIMIT_MEMORY, msg, sizeof msg));
    lua_pop(L, 1);
    return -1;
  }
  if (rc != LUA_OK) {
    const char *m = lua_tostring(L, -1);
    if (!m) m = "(error object is not a string)";
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

/* Loads templates/NAME.lua as a chunk (text only) and runs it with the template reader and
 * the limits table as arguments (or none) -> ref. */
static int load_lua_file(fg_generator *g, const char *name, int pass_reader, int *ref, char *err,
                         size_t errlen) {
  const tpl_file *f = find_template(g, name, err, errlen);
  if (!f) return -1;
  char chunkname[128];
  snprintf(chunkname, sizeof chunkname, "=%s", name);
  begin_call(g);
  int rc = luaL_loadbufferx(g->L, f->text, f->len, chunkname, "t");
  if (rc != LUA_OK) {
    snprintf(err, errlen, "%s", lua_tostring(g->L, -1));
    lua_pop(g->L, 1);
    return -1;
  }
  if (pass_reader) {
    lua_pushlightuserdata(g->L, g);
    lua_pushcclosure(g->L, l_read_template, 1);
    lua_createtable(g->L, 0, 1);
    lua_pushinteger(g->L, (lua_Integer)FG_RENDER_MAX_OUTPUT);
    lua_setfield(g->L, -2, "output");
  }
  if (pcall(g->L, pass_reader ? 2 : 0, 1, err, errlen)) return -1;
  if (!lua_istable(g->L, -1)) {
    snprintf(err, errlen, "%s must return a table", name);
    lua_pop(g->L, 1);
    return -1;
  }
  *ref = luaL_ref(g->L, LUA_REGISTRYINDEX);
  return 0;
}

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
  if (load_files(g, err, errlen)) goto fail;

  g->L = lua_newstate(l_alloc, g);
  if (!g->L) {
    snprintf(err, errlen, "cannot create a Lua state (out of memory)");
    goto fail;
  }
  *(fg_generator **)lua_getextraspace(g->L) = g;
  begin_call(g);
  /* The sandbox: base, string, table and math only; no file loading from Lua; load() takes
   * text only. */
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
  lua_getglobal(g->L, "load");
  lua_pushcclosure(g->L, l_load_text, 1);
  lua_setglobal(g->L, "load");
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
  free_files(g);
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
  begin_call(g);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  push_variant(L, v);
  int rc = call_manifest(g, v->pass, "resources", 1, err, errlen);
  if (rc == 0) {
    out->threads = fg_lua_int_field(L, -1, "threads");
    out->smem_bytes = fg_lua_int_field(L, -1, "smem");
    out->regs_estimate = fg_lua_int_field(L, -1, "regs");
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
  if (!s || len > FG_RENDER_MAX_OUTPUT) { /* engine.lua enforces this; a changed engine may not */
    snprintf(err, errlen, "%s: the rendered output %s (the sandbox's limit is %zu MiB)", tpl,
             s ? "is too large" : "is not a string", FG_RENDER_MAX_OUTPUT >> 20);
    lua_pop(L, 1);
    return -1;
  }
  *src = malloc(len + 1);
  if (!*src) {
    snprintf(err, errlen, "out of memory for the rendered source of %s", tpl);
    lua_pop(L, 1);
    return -1;
  }
  memcpy(*src, s, len + 1);
  lua_pop(L, 1);
  return 0;
}

int fg_generator_render(fg_generator *g, const fg_variant *v, char **src, fg_kernel_meta *meta,
                        char *err, size_t errlen) {
  *src = NULL;
  if (fg_variant_check(v, err, errlen)) return -1;
  pthread_mutex_lock(&g->mu);
  begin_call(g);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  int rc = manifest_check(g, v, err, errlen);
  if (rc == 0) {
    push_variant(L, v);
    rc = call_manifest(g, v->pass, "launch", 1, err, errlen);
  }
  if (rc == 0) rc = fg_lua_read_launch(L, v->pass, meta, "launch(v)", err, errlen);
  if (rc == 0) {
    int launch = lua_gettop(L);
    lua_getfield(L, -1, "template");
    char tpl[64];
    snprintf(tpl, sizeof tpl, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    /* Template parameters: the variant, plus the layout the manifest derives. */
    push_variant(L, v);
    int params = lua_gettop(L);
    lua_pushvalue(L, params);
    if ((rc = call_manifest(g, v->pass, "layout", 1, err, errlen)) == 0) {
      fg_lua_copy_fields(L, params);
      lua_pop(L, 1);
      lua_pushvalue(L, params);
      if ((rc = call_manifest(g, v->pass, "q_in_regs", 1, err, errlen)) == 0) {
        lua_setfield(L, params, "q_in_regs");
        lua_pushstring(L, fg_kernel_main(meta)->entry);
        lua_setfield(L, params, "entry");
        lua_pushvalue(L, launch);
        fg_lua_add_constants(L, params);
        lua_pop(L, 1);
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
  begin_call(g);
  lua_State *L = g->L;
  int top = lua_gettop(L);
  lua_pushstring(L, fg_dtype_name(dtype));
  lua_pushboolean(L, exact);
  int rc = call_manifest(g, FG_PASS_FWD, "reference", 2, err, errlen);
  if (rc == 0)
    rc = fg_lua_read_launch(L, FG_PASS_FWD, meta, "reference(dtype, exact)", err, errlen);
  if (rc == 0) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, fg_dtype_name(dtype));
    lua_setfield(L, -2, "dtype");
    lua_pushboolean(L, exact);
    lua_setfield(L, -2, "exact");
    lua_pushstring(L, fg_kernel_main(meta)->entry);
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
  begin_call(g);
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
