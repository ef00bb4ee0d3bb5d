"""`make bench`: every benchmark in turn; results in bench/results/. Exit 1 if any target was missed."""
import sys

from bench import accounts, aggregation, blog, comments, counters, mapper, overhead, pages, posts

BENCHMARKS = (counters, blog, posts, comments, mapper, accounts, aggregation, pages, overhead)

if __name__ == "__main__":
    ok = [b.main([]) for b in BENCHMARKS]
    sys.exit(0 if all(ok) else 1)
