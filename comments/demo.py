"""The comments' demo content (on the demo blog's newest entries), and the live figure of their lesson on the tour."""
from typing import Any

from blog import demo as blog_demo
from blog import service as blog_service
from blog.models import EntryRef
from comments import service
from comments.models import Comment
from core.people import User

DEMO_USERS = ("ann", "bo", "chen", "dara", "eli")
_DEMO_LINES = [
    "Is this the same as the talk's example? https://www.youtube.com/results?search_query=building+scalable+web+apps",
    "Why does the sort key need the user id at all?",
    "Two comments in the same microsecond would still sort: the user id and the sequence break the tie.",
    "Paging backwards from here gives exactly the page I came from.",
    "My comment showed up at once, even though the listing query is eventually consistent.",
    "Each of us writes to our own entity group, so nobody waits for anybody.",
]


def seed() -> bool:
    """Comments from several users on the demo blog's newest entries; nothing when they have any."""
    newest = blog_service.get_blog(blog_demo.DEMO_BLOG)
    if newest is None or Comment.query().get(keys_only=True) is not None:
        return False
    top = newest.max_index
    for index, count in ((top, 45), (top - 1, 12), (top - 2, 3)):
        for n in range(count):
            name = DEMO_USERS[n % len(DEMO_USERS)]
            user: User = {"id": f"demo-{name}", "email": f"{name}@example.com", "admin": False}
            service.post_comment(EntryRef(blog_demo.DEMO_BLOG, index), user,
                                 f"{_DEMO_LINES[n % len(_DEMO_LINES)]} (comment {n + 1})")
    return True


def figure() -> dict[str, Any] | None:
    """Comments on the demo blog's front page: its entries' comment counters, cached totals in one round trip."""
    index = blog_service.get_blog(blog_demo.DEMO_BLOG)  # one get by key: the index entity knows the newest entry
    if index is None:
        return None
    newest = range(index.max_index, max(-1, index.max_index - blog_service.PAGE_SIZE), -1)
    counts = service.comment_counts([EntryRef(blog_demo.DEMO_BLOG, i) for i in newest])
    busiest = max(counts, key=lambda ref: (counts[ref], ref.index))
    return {"blog": blog_demo.DEMO_BLOG, "total": sum(counts.values()), "entries": len(counts),
            "busiest": busiest.index, "busiest_count": counts[busiest]}
