"""Rendered HTML kept in this process's memory, under a key that names everything the HTML was made from.

The talk's first lesson, once more: a thousand visitors of the front page would each render the same ten entries.
Memcached already spares them the query; this spares them the template. The key is the whole input (immutable entries
by their blog and index, and the figures shown beside them), so a fragment can never be stale and is never
invalidated: a new post or a new comment count is a new key, and old keys fall off the end (LRU, bounded). Each
process (each gunicorn worker, each App Engine instance) keeps its own; nothing is shared, nothing is written to
Datastore or the cache.
"""
import collections
import threading
from collections.abc import Callable, Hashable


class Fragments:
    """A bounded LRU of rendered fragments: `get_or_render(key, render)`."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: collections.OrderedDict[Hashable, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get_or_render(self, key: Hashable, render: Callable[[], str]) -> str:
        with self._lock:
            html = self._items.get(key)
            if html is not None:
                self._items.move_to_end(key)
                return html
        html = render()  # outside the lock: two threads may render the same fragment once each, never wrongly
        with self._lock:
            self._items[key] = html
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return html

    def __len__(self):
        return len(self._items)
