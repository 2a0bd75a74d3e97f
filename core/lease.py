"""Leases in Redis: one holder at a time per key, renewed by its holder and taken over once it
lapses (beat's lease, core/beat.py, and the relays', agents/relays/lease.py)."""

from __future__ import annotations

import os
import socket

# Renew our own lease, or take it again if it lapsed and nobody else took it meanwhile.
RENEW_OR_TAKE = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
