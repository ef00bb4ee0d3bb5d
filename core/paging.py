"""A page of a listing read by key, never by offset (an offset reads and drops every row it skips)."""
from dataclasses import dataclass


@dataclass
class Page:
    """`items` in the order shown, and the bookmarks of the pages around: each is where the neighbouring page's key
    range starts (a sort key, an index), None where there is no such page."""
    items: list
    next: object
    prev: object
