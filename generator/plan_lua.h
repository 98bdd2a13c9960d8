/* plan_lua.h: reading a manifest's launch plan from the Lua stack (plan_lua.c), for render.c. */
#ifndef FG_PLAN_LUA_H
#define FG_PLAN_LUA_H

#include <stddef.h>

#include <lua.h>

#include "fg_gen.h"

/* Integer field k of the table at idx (0 when missing). */
int fg_lua_int_field(lua_State *L, int idx, const char *k);
/* Fills meta from the plan (a launch table: main, steps, workspaces, params, tmaps) at the top of
 * the stack, a plan of pass `pass` (whose TMA block it must be: fwd_tma forward, bwd_tma
 * backward); what names the manifest function for messages. 0, or -1 with the reason. */
int fg_lua_read_launch(lua_State *L, fg_pass pass, fg_kernel_meta *meta, const char *what,
                       char *err, size_t errlen);
/* Copies every field of the table at the top of the stack into the table at index `to` (an
 * absolute index); the table stays on the stack. */
void fg_lua_copy_fields(lua_State *L, int to);
/* Adds the plan's template constants (launch(v).constants) to the params table at index params;
 * the launch table is at the top of the stack. */
void fg_lua_add_constants(lua_State *L, int params);

#endif
