"""core/fragments.py: the per-process LRU of rendered HTML (no service behind it, so no stack needed)."""
import threading

from core.fragments import Fragments


def test_a_fragment_is_rendered_once_per_key_and_the_oldest_fall_off():
    fragments, renders = Fragments(size=3), []

    def render(key):
        renders.append(key)
        return f"<p>{key}</p>"
    for key in ("a", "b", "a", "c", "a", "d"):  # "b", the least recently used, goes when "d" comes
        assert fragments.get_or_render(key, lambda key=key: render(key)) == f"<p>{key}</p>"
    assert renders == ["a", "b", "c", "d"] and len(fragments) == 3
    fragments.get_or_render("b", lambda: render("b"))
    assert renders[-1] == "b" and len(fragments) == 3


def test_threads_share_one_cache_and_it_stays_bounded():
    fragments = Fragments(size=10)
    barrier = threading.Barrier(8)

    def worker(n):
        barrier.wait()
        for i in range(200):
            key = (n + i) % 25
            assert fragments.get_or_render(key, lambda key=key: str(key)) == str(key)
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fragments) == 10


def test_the_cache_is_bounded_in_bytes_too():
    """A count alone would let 256 pages of long entries fill an instance's memory: the bytes kept are bounded, the
    oldest going first, and a fragment larger than the whole bound is served without being kept."""
    fragments = Fragments(size=100, max_bytes=1000)
    for key in "abcde":
        assert fragments.get_or_render(key, lambda key=key: key * 300) == key * 300
    assert len(fragments) == 3 and fragments.bytes == 900  # a and b made room for d and e
    assert fragments.get_or_render("é", lambda: "é" * 400) == "é" * 400  # 800 bytes in UTF-8
    assert len(fragments) == 1 and fragments.bytes == 800
    huge = fragments.get_or_render("huge", lambda: "x" * 5000)
    assert huge == "x" * 5000 and len(fragments) == 1 and fragments.bytes == 800
