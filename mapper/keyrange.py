"""Where to cut the rest of a mapper task's range, and into how many ranges (`ranges`: tree.py `split`).

Split points are `__scatter__` samples (read once, when the job starts: mapper/service.py) when the range holds enough:
Datastore keeps that hidden property on a pseudo-random sample of entities, so samples sorted by key are quantiles of
the kind. Deep in the tree a range holds too few; then key arithmetic between its ends (key_arithmetic.py)."""
import itertools
import math
from collections.abc import Sequence

from google.cloud import ndb

from mapper.key_arithmetic import between, by_id_density, gallop, inside, order


def ranges(rest_after: ndb.Key, hi: ndb.Key, *, first_scanned: ndb.Key | None, own_and_handed: int, scan_keys: int,
           fanout: int, samples: Sequence[ndb.Key]) -> list[tuple[ndb.Key, ndb.Key]]:
    """The rest, (rest_after, hi], cut into `parts_needed` ranges at `split_points`: [(lo, hi], ...], in key order."""
    parts = parts_needed(first_scanned, rest_after, hi, own_and_handed, scan_keys, fanout, samples)
    cuts = split_points(rest_after, hi, parts, samples, first_scanned) if parts > 1 else []
    return list(itertools.pairwise([rest_after, *cuts, hi]))


def parts_needed(first_scanned: ndb.Key | None, rest_after: ndb.Key, hi: ndb.Key, own_and_handed: int, scan_keys: int,
                 fanout: int, samples: Sequence[ndb.Key] = ()) -> int:
    """How many ranges the rest (rest_after, hi] is worth: its keys x 2 / `scan_keys` (a page and its handouts), so a
    child's range holds about half a scan's keys, a margin of 2 for an estimate's error; at most `fanout` (a few
    entities split `fanout` ways make as many tasks, each paying a task's fixed costs). Its size is judged by the
    density of samples among the `own_and_handed` keys just read (counted in (first_scanned, rest_after], as the
    rest's in (rest_after, hi]), else by its ids' density (the Firestore emulator keeps no samples); else `fanout`."""
    in_read = len(inside(samples, first_scanned, rest_after)) + (rest_after in samples)  # `inside`: strictly between
    in_rest = len(inside(samples, rest_after, hi)) + (hi in samples)
    if samples and in_read:
        remaining: float | None = in_rest * own_and_handed / in_read
    else:
        remaining = by_id_density(first_scanned, rest_after, hi, own_and_handed)
    if remaining is None:
        return fanout
    return max(1, min(fanout, math.ceil(2 * remaining / scan_keys)))


def split_points(rest_after: ndb.Key, hi: ndb.Key, k: int, samples: Sequence[ndb.Key] = (),
                 first_scanned: ndb.Key | None = None) -> list[ndb.Key]:
    """Up to k-1 keys strictly between `rest_after` (its task's last key kept or handed out) and hi, cutting the rest
    into about equal ranges: `samples`' quantiles (by `order`) when it holds k-1, else key arithmetic; fewer when
    the keys leave no room. Where arithmetic cannot aim at hi, they gallop on from [first_scanned, rest_after]."""
    within = inside(samples, rest_after, hi)
    if len(within) >= k - 1:
        points = [within[len(within) * j // k] for j in range(1, k)]
    else:
        points = [between(rest_after, hi, j / k) for j in range(1, k)]
        if first_scanned is not None and not any(points):
            points = gallop(first_scanned, rest_after, k)
    result, last = [], order(rest_after)
    for p in points:  # strictly increasing, strictly inside: arithmetic rounds, quantiles may repeat
        if p is not None and last < order(p) < order(hi):
            result.append(p)
            last = order(p)
    return result
