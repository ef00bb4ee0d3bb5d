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
