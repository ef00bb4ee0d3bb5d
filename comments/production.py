"""The comments lesson in production today (core.features.Caveat): a time-ordered indexed key."""
from core.features import Caveat

CAVEATS = (
    Caveat(
        fact="Sequential indexed values cap a kind's write rate: Firestore documents 500 writes a second for a "
             "collection whose documents hold a monotonically increasing indexed field, and Datastore mode's best "
             "practices warn of hotspots from such indexes.",
        source="https://cloud.google.com/firestore/docs/solutions/shard-timestamp",
        app="A comment's sort_key starts with its time, and it must be indexed for paging (its composite index "
            "with the entry). Its built-in index is one time-ordered range across every comment on every entry, so "
            "the site takes about 500 comments a second in all: a stated limit, 500 times what one entity takes, "
            "and what the per-user sequence buys is that no two users' comments ever collide below it. The "
            "entities' keys are not sequential (they sort by their user's UserSequence first). Beyond 500 a second, "
            "prefix the sort key with a shard and merge that many ranges per page (not done)."),
)
