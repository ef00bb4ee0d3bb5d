"""A page of a listing read by key, never by offset (an offset reads and drops every row it skips)."""
from dataclasses import dataclass


@dataclass
class Page:
    """`items` in the order shown; `next`/`prev` bookmark the pages after and before them (None: no such page): a
    blog's, that page's first index; a comment page's, the sort key at its edge: the neighbour starts beyond it."""
    items: list
    next: object
    prev: object
