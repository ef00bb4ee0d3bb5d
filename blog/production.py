"""The blog lesson in production today (core.features.Caveat)."""
from core.features import Caveat

CAVEATS = (
    Caveat(
        fact="An offset still reads every row it skips, and production bills each one: skipped entities \"are still "
             "retrieved internally ... and your application is billed for the read operations required to retrieve "
             "them\". The Firestore emulator skips them at little visible cost in time, so the lesson is in the bill.",
        source="https://cloud.google.com/appengine/docs/legacy/standard/python/datastore/query-cursors",
        app="Pages are found by index, never by offset: the page at depth 9,990 of a 10,000-entry blog is billed 10 "
            "reads, the same page by offset 10,000 (bench/results/blog.md; every request's bill is in its "
            "Server-Timing header and footer)."),
    Caveat(
        fact="Monotonically increasing key ids and indexed values make hotspots: Datastore mode's best practices "
             "warn against them, and Firestore documents a limit of 500 writes a second to a collection whose "
             "documents hold sequential values in an indexed field.",
        source="https://cloud.google.com/firestore/docs/solutions/shard-timestamp",
        app="An entry's id is its dense index under its blog, and `index` is indexed for paging. A blog posts at "
            "most about once a second (every post writes its BlogIndex, one entity group), far below 500 a second, "
            "and many blogs interleave. Timestamps that no query needs are stored unindexed (indexed=False) "
            "throughout the app, so they make no sequential index."),
)
