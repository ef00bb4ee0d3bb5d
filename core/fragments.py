"""Rendered HTML kept in this process's memory (memcached spares a thousand visitors the query, this the template),
under a key that is the whole input: immutable entries by blog and index, and the figures beside them. So a fragment
is never stale and never invalidated: a new post or comment count is a new key, and old keys fall off the end of a
bounded LRU. Each process keeps its own; nothing is written to Datastore or the cache."""
import collections
import threading
from collections.abc import Callable, Hashable

# Bounded in bytes as well as in count: one page of ten long entries can render to megabytes, and the smallest
# instance classes have a few hundred MB in all (https://cloud.google.com/appengine/docs/standard#instance_classes).
MAX_BYTES = 16 * 1024 * 1024


class Fragments:
    """A bounded LRU of rendered fragments: `get_or_render(key, render)`. At most `size` of them and `max_bytes` of
    HTML (UTF-8) in all; a fragment larger than that is served and not kept."""

    def __init__(self, size: int = 256, max_bytes: int = MAX_BYTES) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._items: collections.OrderedDict[Hashable, tuple[str, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_or_render(self, key: Hashable, render: Callable[[], str]) -> str:
        with self._lock:
            kept = self._items.get(key)
            if kept is not None:
                self._items.move_to_end(key)
                return kept[0]
        html = render()  # outside the lock: two threads may render the same fragment once each, never wrongly
        size = len(html.encode())
        if size > self.max_bytes:
            return html
        with self._lock:
            previous = self._items.pop(key, None)
            self._bytes += size - (previous[1] if previous else 0)
            self._items[key] = (html, size)
            while len(self._items) > self.size or self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]
        return html

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
