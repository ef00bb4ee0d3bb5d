"""Benchmark: 32 writers commenting on one entry, the talk's design against the one it rejects, and the ceiling.

- designed: `comments.service.post_comment`, what the app runs: each writer is its own user, so each comment is a
            transaction on the writer's own entity group (its sequence and the comment), then +1 on the entry's
            adaptive comment counter;
- shared:   the design the talk rejects: every comment takes its number from one shared sequence entity, in the
            transaction that writes the comment, at its best on each backend (harness.one_entity_transaction). It
            does less than `designed` (no comment count), which only flatters it;
- ceiling:  each writer comments on an entry of its own, through the same post_comment: the same work with nothing
            shared at all.
Each run counts the comments stored afterwards: a comment acknowledged but not stored, or stored twice, is "lost".
Every variant runs on each backend, on the bare emulator and under the production latency model (LATENCY=production,
core/production_latency.py), side by side in one run.

Run: `make bench` (all benchmarks) or `.venv/bin/python -m bench.comments [--rounds 3 --seconds 8]`.
"""
import sys

from google.cloud import ndb

from bench import harness
from blog import service as blog_service
from blog.models import EntryRef
from comments import service
from comments.models import Comment, UserSequence
from core import clock
from counters import growth

VARIANTS = ("designed", "shared", "ceiling")
WRITERS = 32
WARMUP = 3.0  # the entry's adaptive comment counter finds its size here, as a lively entry's would


class SharedSequence(ndb.Model):
    """The rejected design's one sequence for all comments (bench only)."""
    _use_cache = False
    _use_global_cache = False
    seq = ndb.IntegerProperty(default=0, indexed=False)


def _users(tag):
    return [{"id": f"bench-{tag}-{i}", "email": f"w{i}@example.com"} for i in range(WRITERS)]


def _prepare(variant, tag):
    """The blog and entries this run writes to; returns (op(writer) -> attempts, entry refs to count)."""
    blog = f"bench-{tag}"
    entries = WRITERS if variant == "ceiling" else 1
    for i in range(entries):
        blog_service.post_entry(blog, f"entry {i}", "body", "bench")
    users = _users(tag)
    if variant == "designed":
        return lambda w: service.post_comment(EntryRef(blog, 0), users[w], "a comment") and None, [EntryRef(blog, 0)]
    if variant == "ceiling":
        return (lambda w: service.post_comment(EntryRef(blog, w), users[w], "a comment") and None,
                [EntryRef(blog, i) for i in range(WRITERS)])
    seq_key = ndb.Key(SharedSequence, blog)

    def shared(w):
        def txn():
            sequence = seq_key.get(retries=0) or SharedSequence(key=seq_key)
            sequence.seq += 1
            now = clock.now()
            key_name = f"{sequence.seq:012d}"
            ndb.put_multi([sequence, Comment(key=ndb.Key(UserSequence, users[w]["id"], Comment, key_name),
                                             entry=EntryRef(blog, 0).path, sort_key=key_name, text="a comment",
                                             author=f"w{w}", created=now)])
        harness.one_entity_transaction(txn, seq_key, base=0.25)
    return shared, [EntryRef(blog, 0)]


def _stored(refs):
    return sum(len(Comment.query(Comment.entry == ref.path).fetch(keys_only=True)) for ref in refs)


def _counted(refs):
    names = [service.comments_counter(ref) for ref in refs]
    return sum(service.COUNTERS.totals(names).values())


def measure(rounds, seconds, column=""):
    """`column` names this run's blogs apart from another column's in the same process (an adaptive counter's
    contention window is kept per process and name: counters/growth.py)."""
    results = {v: [] for v in VARIANTS}
    lost = dict.fromkeys(VARIANTS, 0)
    bills, grown = {}, []
    for r in range(rounds):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            op, refs = harness.in_context(_prepare)(variant, f"{column}r{r}-{variant}")
            load = harness.run_writers(WRITERS, op, seconds, warmup=WARMUP)
            stored = harness.in_context(_stored)(refs)
            acknowledged = load.commits + load.warm_commits
            lost[variant] += abs(stored - acknowledged)
            if variant != "shared":  # the count is part of the designed transaction: it must equal the comments
                counted = harness.in_context(_counted)(refs)
                lost[variant] += abs(counted - stored)
            results[variant].append(load)
            if variant == "designed":  # the one thing its writers share: the entry's comment counter, and its size
                counter = service.COUNTERS.name(service.comments_counter(refs[0]))
                grown.append(harness.in_context(growth.require_config)(counter).num_shards)
            if variant not in bills:  # one more comment, alone, after the counts were checked: its bill
                bills[variant] = harness.billed(harness.in_context(op))(0)[1]
            print(f"round {r + 1} {variant:>8}: {load.per_second:7.1f} comments/s, p50 {load.pct(50) * 1000:7.1f} ms, "
                  f"p99 {load.pct(99) * 1000:7.1f} ms, errors {load.errors}, stored {stored} of {acknowledged}",
                  flush=True)
    return results, lost, (bills, grown)


# Where production's waits are modelled. On the bare emulator one entity is held for microseconds, so the shared
# sequence is not slow there (in turn on the Firestore emulator it committed 80-150 comments/s, as many as the designed
# comments): its figures are reported, not judged. What is judged on every column is that the designed comments
# share nothing (designed against the ceiling) and lose nothing.
TARGET_VS_SHARED = {"production": 3, "multi-region": 3}


def _section(column, results, lost, measured, seconds, rounds):
    backend, latency = column
    bills, grown = measured
    name = harness.column_name(column)
    med = {v: {"rate": harness.median([x.per_second for x in loads]),
               "p50": harness.median([x.pct(50) for x in loads]) * 1000,
               "p99": harness.median([x.pct(99) for x in loads]) * 1000,
               "errors": sum(x.errors for x in loads)} for v, loads in results.items()}
    rows = [[v, f"{m['rate']:.1f}", f"{m['p50']:.1f}", f"{m['p99']:.1f}", m["errors"], lost[v],
             harness.bill_cell(bills[v])] for v, m in med.items()]
    d, s, c = med["designed"], med["shared"], med["ceiling"]
    shared_comments = sum(x.commits for x in results["shared"])
    checks = []
    if latency in TARGET_VS_SHARED:
        target = TARGET_VS_SHARED[latency]
        # A ratio against a variant that committed nothing measures nothing: the check says so, and is missed.
        vs_shared = d["rate"] / s["rate"] if s["rate"] else f"shared committed nothing in {rounds} x {seconds} s"
        checks.append((f"{name}: designed / shared sequence, comments/s", vs_shared, f">= {target}",
                       not isinstance(vs_shared, str) and vs_shared >= target))
    checks += [(f"{name}: designed / ceiling, comments/s", d["rate"] / c["rate"], ">= 0.8",
                d["rate"] / c["rate"] >= 0.8),
               (f"{name}: comments lost or doubled (designed, all rounds)", lost["designed"], "0",
                lost["designed"] == 0)]
    chain = ("Critical path: a designed comment is one transaction on its writer's own group (Lookup, Commit) and one "
             "on a shard of the entry's counter, and nothing another writer holds; with the shared sequence every "
             f"comment's transaction waits for the one before: {shared_comments} of them followed one another here.")
    bound = (f"The bound here: with nothing shared at all (ceiling), {WRITERS} writers on this machine's 2 cores made "
             f"{c['rate']:.1f} comments/s, {c['rate'] / s['rate']:.2f}x the shared sequence; the designed comments "
             f"made {d['rate'] / c['rate']:.2f} of that." if s["rate"] else "")
    if latency != "none":  # through the stand-in neither bound is this machine's: say what bounds each
        bound += (f" Through the stand-in each writer's own sequence takes one write a second, in both, and so does "
                  f"each shard of an entry's comment counter: the ceiling's {WRITERS} entries have a counter each; "
                  f"the designed comments share their entry's, which starts at one shard each round and grows while "
                  f"measured (its shards at each round's end: {grown}).")
    text = f"""## {name}

{chain} {bound}

{harness.markdown_table(["variant", "comments/s", "p50 ms", "p99 ms", "errors", "lost", "billed per comment, alone"],
                        rows)}
"""
    return text, checks


def report(args, measured):
    sections, checks = [], []
    harness.bar_chart("comments", [harness.column_name(c) for c in measured], VARIANTS,
                      {(harness.column_name(c), v): harness.median([x.per_second for x in measured[c][0][v]])
                       for c in measured for v in VARIANTS}, f"comments/s, {WRITERS} writers (log; higher is better)",
                      log=True)
    for column, (results, lost, bills) in measured.items():
        text, backend_checks = _section(column, results, lost, bills, args.seconds, args.rounds)
        sections.append(text)
        checks += backend_checks
    machine = harness.machine_line(sorted({b for b, _ in measured}))
    text = f"""# Comments benchmark

{machine}. {WRITERS} writers, {args.rounds} rounds x {args.seconds} s per variant after
{WARMUP} s of the same load unmeasured; variants side by side in each round, order rotating; medians over the rounds.
`errors`: comments that gave up, summed over the rounds. `lost`: comments acknowledged but not stored (or stored
twice), plus, where the count is kept, any difference between the comment count and the comments.
{harness.BILL_NOTE} A comment that collides is billed again for each retry: the bill above is the least it costs.

{harness.WHOSE_FIGURES}

{chr(10).join(sections)}"""
    return harness.publish("comments", text, [harness.target(*check) for check in checks])


def main(argv=None):
    return harness.main_per_column(
        "bench.comments", argv,
        lambda args, stack, app: measure(args.rounds, args.seconds, harness.column_tag(app)), report)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
