-- wrk script of the heartbeat benchmark: each request is the next agent's beat (its own
-- worker id and secret, read from the file named by the first script argument), built once.
local requests = {}
local count = 0
local next_index = 0

function init(args)
  for line in io.lines(args[1]) do
    local id, secret = line:match("^(%S+) (%S+)$")
    if id then
      count = count + 1
      requests[count] = wrk.format("POST", "/agent/v1/heartbeat", {
        ["Content-Type"] = "application/json",
        ["Authorization"] = "Bearer " .. secret,
      }, '{"worker": "' .. id .. '"}')
    end
  end
  next_index = math.random(count)
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
