"""The counters lesson in production today (core.features.Caveat)."""
from core.features import Caveat

CAVEATS = (
    Caveat(
        fact="One entity takes only so many writes a second: about one commit a second to an entity group on legacy "
             "Datastore, and on Firestore \u201cyou can't update a single document at an unlimited rate\u201d: a "
             "document written too often answers with contention, and ten shards take ten times the writes. Neither "
             "emulator enforces it: the legacy one aborts colliding transactions, the Firestore one queues them on "
             "locks, and both let one entity take far more.",
        source="https://cloud.google.com/firestore/docs/solutions/counters",
        app="Shards spread the writes, as in 2008. On Firestore an increment is a blind server-side increment. Under "
            "LATENCY=production the stand-in (devstack/standin.py) holds each entity to one write a second after a "
            "burst of 3 and answers ABORTED past a 2 s wait, as production answers contention; the increment loop "
            "counts that as a collision, and an adaptive counter grows on it on both backends. On the bare Firestore "
            "emulator nothing refuses a blind increment, so there an adaptive counter stays at one shard."),
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
        app="Every idempotency marker that is only a marker (AppliedIncrement, PostMarker, CommentMarker, SeedMarker) "
            "carries `expires` (midnight UTC, 24 to 48 hours ahead). Deploy with `gcloud firestore fields ttls update "
            "expires --collection-group=KIND --enable-ttl` for each of those kinds; "
            "the hourly purge task (core.markers.purge) deletes expired markers everywhere, and is what "
            "deletes them on the emulators. An expired marker that is still there still counts as applied."),
)
