"""The one Idempotency-Key contract (docs/api.md#idempotency-key: a key is its caller's own, a replay answers the first
answer, the key with other content or another target is a 409, any key is safe to store), for every endpoint that
takes the header or a form's token.

A feature keeps its markers in a kind of its own (a `Marker` subclass) and writes one in the same transaction as the
effect it marks, in the effect's commit: both exist or neither does, which is what makes the effect happen once.
The marker is where the call's stamp lives (`core.exactly_once.once`): `written(marker, request)` is the feature's
`look` at it, and a replay is `once`'s ANOTHERS, answered with what the marker kept.
"""
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from google.cloud import ndb

from core import validate
from core.errors import Conflict, SignInRequired
from core.exactly_once import Written

# The header a replay carries (as Stripe's API does): the body and status are the first answer's; this says it is one.
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Keyed:
    """A request sent with an Idempotency-Key: its marker's key name and its fingerprint."""
    name: str
    fingerprint: str


def keyed(key: str | None, caller: str | None, endpoint: str, target: object, content: object) -> Keyed | None:
    """The request's marker name and fingerprint; None without a key. 400 for a malformed key, 401 for an anonymous
    caller (docs/api.md says why). `endpoint` names what the key starts ("counters.increment"), `target` what it acts
    on (a counter's name, a blog, an entry), and `content` what the request asks (JSON): the fingerprint covers both."""
    key = validate.idempotency_key(key)
    if key is None:
        return None
    if caller is None:
        raise SignInRequired("Sign in to send an Idempotency-Key: a key is its caller's own, and an anonymous "
                             "request has no caller to keep it for.", "sign_in_for_idempotency_key")
    return Keyed(marker_name(caller, endpoint, key), fingerprint(target, content))


def marker_name(caller: str, endpoint: str, key: str) -> str:
    """The marker's key name: SHA-256 of the length-prefixed (caller, endpoint, key), in hex. Length prefixes make the
    composition unambiguous (no caller and key can spell another pair's, whatever characters they hold); the digest
    keeps the name 64 hex digits, which can never be Datastore's reserved `__...__`, never passes its 1,500-byte limit,
    and spreads markers over the key space (a client's `order-42`, `order-43`... would otherwise be the sequential
    key names Datastore documents as a hotspot)."""
    composed = "".join(f"{len(part)}:{part}" for part in (caller, endpoint, key))
    return hashlib.sha256(composed.encode()).hexdigest()


def fingerprint(target: object, content: object) -> str:
    """What a request asks, as a digest of its target and content (canonical JSON): a key sent again is the same
    request only when this is equal."""
    text = json.dumps([target, content], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def derived_id(request: Keyed, digits: int) -> str:
    """An id of `digits` hex digits for what the request starts (a job, a seed), the same on every replay."""
    return request.name[:digits]


class Marker(ndb.Model):
    """A keyed request that has been applied. Each feature subclasses it for a kind of its own, in the entity group
    its transaction writes, and chooses its caching there."""
    fingerprint = ndb.TextProperty()  # `fingerprint(target, content)` of the request that wrote it
    call = ndb.TextProperty()  # the stamp: the id of the Call that wrote it (core.exactly_once.Call)
    answer = ndb.JsonProperty()  # what the first answer is rebuilt from (the feature's own)


def written(marker: Marker | None, request: Keyed | None) -> Written | None:
    """A feature's `look` at its marker, read in the transaction that would write the effect: None when there is
    none, else the marker's stamp and what it kept of the first answer; Conflict (409) when it was written for other
    content or another target."""
    if marker is None:
        return None
    if request is not None and marker.fingerprint != request.fingerprint:
        raise Conflict("This Idempotency-Key was used for another request (other content or another target); "
                       "use a new key for a new request.", "idempotency_key_reused")
    return Written(marker.call, dict(marker.answer or {}))


def marked(response: Any, replayed: bool) -> Any:
    """A web `response` (anything with `headers`), marked with REPLAYED_HEADER when it answers a replay: its status
    and body are the first answer's either way."""
    if replayed:
        response.headers[REPLAYED_HEADER] = "true"
    return response
