"""The mapper lesson in production today (core.features.Caveat): ramping up, counting."""
from core.features import Caveat

CAVEATS = (
    Caveat(
        fact="Traffic to a kind or key range must ramp up: Google's 500/50/5 rule is to start at 500 operations a "
             "second and add at most 50% every 5 minutes.",
        source="https://cloud.google.com/datastore/docs/best-practices",
        app="queue.yaml lets the mapper's fan-out reach 50 tasks a second, each writing a page of up to 100 "
            "accounts: up to 5,000 writes a second within seconds of a job's start, ten times the rule's start. "
            "Neither emulator throttles it. A stated limit: over a kind that has had little traffic, lower the "
            "queue's rate (5/s is about 500 writes a second) and raise it as the rule allows."),
    Caveat(
        fact="ndb's Query.count() counts in production by skipping: a keys-only query with an offset, every counted "
             "entity skipped and billed a read (on an emulator it iterates the keys instead). An aggregation query "
             "(COUNT, SUM) is billed one read per 1,000 index entries.",
        source="https://github.com/googleapis/python-ndb/blob/main/google/cloud/ndb/_datastore_query.py",
        app="The app never counts a kind: the accounts' count and total are kept as sharded counters (32 reads at "
            "any size), audited by a mapper job with a tally, and shown beside one COUNT + SUM aggregation query on "
            "the accounts page, with both bills."),
)
