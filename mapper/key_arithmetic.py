"""Key order and key arithmetic. Datastore orders keys by their paths, element by element: kind (by bytes), then the
id or name, ids before names, ids by number, names by bytes (as Python's str order); an ancestor before its
descendants. ndb keys of mixed id types do not compare (TypeError), hence `order`."""
from collections.abc import Callable, Sequence

from google.cloud import ndb

# Datastore's auto-allocated ids lie below 2**53: sequential ids below 2**52, scattered ids (the default since 2013)
# from 2**52 up to 2**52 + 2**51 (_MAX_SCATTERED_ID in the App Engine SDK's datastore_stub_util.py,
# github.com/GoogleCloudPlatform/appengine-python-standard); they stay exact in JavaScript. Arithmetic toward "any id"
# aims below it, and accounts/service.py's own scattered ids lie below it too.
ID_CEILING = 2 ** 53
NAME_WIDTH = 8  # characters of a name that key arithmetic looks at
GALLOP_ROOM = 2  # characters of a common prefix that galloping may carry into
CLASSES = ((ord("0"), ord("9")), (ord("a"), ord("z")), (ord("A"), ord("Z")))
Ident = int | str  # a key element's id or name


def order(key: ndb.Key) -> tuple[tuple[str, int, Ident], ...]:
    """A sort key for an ndb.Key that orders as Datastore does."""
    return tuple((kind, 0, ident) if isinstance(ident, int) else (kind, 1, ident) for kind, ident in key.pairs())


def inside(samples: Sequence[ndb.Key], lo: ndb.Key | None, hi: ndb.Key) -> list[ndb.Key]:
    """The sorted samples strictly between lo (exclusive, or None for the kind's start) and hi (exclusive)."""
    lo_o, hi_o = (order(lo) if lo else None), order(hi)
    return [s for s in samples if (lo_o is None or order(s) > lo_o) and order(s) < hi_o]


def by_id_density(read_start: ndb.Key | None, read_end: ndb.Key, hi: ndb.Key, read_len: int) -> float | None:
    """About how many entities (read_end, hi] holds if its ids lie as densely as the keys just read, `read_len` in
    (read_start, read_end]: for keys that differ only in a last element of integer ids; None for any other keys."""
    if read_start is None:
        return None
    paths = [key.pairs() for key in (read_start, read_end, hi)]
    if len({(p[:-1], p[-1][0]) for p in paths}) != 1:  # another parent path, or another kind
        return None
    low, end, high = (p[-1][1] for p in paths)
    if not all(isinstance(i, int) for i in (low, end, high)) or not low < end <= high:
        return None
    return read_len * (high - end) / (end - low)


def between(a: ndb.Key, b: ndb.Key, fraction: float) -> ndb.Key | None:
    """A key about `fraction` of the way from a to b (a < b), or None when there is no room: their shared path and one
    element between theirs where they first differ, so it lies between them whatever follows in either."""
    pa, pb = a.pairs(), b.pairs()
    i = 0
    while i < len(pa) and i < len(pb) and pa[i] == pb[i]:
        i += 1
    if i == len(pb):
        return None  # b is a or an ancestor of a: nothing lies between
    kind_b, ident_b = pb[i]
    # a an ancestor of b: aim among its children of b's kind, below b's element
    kind_a, ident_a = pa[i] if i < len(pa) else (kind_b, None)
    # another kind follows a's element: aim among a's kind's keys after it
    element = _element_between(kind_a, ident_a, ident_b if kind_a == kind_b else None, fraction)
    if element is None:
        return None
    return ndb.Key(pairs=[*pa[:i], element], project=a.project(), namespace=a.namespace())


def gallop(start: ndb.Key, end: ndb.Key, k: int) -> list[ndb.Key]:
    """Up to k-1 keys after `end`, spaced like the keys [start, end] just read and growing fourfold (1, 5, 21 pages on):
    for a range whose far end arithmetic cannot aim at, with no __scatter__ samples (the Firestore emulator has none),
    so the unknown rest gallops on in turn, a tree of logarithmic depth. Only keys differing in their last element."""
    pa, pb = start.pairs(), end.pairs()
    if pa[:-1] != pb[:-1] or pa[-1][0] != pb[-1][0]:
        return []
    kind, low, high = pb[-1][0], pa[-1][1], pb[-1][1]
    steps = [sum(4 ** i for i in range(j + 1)) for j in range(k - 1)]  # 1, 5, 21, 85 pages on
    if isinstance(low, int) and isinstance(high, int) and low < high:
        ids = [high + (high - low) * m for m in steps]
        elements = [(kind, i) for i in ids if i < ID_CEILING]
    elif isinstance(low, str) and isinstance(high, str) and low < high:
        # GALLOP_ROOM lets a name carry past the end of their common prefix ("acct-00999" on to "acct-01...")
        na, nb, to_name = _name_numbers(low, high, room=GALLOP_ROOM)
        names = [to_name(nb + (nb - na) * m) for m in steps]
        elements = [(kind, n) for n in names if n is not None and n > high]
    else:
        return []
    return [ndb.Key(pairs=list(pb[:-1]) + [e], project=end.project(), namespace=end.namespace()) for e in elements]


def _element_between(kind: str, low: Ident | None, high: Ident | None, fraction: float) -> tuple[str, Ident] | None:
    """(kind, id or name) between low and high (None: the kind's first / past its last), or None."""
    if high is None:
        high = ID_CEILING if isinstance(low, int) and low < ID_CEILING - 1 else None
        if high is None:
            return None
    if low is None:
        low = 0 if isinstance(high, int) else ""
    if isinstance(low, int) and isinstance(high, int):
        point = low + int((high - low) * fraction)
        return (kind, point) if low < point < high else None
    if isinstance(low, int):  # ids then names: the first half of the points among ids, the rest among names
        if fraction < 0.5 and low < ID_CEILING - 1:
            return (kind, low + int((ID_CEILING - low) * fraction * 2))
        low, fraction = "", max(0.0, fraction * 2 - 1)
    if isinstance(high, int):  # names sort after every id: no name lies below one
        return None
    na, nb, to_name = _name_numbers(low, high)
    point = na + int((nb - na) * fraction)
    name = to_name(point) if na < point < nb else None
    return (kind, name) if name is not None and low < name < high else None


def _name_numbers(low: str, high: str, room: int = 0) -> tuple[int, int, Callable[[int], str | None]]:
    """(low as a number, high as a number, number -> name or None): past their common prefix (less `room`
    characters), the next NAME_WIDTH characters read as digits in a base fitted to the characters the two use
    (digits, lowercase, uppercase or their code point span)."""
    common = 0
    while common < len(low) and common < len(high) and low[common] == high[common]:
        common += 1
    common = max(0, common - room)
    prefix, ra, rb = low[:common], low[common:common + NAME_WIDTH], high[common:common + NAME_WIDTH]
    codes = [ord(c) for c in ra + rb]
    first, last = min(codes), max(codes)
    for c_lo, c_hi in CLASSES:
        if c_lo <= first and last <= c_hi:
            first, last = c_lo, c_hi
            break
    base = last - first + 2  # digit 0 means "the name ended here", so shorter names sort first

    def number(text: str) -> int:
        digits = [min(max(ord(c) - first + 1, 1), base - 1) for c in text] + [0] * (NAME_WIDTH - len(text))
        return sum(digit * base ** power for digit, power in zip(digits, reversed(range(NAME_WIDTH)), strict=True))

    def to_name(point: int) -> str | None:
        if point >= base ** NAME_WIDTH:
            return None
        chars = ""
        for power in reversed(range(NAME_WIDTH)):  # the most significant digit first
            digit = point // base ** power % base
            if digit == 0:
                break
            code = first + digit - 1
            # surrogates are not text; the next valid code point keeps the order
            chars += chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)
        return prefix + chars

    return number(ra), number(rb), to_name
