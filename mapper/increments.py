"""Beyond the talk: a job that gives its change as whole-number increments (add_credit_increments) has its chunks
written as protobufs through the Datastore API itself (IncrementStore), a tenth of ndb's client CPU (bench/results/
mapper.md). On Firestore such a chunk is not read: each entity gets a server-side increment, an `update`, so one deleted
since the scan fails the commit (NOT_FOUND) rather than being made again; the legacy emulator drops transforms, so
there each is read and written back."""
import dataclasses
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as core_exceptions
from google.cloud import ndb
from google.cloud.ndb import model as ndb_model

from core import runtime
from core.datastore import EntityPb, MutationPb, entity_pb
from core.transactions import transact_api


@dataclasses.dataclass
class ChunkEntity:
    """An entity of an increments job's chunk: its key, and its protobuf as read (None: unread, the server adds)."""
    key: ndb.Key
    pb: Any = None


class IncrementStore:
    """A chunk's entities as ChunkEntity, written as mutations in the transaction's commit; `blind`: not read."""

    def __init__(self, kind: str, blind: bool) -> None:
        self.kind, self.blind = kind, blind
        self.transaction: Any = None
        self.reads_all = False  # whether this transaction reads the chunk's entities too (set by each attempt)

    def transact(self, fn: Callable[[], Any]) -> Any:
        def chunk_transaction(reads_all: bool) -> Any:
            def run(transaction: Any) -> Any:
                self.transaction, self.reads_all = transaction, reads_all
                return fn()
            return transact_api(run)
        try:
            return chunk_transaction(reads_all=not self.blind)
        except core_exceptions.NotFound:  # an update found an entity deleted since the page's query
            if not self.blind:
                raise
            return chunk_transaction(reads_all=True)  # the chunk again, read: the missing entities are skipped

    def get_multi(self, keys: list[ndb.Key]) -> list[Any]:
        """Each key's entity as the transaction reads it: of the job's kind a ChunkEntity (not read where blind:
        taken to exist), of another (the task's record) its ndb model; None where there is none."""
        read = [key for key in keys if self.reads_all or key.kind() != self.kind]
        found = dict(zip(read, self.transaction.lookup(read), strict=True))
        return [self._entity(key, found) for key in keys]

    def _entity(self, key: ndb.Key, found: dict[ndb.Key, Any]) -> Any:
        if key not in found:
            return ChunkEntity(key)
        pb = found[key]
        if pb is None:
            return None
        return ChunkEntity(key, pb) if key.kind() == self.kind else ndb_model._entity_from_protobuf(pb)

    def put_multi(self, entities: list[Any]) -> None:
        """Commit the transaction with each of `entities`, a mutation or an ndb model to upsert."""
        self.transaction.commit([e if isinstance(e, MutationPb) else MutationPb(upsert=entity_pb(e)) for e in entities])


def incremented(entity: ChunkEntity, deltas: dict[str, int]) -> Any:
    """The mutation adding `deltas` ({property: whole number}) to `entity`: a server-side increment of each where it
    was not read, else the entity as read with each added."""
    if entity.pb is None:
        mutation = MutationPb(update=EntityPb(key=runtime.current().datastore.bulk.key_pb(entity.key)))
        # An update (the entity must exist) with an empty mask (its other properties are kept): the Datastore v1
        # Mutation, https://cloud.google.com/datastore/docs/reference/data/rpc/google.datastore.v1#mutation
        mutation.property_mask.SetInParent()
        for name, delta in deltas.items():
            mutation.property_transforms.add(property=name).increment.integer_value = delta
        return mutation
    for name, delta in deltas.items():
        value = entity.pb.properties[name]  # a missing property counts from 0, as an ndb IntegerProperty's default
        if value.WhichOneof("value_type") not in (None, "integer_value"):
            raise TypeError(f"{entity.key}: {name} is not a whole number")
        value.integer_value += delta
    return MutationPb(upsert=entity.pb)
