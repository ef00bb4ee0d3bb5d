"""How a job reads, changes and writes a task's page (PageWork): its keys cut into chunks, one transaction each, read
and written as the job's ndb models (NdbStore); and the scan, a range's keys in key order (`keys_in_range`). Beyond
the lesson (skip on a first read): `deltas` and `IncrementStore`, for a job that gives its change as increments."""
import dataclasses
from typing import Any

from google.cloud import ndb

from core import runtime
from core.transactions import transact
from mapper import increments
from mapper.jobs import JobDefinition, chunk_size


@dataclasses.dataclass
class PageWork:
    """A page's `chunks`, where each chunk's transaction reads and writes (`store`), the job's change and tally."""
    definition: JobDefinition
    params: dict
    prepared: Any  # what its prepare read once for the page, outside any transaction (apply's `prepared`)
    deltas: dict[str, int] | None  # an increments job's ({"balance": 10}), written instead of apply; else None
    chunks: list[list[ndb.Key]]
    store: "NdbStore | increments.IncrementStore"

    def change(self, entities: list) -> list:
        """What to write for a chunk's entities: the job's apply, or an increments job's mutations."""
        if self.deltas is None:
            return self.definition.apply(entities, self.params, self.prepared) if entities else []
        return [increments.incremented(entity, self.deltas) for entity in entities]

    def tally(self, entities: list) -> dict[str, int] | None:
        """What a chunk adds to the record's tally (the job's `tally`, if it has one)."""
        return self.definition.tally(entities, self.params) if self.definition.tally and entities else None


def page_work(definition: JobDefinition, params: dict, keys: list[ndb.Key]) -> PageWork:
    """A delivery's work on the page `keys`: its job's models through ndb, or an increments job's protobufs."""
    prepared = definition.prepare(keys, params) if definition.prepare else None
    size = chunk_size(definition)
    chunks = [keys[i:i + size] for i in range(0, len(keys), size)] or [[]]  # an empty page: one chunk, the record
    if definition.increments is None:
        return PageWork(definition, params, prepared, None, chunks, NdbStore())
    blind = runtime.current().datastore.increments is not None
    return PageWork(definition, params, prepared, definition.increments(params), chunks,
                    increments.IncrementStore(definition.kind, blind))


class NdbStore:
    """A chunk's entities as the job's ndb models: any job's."""
    get_multi = staticmethod(ndb.get_multi)
    put_multi = staticmethod(ndb.put_multi)
    transact = staticmethod(transact)


def scan_keys(page_size: int, fanout: int) -> int:
    """The keys of a range task's page and of the `fanout` pages it may hand out."""
    return page_size * (fanout + 1)


def scan_limit(page_size: int, fanout: int) -> int:
    """The most keys a range task's scan reads: `scan_keys`, and one key more to say if any remain."""
    return scan_keys(page_size, fanout) + 1


def keys_in_range(kind: str, after: ndb.Key | None, upto: ndb.Key, limit: int | None = None) -> list[ndb.Key]:
    """The kind's keys in (after, upto], in key order, through the Datastore API itself (core/datastore.Bulk): ndb's
    `Query(kind=kind).filter(KEY > after, KEY <= upto).order(KEY).fetch(limit, keys_only=True)`, with less CPU."""
    return runtime.current().datastore.bulk.keys(kind, after, upto, limit)
