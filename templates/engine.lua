-- engine.lua: the template engine (see templates/README.md for the syntax).
-- A template is literal CUDA. `{{ expr }}` inserts the value of a Lua expression; a line whose
-- first non-blank characters are `{%` and last are `%}` is a Lua statement. Each template line
-- becomes exactly one line of the Lua chunk, so Lua's "name:line:" messages point at the
-- template line. Runs inside the sandbox the C side built (base, string, table, math only).
local read_template = ...   -- C function: name -> text, or nil, message

local engine = {}
local compiled = {}

local function translate(text)
  local out = {}
  for line in (text .. "\n"):gmatch("(.-)\r?\n") do
    local stmt = line:match("^%s*{%%(.*)%%}%s*$")
    if stmt then
      out[#out + 1] = stmt
    else
      local parts, pos = {}, 1
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
  -- The chunk receives its environment table as _ENV.
  return "local _ENV = ...; " .. table.concat(out, "\n")
end

local function compile(name)
  local fn = compiled[name]
  if fn then return fn end
  local text, msg = read_template(name)
  if not text then error(msg, 0) end
  local chunk, err = load(translate(text), "=" .. name, "t")
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
-- Unknown names are errors (a typo must not render as "nil").
function engine.render(name, params)
  local buf = {}
  local env = {}
  env._o = function(s) buf[#buf + 1] = s end
  env._s = function(v)
    if v == nil then error("{{ }} expression is nil", 2) end
    if type(v) == "boolean" then return v and "true" or "false" end
    return tostring(v)
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
