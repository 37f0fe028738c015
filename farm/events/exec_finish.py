"""The end of a session call in Redis, in one script: its last events, its record, its session.

``finish`` runs one Lua script (one command, one round trip) that adds the run's closing events
to its journal (and its live stream), then sets the exec record to ``done`` (a call with one:
a branch op has none), then refreshes the session's entry, then (given its task's ``reply``)
stores and publishes the Celery result, or pushes it on the call's reply list (a run of the
lane: ``farm.events.lanes``). The script is atomic, so whoever reads the record, or the
result, finds the journal complete.
The journal stays best effort: its commands are ``pcall``ed, a failure among them is returned
(for the log), and the record, the session entry and the reply are written all the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import redis

    from farm.events.journal import Entries

# KEYS: the exec record (any key when there is none), the session entry, the reply's key (only
# with one), each event stream, then the journals' index.
# ARGV: record, its TTL (s; 0: no record), the session's TTL (ms), 2 x its fields, field,
# value...; then 1, the reply, its TTL (s, 0: none) and 1 to push it (a list) or 0 to set and
# publish it, or 0; then the number of streams and
# for each its bound, TTL (ms), entry count and entries; then (only with streams) the index's
# member, score and bound.
SCRIPT = """
local at = 0
local function nxt() at = at + 1; return ARGV[at] end
local record, record_ttl, session_ttl = nxt(), nxt(), nxt()
local fields = {}
for _ = 1, tonumber(nxt()) do fields[#fields + 1] = nxt() end
local replies = tonumber(nxt())
local reply, reply_ttl, reply_pushed
if replies > 0 then reply, reply_ttl, reply_pushed = nxt(), tonumber(nxt()), nxt() end
local streams = tonumber(nxt())
local failed = ''
local function try(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then failed = reply.err end
end
for s = 1, streams do
  local key, bound, ttl = KEYS[2 + replies + s], nxt(), nxt()
  for _ = 1, tonumber(nxt()) do try('XADD', key, 'MAXLEN', '~', bound, '*', 'e', nxt()) end
  try('PEXPIRE', key, ttl)
end
if streams > 0 then
  local index, member, score, bound = KEYS[3 + replies + streams], nxt(), nxt(), tonumber(nxt())
  try('ZADD', index, score, member)
  try('ZREMRANGEBYRANK', index, 0, -bound - 1)
end
if tonumber(record_ttl) > 0 then redis.call('SET', KEYS[1], record, 'EX', record_ttl) end
if #fields > 0 then
  redis.call('HSET', KEYS[2], unpack(fields))
  redis.call('PEXPIRE', KEYS[2], session_ttl)
end
if replies > 0 and reply_pushed == '1' then
  redis.call('RPUSH', KEYS[3], reply)
  if reply_ttl > 0 then redis.call('EXPIRE', KEYS[3], reply_ttl) end
elseif replies > 0 then
  if reply_ttl > 0 then
    redis.call('SET', KEYS[3], reply, 'EX', reply_ttl)
  else
    redis.call('SET', KEYS[3], reply)
  end
  redis.call('PUBLISH', KEYS[3], reply)
end
return failed
"""


class Reply(NamedTuple):
    """A call's result as its caller reads it: ``key``, ``body``, TTL; ``pushed`` on a list
    (a lane's reply), else set and published on the key as a channel (Celery's result)."""

    key: str
    body: str
    ttl_s: int
    pushed: bool = False


class Finisher:
    """``finish`` on one Redis client (the script is loaded once, then called by its digest)."""

    def __init__(self, client: redis.Redis) -> None:
        self.script = client.register_script(SCRIPT)

    def finish(
        self,
        record: tuple[str, str, int] | None,
        session: tuple[str, dict[str, Any], float] | None,
        events: Entries | None,
        reply: Reply | None = None,
    ) -> str:
        """Write ``events``, then ``record`` (key, JSON, TTL in s), then ``session`` (key,
        fields, TTL in s), then ``reply``; returns the journal's error, ``""`` when there was
        none."""
        if record is None:  # the first key is then only a place: the script writes none there
            record = (session[0] if session is not None else reply[0] if reply else "-", "", 0)
        key, body, ttl_s = record
        keys = [key, session[0] if session is not None else key]
        args: list[Any] = [body, ttl_s, int(session[2] * 1000) if session is not None else 0]
        fields = session[1] if session is not None else {}
        args.append(2 * len(fields))
        for name, value in fields.items():
            args += [name, str(value)]
        if reply is not None:
            keys.append(reply[0])
            args += [1, reply.body, reply.ttl_s, int(reply.pushed)]
        else:
            args.append(0)
        streams = events.streams if events is not None else ()
        args.append(len(streams))
        for stream, bound, ttl_ms, rows in streams:
            keys.append(stream)
            args += [bound, ttl_ms, len(rows), *rows]
        if events is not None and streams:
            keys.append(events.index)
            args += [events.session_id, events.at, events.index_max]
        return str(self.script(keys=keys, args=args) or "")
