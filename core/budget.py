"""Each signed-in person's write budget: how many comments, new counters and blog entries one person may create in a
window (Settings.write_budget); past it a 429 with Retry-After (without a cap one script posted 30 comments and 20
counters in two seconds). A fixed window counted by the cache's `incr`, the write uncounted while the cache is away:
why, in docs/security.md ("write budget")."""
import time

from core import runtime
from core.errors import AppError

KINDS = {"comments": "comments", "counters": "new counters", "posts": "entries"}  # what each kind counts, for people


class TooManyWrites(AppError):
    """A person past their write budget: 429, `retry_after` seconds until their window ends."""
    status, code = 429, "too_many_writes"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def spend(user_id: str, kind: str) -> None:
    """Count one write of `kind` ("comments", "counters" or "posts") by `user_id`; TooManyWrites when it passes the
    person's budget for the window. Counted before the write is tried: a refused or resent write counts too."""
    budget = runtime.current().settings.write_budget
    limit = getattr(budget, kind)
    now = int(time.time())
    start = now - now % budget.window
    left = start + budget.window - now  # seconds until this window ends (1..window)
    key = f"write-budget:{kind}:{start}:{user_id}"
    # One counter shared by every process (Cache.next_number: two first writes at once both count); the key outlives
    # its window by a second, so a late incr never recreates it. None: the cache is away.
    count = runtime.cache().next_number(key, start=0, expire=left + 1)
    if count is not None and count > limit:
        raise TooManyWrites(f"You have created {limit} {KINDS[kind]} within {_duration(budget.window)}, the most one "
                            f"person may; try again in {_duration(left)}.", left)


def _duration(seconds: int) -> str:
    return f"{seconds} seconds" if seconds < 120 else f"{(seconds + 59) // 60} minutes"
