"""The counters lesson in production today: where Firestore in Datastore mode differs from 2008's Datastore, each
with the Google page that says so, and what the app does about it (core.features.Caveat)."""
from core.features import Caveat

CAVEATS = (
    Caveat(
        fact="About one sustained write a second to an entity group is legacy Datastore's limit, and it still holds "
             "for a database upgraded into OPTIMISTIC_WITH_ENTITY_GROUPS mode; in the other modes Firestore in "
             "Datastore mode lifts it and names no rate for one entity, only contention when it is written too often. "
             "Neither emulator enforces any of it: the legacy one aborts colliding transactions, the Firestore one "
             "queues them on locks, and both let one entity take far more.",
        source="https://cloud.google.com/datastore/docs/upgrade-to-firestore",
        app="Shards spread the writes, as in 2008. On Firestore an increment is a blind server-side increment that "
            "the emulator never refuses, so an adaptive counter, which grows when its writers collide, stays at one "
            "shard there (that is the shard count the counters page shows on that backend). Whether production "
            "answers a document written past its sustained rate with a contention error (which the increment loop "
            "counts as a collision, and grows on) or only slows it down, no emulator shows. So on Firestore, give a "
            "busy counter fixed shards (a general counter: one shard per sustained write a second) rather than an "
            "adaptive one. A stated limit, not code."),
    Caveat(
        fact="Google recommends that new Python 3 apps use the Datastore mode client library (google-cloud-datastore) "
             "rather than Cloud NDB, which will not support Firestore's new features.",
        source="https://cloud.google.com/appengine/migration-center/standard/python/migrate-to-cloud-ndb",
        app="The app keeps ndb because it teaches the talk's API and its caching (ndb's global cache is what keeps "
            "the front page never stale). Where ndb has no answer it goes around it through the Datastore API "
            "itself (core/datastore.py): the server-side increments here, and COUNT and SUM aggregation queries."),
    Caveat(
        fact="A TTL policy deletes an entity some time after the date in its TTL property, typically within 24 hours; "
             "expired entities still answer lookups and queries until then. Neither emulator applies TTL policies.",
        source="https://cloud.google.com/datastore/docs/ttl",
        app="An increment's Idempotency-Key marker carries `expires` (midnight UTC, 24 to 48 hours ahead). Deploy "
            "with `gcloud firestore fields ttls update expires --collection-group=AppliedIncrement --enable-ttl`; "
            "the hourly sweep task (counters.markers.sweep_markers) deletes expired markers everywhere, and is what "
            "deletes them on the emulators. An expired marker that is still there still counts as applied."),
)
