"""Appstats' captures, kept where the original Appstats kept its records: in the cache every process shares, so
/appstats lists the last requests of every process. Each is numbered by one counter in the cache and written with one
`set` into slot `id % RING` of a ring of keys: no shared list to read, change and write back, and a bounded share of
the cache (docs/lessons/costs.md, "The captures, shared by every process")."""
import json
import time
from typing import Any

from core import costs
from core.cache import Cache
from core.errors import NotFound, Unavailable

RING = 1000  # slots: the last RING requests of all processes together are kept
LISTED = 100  # the listing's last requests
KEPT_SECONDS = 24 * 3600  # a capture expires after a day (a cache under pressure may evict it sooner)
NEXT = "appstats:next"  # the counter that numbers the requests
# The counter starts from the clock in microseconds (again after a flush or an eviction), and first did so on
# 2026-11-26 (commit 49432f6): no id at or below that microsecond was ever given.
FIRST_START = 1_795_651_200_000_000  # 2026-11-26T00:00:00Z


def _slot(request_id: int) -> str:
    return f"appstats:slot:{request_id % RING}"


class Away(Exception):
    """The cache did not answer (or there is none): no capture can be read."""


def keep(cache: Cache, capture: dict[str, Any], trips: list[costs.TimedTrip]) -> int | None:
    """Number `capture` and write it with its round trips into its slot; its id, or None when the cache is away.
    These cache calls are Appstats' own, not counted in the request's figures."""
    with costs.measuring(None):
        request_id = cache.next_number(NEXT, start=time.time_ns() // 1000)
        if not request_id:  # away (None); or False from a memcached node that failed a moment ago (HashClient)
            return None
        stored = {"request": {**capture, "id": request_id},
                  "calls": [[t.kind, t.name, round(t.start_ms, 3), round(t.end_ms, 3), round(t.wait_ms, 3)]
                            for t in trips]}
        cache.set(_slot(request_id), json.dumps(stored, separators=(",", ":")), KEPT_SECONDS)
    return request_id


def _read(cache: Cache, keys: list[str]) -> dict[str, bytes]:
    found = cache.read_many(keys)
    if found is None:  # an outage, or a timeout: not a capture that is gone
        raise Away()
    return found


def recent(cache: Cache) -> list[dict[str, Any]]:
    """The last LISTED requests of every process, newest first (those written over, expired or evicted are left out);
    Away when the cache does not answer."""
    latest = _read(cache, [NEXT]).get(NEXT)
    if latest is None:  # nothing captured since the cache started (or it was flushed)
        return []
    ids = range(int(latest), max(int(latest) - LISTED, 0), -1)
    found = _read(cache, [_slot(i) for i in ids])
    listed = []
    for i in ids:  # a slot holding another id was written over since the counter was read: not this one
        stored = found.get(_slot(i))
        if stored is not None and (capture := json.loads(stored)["request"])["id"] == i:
            listed.append(capture)
    return listed


AWAY = ("The cache is not answering (or none is set up): Appstats keeps its records there, shared by every process, "
        "so none can be read now. Requests are served and counted all the same (each answer's Server-Timing header, "
        "each page's footer, the log lines).")


def kept_request(cache: Cache, request_id: int) -> tuple[dict[str, Any], list[costs.TimedTrip]]:
    """Request `request_id`'s capture and its round trips (one cache call); 503 while the cache is away, and while it
    is not kept a 404 saying why."""
    try:
        found = _read(cache, [_slot(request_id), NEXT])
    except Away:
        raise Unavailable(AWAY, "cache_away") from None
    stored = found.get(_slot(request_id))
    if stored is not None:
        capture = json.loads(stored)
        if capture["request"]["id"] == request_id:
            return capture["request"], [costs.TimedTrip(*trip) for trip in capture["calls"]]
    # Given ids lie between the first start and the counter. Without the counter (flushed or evicted, with the
    # captures) the clock bounds them instead: the ids run behind it unless a million requests a second were numbered.
    latest = found.get(NEXT)
    newest = int(latest) if latest is not None else time.time_ns() // 1000
    if FIRST_START < request_id <= newest:
        raise NotFound(f"Request {request_id} is no longer kept: Appstats keeps the last {RING:,} requests of all "
                       f"processes together in the cache (it lists the newest {LISTED}), each for "
                       f"{KEPT_SECONDS // 3600} hours at most, and this one has expired, was evicted by the cache, or "
                       "was written over by a newer request.", "request_expired")
    raise NotFound(f"No request has been given the id {request_id}.", "no_such_request")
