-- engine.lua: the template engine (see templates/README.md for the syntax).
-- A template is literal CUDA. `{{ expr }}` inserts the value of a Lua expression; a line whose
-- first non-blank characters are `{%` and last are `%}` is a Lua statement. Each template line
-- becomes exactly one line of the Lua chunk, so Lua's "name:line:" messages point at the
-- template line. Runs inside the sandbox the C side built (base, string, table, math only,
-- with limits on instructions and memory per call).
-- The output carries `#line N "file"` directives wherever its lines stop following one template
-- file line by line (after a `{% %}` line, at an include, at a loop's next pass), so NVRTC's
-- diagnostics name the template file and line; the first line (the header comment) has none,
-- so the source still begins with it.
local read_template, limits = ...   -- C function: name -> text, or nil, message; { output = bytes }

local engine = {}
local compiled = {}

local function translate(text, name)
  local out = {}
  local n = 0
  for line in (text .. "\n"):gmatch("(.-)\r?\n") do
    n = n + 1
    local stmt = line:match("^%s*{%%(.*)%%}%s*$")
    if stmt then
      out[#out + 1] = stmt
    else
      local parts, pos = { "_l(_F, " .. n .. ")" }, 1
      while true do
        local s, e, expr = line:find("{{(.-)}}", pos)
        if not s then break end
        if s > pos then parts[#parts + 1] = "_o(" .. string.format("%q", line:sub(pos, s - 1)) .. ")" end
        parts[#parts + 1] = "_o(_s(" .. expr .. "))"
        pos = e + 1
      end
      if pos <= #line then parts[#parts + 1] = "_o(" .. string.format("%q", line:sub(pos)) .. ")" end
      parts[#parts + 1] = "_o('\\n')"
      out[#out + 1] = table.concat(parts, " ")
    end
  end
  -- The chunk receives its environment table as _ENV; _F is its file name for #line.
  return "local _ENV = ...; local _F = " .. string.format("%q", name) .. "; " ..
         table.concat(out, "\n")
end

local function compile(name)
  local fn = compiled[name]
  if fn then return fn end
  local text, msg = read_template(name)
  if not text then error(msg, 0) end
  local chunk, err = load(translate(text, name), "=" .. name, "t")
  if not chunk then error(err, 0) end
  compiled[name] = chunk
  return chunk
end

local safe = {
  string = string, table = table, math = math, pairs = pairs, ipairs = ipairs,
  tostring = tostring, tonumber = tonumber, type = type, select = select,
  error = error, assert = assert,
}

-- Renders template `name` with the parameters in `params`; returns the text.
-- Unknown names are errors (a typo must not render as "nil"). The output may not exceed
-- limits.output bytes: the error names the template line that went past it.
function engine.render(name, params)
  local buf, size, max = {}, 0, limits.output
  local function too_large()
    error(string.format("the rendered output exceeds %d MiB, the sandbox's limit: a loop that " ..
                        "never ends?", max // 1048576), 3)
  end
  -- Where the next output line comes from when no directive precedes it.
  local file, line, resync = nil, 0, false
  local env = {}
  env._o = function(s)
    size = size + #s
    if size > max then too_large() end
    buf[#buf + 1] = s
  end
  env._l = function(f, n)  -- a literal line of template f, line n, begins
    if f ~= file or n ~= line or resync then
      if size == 0 and f == name and n == 1 then
        file = nil  -- the header comment goes without; the next line gets a directive
      else
        local d = "#line " .. n .. ' "' .. f:gsub('[\\"]', "_") .. '"\n'
        size = size + #d
        if size > max then too_large() end
        buf[#buf + 1] = d
        file = f
      end
      resync = false
    end
    line = n + 1
  end
  env._s = function(v)
    if v == nil then error("{{ }} expression is nil", 2) end
    if type(v) == "boolean" then return v and "true" or "false" end
    local s = tostring(v)
    if s:find("\n", 1, true) then resync = true end  -- more lines than the template has
    return s
  end
  env.include = function(other) compile(other)(env) end
  setmetatable(env, { __index = function(_, k)
    local v = params[k]
    if v == nil then v = safe[k] end
    if v == nil then error("undefined template name '" .. tostring(k) .. "'", 2) end
    return v
  end })
  compile(name)(env)
  return table.concat(buf)
end

return engine
