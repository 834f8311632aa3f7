"""How the Redis tiers lay a table out in Redis (docs/formats.md, Files and messages 7):
the names of a partition's vector hash, access-statistics hash and fill sentinel, and the
Lua scripts that update access counts and remove expired rows server-side."""

from __future__ import annotations

#: Adds 1 to the access count of every field in ARGV (one round trip for many fields).
_COUNT_SCRIPT = (
    "for i = 1, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[i], 1) end return #ARGV"
)

# Removes the rows of ARGV[2..] whose access time in the statistics hash (KEYS[2]) is before
# ARGV[1] from both hashes and returns them: checked and deleted at once, so a row touched
# since the sweep read its time stays.
_EXPIRE_SCRIPT = """
local gone = {}
for i = 2, #ARGV do
  local t = redis.call('HGET', KEYS[2], ARGV[i])
  if t and tonumber(t) < tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
"""


def value_hash(tag: str, partition: int) -> str:
    """The name of partition ``partition``'s vector hash of table ``tag``."""
    return f"hps_et{{{tag}/p{partition}}}v"


def stat_hash(tag: str, partition: int) -> str:
    """The name of partition ``partition``'s access-statistics hash of table ``tag``."""
    return f"hps_et{{{tag}/p{partition}}}t"


def sentinel_key(tag: str, partition: int) -> str:
    """The key that marks partition ``partition`` of table ``tag`` as filled (on its node)."""
    return f"hps_et{{{tag}/p{partition}}}s"


def _interleave(a: list, b: list) -> list:
    out = [None] * (2 * len(a))
    out[::2] = a
    out[1::2] = b
    return out
