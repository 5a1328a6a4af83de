-- wrk script: POST /v1/completions with a ~9 KB prompt.
-- Every request shares the same long prefix (8,915 characters) and ends with a short
-- suffix drawn at random per request (12 words from a 64-word list plus a counter), so the
-- prefix-cache index matches the shared blocks and hashes and inserts a new tail each time.

local words = {}
local alphabet = "abcdefghijklmnopqrstuvwxyz"
math.randomseed(12345)
for i = 1, 64 do
  local w = {}
  for j = 1, 3 + (i % 6) do
    local k = math.random(1, 26)
    w[#w + 1] = alphabet:sub(k, k)
  end
  words[i] = table.concat(w)
end

-- The shared prefix: a fixed pseudo-text, the same for every thread and request.
local sentence = "The quick brown fox jumps over the lazy dog while the router decides where to send it. "
local parts = {}
local len = 0
local n = 0
while len < 8850 do
  n = n + 1
  local piece = "[" .. n .. "] " .. sentence
  parts[#parts + 1] = piece
  len = len + #piece
end
local prefix = table.concat(parts)

local head = '{"model":"m","max_tokens":16,"prompt":"' .. prefix
local tail = '"}'
local headers = { ["Content-Type"] = "application/json" }
local counter = 0

function setup(thread)
  thread:set("thread_seed", math.random(1, 1000000))
end

function init(args)
  math.randomseed(thread_seed or os.time())
end

function request()
  counter = counter + 1
  local s = {}
  for i = 1, 12 do
    s[i] = words[math.random(1, 64)]
  end
  local body = head .. " Question " .. counter .. ": " .. table.concat(s, " ") .. "?" .. tail
  return wrk.format("POST", nil, headers, body)
end
