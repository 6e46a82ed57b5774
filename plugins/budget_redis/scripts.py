"""The Lua scripts of the Redis meter: each check-and-change runs atomically inside Redis."""

from __future__ import annotations

# KEYS[1] budget hash of one grant; ARGV: kind, amount, limit ('' = unlimited), key_ttl_ms
# ('0' = kept for ever). Returns {1, new_total} when charged, {0, used} when the charge would
# exceed the limit (and nothing changed). Redis runs a script alone: no other client's command
# interleaves, so two replicas can never both pass the check on the last unit.
CHARGE = """
local used = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local amount = tonumber(ARGV[2])
if ARGV[3] ~= '' and used + amount > tonumber(ARGV[3]) then
  return {0, used}
end
local total = redis.call('HINCRBY', KEYS[1], ARGV[1], amount)
-- the TTL is set once, when the grant's hash is created: it counts from the first charge
if ARGV[4] ~= '0' and redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return {1, total}
"""

# KEYS[1] sorted set of one grant's leases (score = expiry in ms on the Redis clock, so the
# replicas' clocks never matter); ARGV: lease member, limit, hold_ms.
# Returns {1, held} when the slot was taken, {0, held} when `limit` leases are live.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then
  return {0, held}
end
local hold = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + hold, ARGV[1])
-- the set dies with its longest lease: an idle grant leaves nothing behind
local ttl = redis.call('PTTL', KEYS[1])
if ttl < hold then
  redis.call('PEXPIRE', KEYS[1], hold + 1000)
end
return {1, held + 1}
"""
