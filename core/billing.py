"""What each Datastore RPC is billed in production, read from the RPC itself: its request and its answer. Emulator
time does not carry over to production; the bill does: an emulator reads, skips, writes and counts the same entities.
The rules, their sources and the prices: docs/lessons/costs.md, "The billing rules".
"""
import math
from dataclasses import dataclass
from typing import Any

PRICES_SOURCE = "https://cloud.google.com/datastore/pricing"
PRICES_READ_ON = "2026-11-23"
PRICES_LOCATION = "us-central1"
USD_PER_100K = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}
INDEX_ENTRIES_PER_READ = 1000

_PROJECTION, _KEY_ONLY = 2, 3  # EntityResult.ResultType: what a query returned instead of whole entities


@dataclass
class Billed:
    """Billed operations: reads, writes and deletes are charged; small operations are free."""

    reads: int = 0
    writes: int = 0
    deletes: int = 0
    small: int = 0

    def __add__(self, other: "Billed") -> "Billed":
        return Billed(self.reads + other.reads, self.writes + other.writes, self.deletes + other.deletes,
                      self.small + other.small)

    def usd_per_million(self) -> float:
        """What a million requests costing this are billed, in USD (us-central1 prices)."""
        return (self.reads * USD_PER_100K["reads"] + self.writes * USD_PER_100K["writes"]
                + self.deletes * USD_PER_100K["deletes"]) * 10  # a million is ten times 100,000

    def priced(self, requests: str = "") -> str:
        """'11 reads: $3.30 per million', or 'nothing in Datastore'."""
        if not (self.reads or self.writes or self.deletes):
            return "nothing in Datastore"
        return f"{self.describe()}: ${self.usd_per_million():.2f} per million{requests}"

    def describe(self) -> str:
        """'3 reads, 1 write' or 'nothing'."""
        parts = [f"{n} {what}{'' if n == 1 else 's'}" for what, n in
                 (("read", self.reads), ("write", self.writes), ("delete", self.deletes)) if n]
        return ", ".join(parts) or "nothing"


def _pb(message: Any) -> Any:
    """The raw protobuf of a proto-plus message (what the Datastore client's transport hands the interceptor)."""
    to_pb = getattr(type(message), "pb", None)
    return to_pb(message) if to_pb is not None else message


def of(method: str, request: Any, response: Any) -> tuple["Billed", dict[str, int]]:
    """(Billed, {what: n}) for one answered Datastore RPC: the operations it is billed and what they were counted
    from (found, missing, entities, keys-only results, skipped, index entries, written, deleted)."""
    request, response = _pb(request), _pb(response)
    if method == "Lookup":
        found, missing = len(response.found), len(response.missing)
        return Billed(reads=found + missing), {"found": found, "missing": missing}
    if method == "RunQuery":
        # No minimum read: Datastore mode's page says "Queries that have up to one range property are not charged for
        # index entries read and have a minimum charge of zero read operations" (PRICES_SOURCE, "Index entries"; none
        # of this app's queries has more than one), where Firestore in Native mode bills at least one read a query.
        # A query that finds nothing is billed nothing, unless keys-only: its "single entity read for the query".
        batch = response.batch
        results, skipped = len(batch.entity_results), batch.skipped_results
        if batch.entity_result_type in (_PROJECTION, _KEY_ONLY) and not request.query.distinct_on:
            return Billed(reads=1 + skipped, small=results), {"keys-only results": results, "skipped": skipped}
        return Billed(reads=results + skipped), {"entities": results, "skipped": skipped}
    if method == "RunAggregationQuery":
        entries = _counted(request, response)
        return Billed(reads=max(1, math.ceil(entries / INDEX_ENTRIES_PER_READ))), {"index entries": entries}
    if method == "Commit":
        deleted = sum(1 for m in request.mutations if m.WhichOneof("operation") == "delete")
        written = len(request.mutations) - deleted
        return Billed(writes=written, deletes=deleted), {"written": written, "deleted": deleted}
    if method in ("AllocateIds", "ReserveIds"):
        return Billed(small=len(request.keys)), {}
    return Billed(), {}  # BeginTransaction, Rollback


def _counted(request: Any, response: Any) -> int:
    """The index entries an aggregation read: what its COUNT counted (every aggregation of one query reads the same
    entries). 0 when it has no COUNT: then only the minimum read is known."""
    aliases = [a.alias for a in request.aggregation_query.aggregations if a.WhichOneof("operator") == "count"]
    rows = response.batch.aggregation_results
    if not aliases or not rows:
        return 0
    return rows[0].aggregate_properties[aliases[0]].integer_value
