"""Where to cut a range of a kind's keys, and into how many ranges: the mapper's split (tree.py `split`).

Split points are `__scatter__` samples (read once, when the job starts: mapper/service.py) when the range holds enough:
Datastore keeps that hidden property on a pseudo-random sample of entities, so samples sorted by key are quantiles of
the kind. Deep in the tree a range holds too few; then key arithmetic between its ends (key_arithmetic.py)."""
import math
from collections.abc import Sequence

from google.cloud import ndb

from mapper.key_arithmetic import between, by_id_density, gallop, inside, order


def parts_needed(read_start: ndb.Key | None, read_end: ndb.Key, hi: ndb.Key, own_and_handed: int, scan_keys: int,
                 fanout: int, samples: Sequence[ndb.Key] = ()) -> int:
    """How many ranges the rest (read_end, hi] is worth: its keys x 2 / `scan_keys` (the keys one scan reads), so a
    child's range holds about half a scan's keys, a margin of 2 for an estimate's error; at most `fanout` (a few
    entities split `fanout` ways make as many tasks, each paying a task's fixed costs). Its size is judged by the
    density of samples among the `own_and_handed` keys just read (counted in (read_start, read_end], as the rest's in
    (read_end, hi]), else by its ids' density (the Firestore emulator keeps no samples); unknown: `fanout`."""
    in_read = len(inside(samples, read_start, read_end)) + (read_end in samples)  # `inside`: strictly between its ends
    in_rest = len(inside(samples, read_end, hi)) + (hi in samples)
    if samples and in_read:
        remaining: float | None = in_rest * own_and_handed / in_read
    else:
        remaining = by_id_density(read_start, read_end, hi, own_and_handed)
    if remaining is None:
        return fanout
    return max(1, min(fanout, math.ceil(2 * remaining / scan_keys)))


def split_points(after: ndb.Key, hi: ndb.Key, k: int, samples: Sequence[ndb.Key] = (),
                 read_start: ndb.Key | None = None) -> list[ndb.Key]:
    """Up to k-1 keys strictly between `after` (the last key read) and hi, cutting (after, hi] into ranges of about
    equal size: `samples`' quantiles (by `order`) when the range holds k-1, else key arithmetic; fewer when the keys
    leave no room. Where arithmetic cannot aim at hi, points gallop on from the keys read [read_start, after]."""
    within = inside(samples, after, hi)
    if len(within) >= k - 1:
        points = [within[len(within) * j // k] for j in range(1, k)]
    else:
        points = [between(after, hi, j / k) for j in range(1, k)]
        if read_start is not None and not any(points):
            points = gallop(read_start, after, k)
    result, last = [], order(after)
    for p in points:  # strictly increasing, strictly inside: arithmetic rounds, quantiles may repeat
        if p is not None and last < order(p) < order(hi):
            result.append(p)
            last = order(p)
    return result
