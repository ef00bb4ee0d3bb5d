"""Benchmark: the talk's kept counter beside today's COUNT and SUM aggregation queries, at 1,000, 10,000 and 100,000
accounts, on Firestore in Datastore mode (the legacy emulator has no aggregation queries).

At each size: the accounts' kept figures (two sharded counters, their configs and 16 shards each read by key) and one
aggregation query for COUNT and SUM over every account, each timed `--rounds` times, side by side; and what each
reads: the kept figures 34 entities at any size, the aggregation one index entry per account, billed one read per
batch of up to 1,000 entries. Accounts are written as bench/accounts.py writes them (`grow`).

Run: `make bench` (all benchmarks) or `.venv/bin/python -m bench.aggregation [--rounds 5]`.
"""
import math
import statistics
import sys
import time

from accounts import service
from bench import harness
from bench.accounts import grow
from core import runtime

SIZES = (1_000, 10_000, 100_000)
KEPT_READS = 2 + 2 * service.KEPT_SHARDS  # the two counters' configs and their shards, by key
KEPT_BILLED = 2 * service.KEPT_SHARDS  # of those, Datastore reads: the configs come from ndb's global cache


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def measure(args, stack, app):
    rt = runtime.current()
    harness.in_context(service.keep_figures)()
    kept_read = harness.in_context(lambda: service.COUNTERS.exact_totals([service.COUNT, service.BALANCE]))
    results, have = {}, 0
    for size in SIZES:
        grow(size, have)
        have = size
        kept, aggregated, agree = [], [], True
        for r in range(args.rounds + 1):  # the first of each warms up
            order = ("kept", "aggregation") if r % 2 == 0 else ("aggregation", "kept")
            for which in order:
                if which == "kept":
                    seconds, figures = _timed(kept_read)
                    kept.append(seconds)
                    agree &= (figures[service.COUNT], figures[service.BALANCE]) == (size, 0)
                else:
                    seconds, figures = _timed(lambda: rt.datastore.aggregations.count_and_sum("Account", "balance"))
                    aggregated.append(seconds)
                    agree &= figures == (size, 0)
        # what each is billed, counted from its RPCs' answers (the same on every call)
        kept_bill = harness.billed(kept_read)()[1]
        aggregation_bill = harness.billed(lambda: rt.datastore.aggregations.count_and_sum("Account", "balance"))()[1]
        results[size] = {"kept": kept[1:], "aggregation": aggregated[1:], "agree": agree,
                         "bills": (kept_bill, aggregation_bill)}
        print(f"{size:>7} accounts: kept {statistics.median(kept[1:]) * 1000:7.1f} ms, COUNT+SUM "
              f"{statistics.median(aggregated[1:]) * 1000:8.1f} ms, both exact: {agree}", flush=True)
    return results


def report(args, measured):
    rows, targets = [], []
    for column, results in measured.items():
        backend = harness.column_name(column)
        for size, r in results.items():
            kept_bill, aggregation_bill = r["bills"]
            rows.append([harness.LATENCY_NAMES[column[1]], f"{size:,}", f"{harness.median(r['kept']) * 1000:.1f}",
                         harness.bill_cell(kept_bill),
                         f"{harness.median(r['aggregation']) * 1000:.1f}", f"{size:,}",
                         harness.bill_cell(aggregation_bill), "yes" if r["agree"] else "**no**"])
            targets.append(harness.target(
                f"{backend}: billed reads at {size:,} accounts, counted from the RPCs = the pricing rule",
                f"{kept_bill.reads} / {aggregation_bill.reads}", f"{KEPT_BILLED} / {math.ceil(size / 1000)}",
                (kept_bill.reads, aggregation_bill.reads) == (KEPT_BILLED, math.ceil(size / 1000))))
        small, large = (harness.median(results[s]["aggregation"]) for s in (SIZES[0], SIZES[-1]))
        kept_small, kept_large = (harness.median(results[s]["kept"]) for s in (SIZES[0], SIZES[-1]))
        targets.append(harness.target(f"{backend}: kept figures' time, 100,000 / 1,000 accounts",
                                      kept_large / kept_small, "<= 1.5", kept_large / kept_small <= 1.5))
        targets.append(harness.target(f"{backend}: COUNT+SUM time, 100,000 / 1,000 accounts (it reads them all)",
                                      large / small, "grows with N (> 10)", large / small > 10))
        targets.append(harness.target(f"{backend}: every figure exact", "yes" if all(
            r["agree"] for r in results.values()) else "no", "yes", all(r["agree"] for r in results.values())))
    charted = next(iter(measured))  # the first column's (LATENCY=production unless --latency says otherwise)
    harness.bar_chart("aggregation", [f"{s:,}" for s in SIZES], ("kept figures", "COUNT+SUM"),
                      {(f"{s:,}", label): harness.median(measured[charted][s][key]) * 1000
                       for s in SIZES for label, key in (("kept figures", "kept"), ("COUNT+SUM", "aggregation"))},
                      f"ms to read the accounts' count and total, {harness.LATENCY_NAMES[charted[1]]} "
                      "(log; lower is better)", log=True)
    text = f"""# Aggregation benchmark: the kept counter beside COUNT and SUM

{harness.machine_line(sorted({b for b, _ in measured}))}. At each size, {args.rounds} reads of each after one
unmeasured, side by side (order alternating); medians. Reads billed: the kept figures are {KEPT_READS} entities
read by key at any size, of which {KEPT_BILLED} are Datastore reads (their configs come from ndb's global
cache); an aggregation query is one read per batch of up to 1,000 index entries, so in billed reads it costs
less than the kept figures up to {KEPT_BILLED},000 accounts and more beyond; in time it reads every entry, here
at every size.

{harness.BILL_NOTE}

{harness.markdown_table(["latency", "accounts", "kept ms", "kept figures billed", "COUNT+SUM ms", "index entries read",
                         "COUNT+SUM billed", "exact"], rows)}

{harness.WHOSE_FIGURES} Under a profile, an aggregation's wait grows with the entries it counts
(core/production_latency.py, an inference), on top of the emulator's own scan.
"""
    return harness.publish("aggregation", text, targets)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not any(a.startswith("--backends") for a in argv):
        argv = [*argv, "--backends", "firestore"]  # the legacy emulator has no aggregation queries
    return harness.main_per_column("bench.aggregation", argv, measure, report,
                                    extra=lambda p: p.set_defaults(rounds=5))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
