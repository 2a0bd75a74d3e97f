-- wrk script of the heartbeat benchmark: each request is a distinct signed beat (its agent's
-- worker id, an Authorization header with its own nonce, and its body, some with an activity
-- report), read from the file named by the
-- first script argument, signed beforehand by bench/heartbeats.py (wrk's Lua has no HMAC).
-- Thread n of the second argument's count takes lines n, n + count, ...: no two threads send
-- the same beat. A thread that used up its share would start over, and the server refuse the
-- replays; bench/heartbeats.py prepares more than a run can send and checks it.
-- A third argument "close" asks for the connection's end with each answer (wrk then opens a new
-- one for the next beat): one connection per beat, as an agent sends its beats when the server
-- closed its kept connection while idle. Without it, connections are kept as agents keep theirs.
local thread_count = 0
local requests = {}
local count = 0
local next_index = 0

function setup(thread)
  thread:set("thread_number", thread_count)
  thread_count = thread_count + 1
end

function init(args)
  local threads = tonumber(args[2])
  local headers = {["Content-Type"] = "application/json"}
  if args[3] == "close" then
    headers["Connection"] = "close"
  end
  local line_number = 0
  for line in io.lines(args[1]) do
    if line_number % threads == thread_number then
      local id, authorization, body = line:match("^(%S+)\t([^\t]+)\t(.+)$")
      if id then
        count = count + 1
        headers["Authorization"] = authorization
        requests[count] = wrk.format("POST", "/agent/v1/heartbeat", headers, body)
      end
    end
    line_number = line_number + 1
  end
end

function request()
  next_index = next_index % count + 1
  return requests[next_index]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "socket_errors": %d, "non_2xx": %d, '
      .. '"p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
