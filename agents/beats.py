"""A beat on the agents' server: one Redis round trip (BEAT_SCRIPT) checks the signed request
is fresh, finds the agent's cached identity, refreshes its worker's liveness key
(workers_app/liveness.py) and stores the activity report the beat may carry (workers_app/idle.py
reads it). The database is asked only when the identity is not cached (agents/service.py).
"""

from __future__ import annotations

import enum
import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

import redis
from redis.commands.core import Script

from agents.activity import ActivityReport
from agents.errors import AgentRefused, TimeRefused
from core.redis_connection import redis_client
from workers_app.idle import ACTIVITY_PREFIX, ACTIVITY_TTL
from workers_app.liveness import AGENT_PREFIX, PREFIX, liveness_ttl_ms

# The coarse "seen" marker (SEEN_PREFIX<worker pk>): a beat that sets it is its worker's first
# in the "last seen" window, and the database's "last seen" is written.
SEEN_PREFIX = "activate:seen:"

# A signed request is fresh when its time is within WINDOW (microseconds) of Redis's own clock
# (else {-3, that clock}: every host of the platform judges by the one clock, so a step of a
# host's clock refuses nobody), no later one of the same key was accepted and it is not one
# accepted already: a request replayed, or held back on the way and delivered after a later one,
# is refused (-2). ORDER_KEY keeps the newest accepted time (microseconds) and that request's
# nonce. An agent's times go strictly up, so a beat costs one SET; only requests of the same
# time (clients with a coarser clock) keep their nonces in keys of their own.
FRESH = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if math.abs(tonumber(SEQ) - now) > tonumber(WINDOW) then return {-3, now} end
local latest = redis.call('GET', ORDER_KEY)
local last, last_nonce = 0, ''
if latest then
  local sep = string.find(latest, ':', 1, true)
  if sep then
    last, last_nonce = tonumber(string.sub(latest, 1, sep - 1)), string.sub(latest, sep + 1)
  else
    last = tonumber(latest)
  end
end
local seq = tonumber(SEQ)
if seq < last then return -2 end
if seq == last then
  if NONCE == last_nonce then return -2 end
  if not redis.call('SET', NONCE_KEY, 1, 'NX', 'EX', TTL) then return -2 end
else
  redis.call('SET', ORDER_KEY, SEQ .. ':' .. NONCE, 'EX', TTL)
end
"""


def _fresh(nonce_key: str, order_key: str, ttl: str, seq: str, nonce: str, window: str) -> str:
    """FRESH reading its keys and arguments where a script is given them."""
    text = FRESH
    names = {
        "NONCE_KEY": nonce_key, "ORDER_KEY": order_key, "TTL": ttl, "SEQ": seq, "NONCE": nonce,
        "WINDOW": window,
    }  # fmt: skip
    for name, value in names.items():
        text = text.replace(name, value)
    return text


FRESH_SCRIPT = _fresh("KEYS[1]", "KEYS[2]", "ARGV[1]", "ARGV[2]", "ARGV[3]", "ARGV[4]") + "return 1"

# A beat in one round trip: check the signed request is fresh (FRESH, when its keys are given),
# find the cached identity, check the key's hash, refresh the liveness key and the coarse "seen"
# marker, and store the activity report a beat may carry (ARGV[10] its summary, ARGV[12] "1" when
# busy, then "+session"/"-session"): a busy span moves "last busy" to now; a quiet one only sets
# it when missing (a Redis that lost it starts the clock again instead of judging from the
# connect time). Lua's string compare is not constant-time; that leaks at most a prefix of a
# hash, which does not help anyone find a key that hashes to it.
BEAT_SCRIPT = (
    "if #KEYS > 1 then\n"
    + _fresh("KEYS[2]", "KEYS[3]", "ARGV[6]", "ARGV[7]", "ARGV[8]", "ARGV[9]")
    + """end
local cached = redis.call('GET', KEYS[1])
if not cached then return 0 end
local sep = string.find(cached, ':', 1, true)
if string.sub(cached, sep + 1) ~= ARGV[1] then return -1 end
local worker = string.sub(cached, 1, sep - 1)
redis.call('SET', ARGV[2] .. worker, 1, 'PX', ARGV[3])
if ARGV[10] ~= '' then
  local base, now, ttl = ARGV[11] .. worker, ARGV[13], ARGV[14]
  redis.call('SET', base .. ':r', now .. ';' .. ARGV[10], 'EX', ttl)
  if ARGV[12] == '1' then
    redis.call('SET', base, now, 'EX', ttl)
  else
    redis.call('SET', base, now, 'NX', 'EX', ttl)
  end
  for i = 15, #ARGV do
    local key = base .. ':s:' .. string.sub(ARGV[i], 2)
    if string.sub(ARGV[i], 1, 1) == '+' then
      redis.call('SET', key, now, 'EX', ttl)
    else
      redis.call('SET', key, now, 'NX', 'EX', ttl)
    end
  end
end
if redis.call('SET', ARGV[4] .. worker, 1, 'NX', 'EX', ARGV[5]) then
  return {worker, 1}
end
return {worker, 0}
"""
)


@functools.cache
def _beat_script(client: redis.Redis) -> Script:
    return client.register_script(BEAT_SCRIPT)


@functools.cache
def _fresh_script(client: redis.Redis) -> Script:
    return client.register_script(FRESH_SCRIPT)


@dataclass(frozen=True)
class OutsideWindow:
    """A signed request whose time is outside the window of Redis's clock: nothing done."""

    server_time: float  # Redis's clock, seconds


class Beat(enum.Enum):
    UNKNOWN = "unknown"  # no cached identity: the caller asks the database
    FORBIDDEN = "forbidden"
    REPLAYED = "replayed"  # not fresh (seen before, or older than one accepted): nothing done


@dataclass(frozen=True)
class Beaten:
    worker_id: int
    first_in_window: bool  # the first beat of this worker in the last LAST_SEEN window


@dataclass(frozen=True)
class AgentIdentity:
    """What a heartbeat needs to know about a worker, cached so a beat never reads the DB."""

    worker_id: int
    key_hash: str


class Nonce(NamedTuple):
    """What makes a signed request fresh, as Redis remembers it: its nonce's key, the key
    holding the newest request time of its signing key, its own time (microseconds), how many
    seconds both are kept, the nonce itself, and how far (microseconds) its time may be from
    Redis's."""

    key: str
    order_key: str
    seq: int
    ttl: int
    value: str
    window: int


@dataclass(frozen=True)
class BeatCall:
    keys: list[str]
    args: list[str | int]


def beat_outcome(answer: object) -> Beaten | Beat | OutsideWindow:
    """What BEAT_SCRIPT's answer means."""
    if answer == 0:
        return Beat.UNKNOWN
    if answer == -2:
        return Beat.REPLAYED
    if not isinstance(answer, list) or len(answer) != 2:
        return Beat.FORBIDDEN
    worker_id, first = answer
    if worker_id == -3:
        return OutsideWindow(int(first) / 1e6)
    return Beaten(int(worker_id), first == 1)


def accepted(beat: Beaten | Beat | OutsideWindow) -> Beaten | None:
    """What a beat's answer means for the agent: None when its identity is not cached (the
    service asks the database: ``agents.service.beat_uncached``), AgentRefused when refused."""
    if isinstance(beat, OutsideWindow):
        raise TimeRefused(beat.server_time)
    if beat is Beat.REPLAYED:
        raise AgentRefused(401, "replayed request")
    if beat is Beat.UNKNOWN:
        return None
    if not isinstance(beat, Beaten):
        raise AgentRefused(403, "forbidden")
    return beat


class AgentBeats:
    """The agents' side of the heartbeat store: cached identities, fresh requests, beats."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.redis = client or redis_client()
        self.ttl_ms = liveness_ttl_ms()

    def remember_agent(self, public_id: str, identity: AgentIdentity) -> None:
        self.redis.set(
            f"{AGENT_PREFIX}{public_id}",
            f"{identity.worker_id}:{identity.key_hash}",
            px=self.ttl_ms * 10,
        )

    def beat_agent(self, call: BeatCall) -> Beaten | Beat | OutsideWindow:
        """The beat ``call`` (from ``beat_arguments``) asks for, with this synchronous client."""
        return beat_outcome(_beat_script(self.redis)(keys=call.keys, args=call.args))

    def beat_arguments(
        self,
        public_id: str,
        key_hash: str,
        *,
        seen_window: int,
        nonce: Nonce | None = None,
        activity: ActivityReport | None = None,
    ) -> BeatCall:
        """What BEAT_SCRIPT is called with to beat for a cached agent identity whose key hashes
        to ``key_hash``: with ``nonce``, only if that nonce is new (it is then remembered); with
        ``activity``, that is stored too. The agents' server calls it with redis.asyncio."""
        keys = [f"{AGENT_PREFIX}{public_id}"]
        args: list[str | int] = [key_hash, PREFIX, self.ttl_ms, SEEN_PREFIX, seen_window]
        if nonce is not None:
            keys += [nonce.key, nonce.order_key]
            args += [nonce.ttl, nonce.seq, nonce.value, nonce.window]
        else:
            args += ["", "", "", ""]
        if activity is None:
            args.append("")
        else:
            busy = "1" if activity.busy else "0"
            args += [activity.summary, ACTIVITY_PREFIX, busy, repr(time.time()), ACTIVITY_TTL]
            args += activity.session_marks()
        return BeatCall(keys=keys, args=args)

    def fresh(self, nonce: Nonce) -> bool:
        """Whether a signed request is fresh (FRESH), remembering it if so; TimeRefused if its
        time is outside the window of Redis's clock."""
        answer = _fresh_script(self.redis)(
            keys=[nonce.key, nonce.order_key],
            args=[nonce.ttl, nonce.seq, nonce.value, nonce.window],
        )
        if isinstance(answer, list):
            raise TimeRefused(int(answer[1]) / 1e6)
        return bool(answer == 1)

    def server_time(self) -> float:
        """Redis's clock (seconds): the one clock the platform judges agents' times by."""
        seconds, micros = self.redis.time()
        return float(seconds) + micros / 1e6
