"""Leases in Redis: one holder at a time per key, renewed by its holder and taken over once it
lapses (beat's lease, core/beat.py, and the relays', agents/relays/lease.py).

Fencing. A holder paused (SIGSTOP, a VM paused, a long GC) past its lease does not know it lost
it, and may act once more when it continues, beside its successor. So each taking of a lease
(not a renewal) draws the next number of a counter kept beside it (``<key>:fence``), and the
lease's value is ``<holder>#<number>``: the *fence* of that holding. Actions taken under the
lease carry the fence, and where they land a Redis script compares it with the lease's value
now (``FENCE_HOLDS``): a stale holder's action finds another fence there, or none, and is
refused and counted (``<key>:refused``). Equality, not "not lower than": the holder's name in
the fence keeps two holdings apart even if Redis lost the counter (a restart without its data),
and the number keeps apart two holdings by one holder.
"""

from __future__ import annotations

import os
import socket

import redis

# Renew our own holding, or take the lease if it lapsed and nobody else took it meanwhile: a
# new holding, with the counter's next number. Returns the number held (0: another holds it).
# KEYS: the lease, its counter. ARGV: holder, milliseconds, the number we hold (0: none).
RENEW_OR_TAKE = """
local current = redis.call('GET', KEYS[1])
if current and current == ARGV[1] .. '#' .. ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(ARGV[3])
end
if not current then
  local number = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. '#' .. number, 'PX', ARGV[2])
  return number
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Whether the fence an action carries is the lease's now; a refusal is counted.
# KEYS: the lease, its refusals counter. ARGV: the fence.
FENCE_HOLDS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
redis.call('INCR', KEYS[2])
return 0
"""


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def fence_of(holder: str, number: int) -> str:
    return f"{holder}#{number}"


def counter_key(lease_key: str) -> str:
    return f"{lease_key}:fence"


def refusals_key(lease_key: str) -> str:
    return f"{lease_key}:refused"


def renew_or_take(client: redis.Redis, key: str, holder: str, ms: int, number: int) -> int:
    """The number of our holding after renewing it (or taking the lease anew), 0 if another
    holds it. Raises RedisError."""
    return int(client.eval(RENEW_OR_TAKE, 2, key, counter_key(key), holder, ms, number))


def release(client: redis.Redis, key: str, fence: str) -> bool:
    """Give the lease up if this holding is still it (compare-and-delete)."""
    return bool(client.eval(RELEASE, 1, key, fence))


def fence_holds(client: redis.Redis, key: str, fence: str) -> bool:
    """Whether an action carrying ``fence`` comes from the lease's holding now (else it is
    counted as refused). Raises RedisError."""
    return bool(client.eval(FENCE_HOLDS, 2, key, refusals_key(key), fence))


def refused(client: redis.Redis, key: str) -> int:
    """How many stale actions under the lease were refused so far."""
    return int(client.get(refusals_key(key)) or 0)
