"""The blog's HTML pages, and the hook through which other features add to its entries without the blog knowing them.

The entry page is the blog's. A feature that has something to say about every entry (comments: a count on each
entry's meta line, a section under the entry on its page, a field in the entry's JSON) describes it as an
`EntryAddon` and registers it from its own init_app (`add_entry_addon`). The blog calls its addons; it never imports
them, so dependencies run one way: comments -> blog -> counters.
"""
import contextlib
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from flask import Response, current_app, render_template
from google.cloud import ndb
from markupsafe import Markup
from werkzeug.http import parse_cookie
from werkzeug.sansio.utils import host_is_trusted
from werkzeug.wsgi import get_host

from blog import service
from blog.models import BlogIndex
from core import runtime
from core.cache import CACHE_DOWN
from core.fragments import Fragments

EXTENSION = "blog.entry_addons"
FRAGMENTS = "blog.fragments"  # the rendered pages of entries, per process (core/fragments.py)


@dataclass(frozen=True)
class EntryAddon:
    name: str
    # {ref: {field: value}} for a page of entries: one call per page (one memcached round trip, not one per entry).
    # The fields join each entry's JSON and are what `meta_template` and `section` are given.
    summaries: Callable[[list], dict]
    # A partial for each entry's meta line, given `ref`, `summary` and `on_entry_page`.
    meta_template: str | None = None
    # (ref, summary, state) -> the HTML under the entry on its page. `state` is what the addon's own route passed to
    # render_entry (comments: the refused form, to show again), else None.
    section: Callable | None = None


def add_entry_addon(app, addon):
    app.extensions.setdefault(EXTENSION, []).append(addon)


def _addons():
    return current_app.extensions.get(EXTENSION, [])


def summaries(refs):
    """{ref: the fields every addon has for it}."""
    merged = {ref: {} for ref in refs}
    for addon in _addons():
        for ref, fields in addon.summaries(refs).items():
            merged[ref].update(fields)
    return merged


def init_app(app):
    app.extensions[FRAGMENTS] = Fragments()
    runtime.add_shortcut(app, functools.partial(serve_kept, app))


def render_index(blog, page, form=None):
    refs = [service.EntryRef(blog, e["index"]) for e in page.items]
    shown = summaries(refs)
    # The page of entries rendered once per process for what it shows: an entry is never changed once posted, so its
    # blog and index name its content, and the addons' figures (comment counts) are in the key as they are now.
    key = (blog, tuple(ref.index for ref in refs), tuple(tuple(sorted(shown[ref].items())) for ref in refs))
    entries_html = current_app.extensions[FRAGMENTS].get_or_render(key, lambda: Markup(render_template(
        "blog/_entries.html", blog=blog, page=page, refs=refs, summaries=shown, addons=_addons())))
    return render_template("blog/index.html", blog=blog, page=page, form=form or {}, entries_html=entries_html)


def render_entry(ref, status=200, state=None):
    """The entry page, with each addon's section below the entry; `state` ({addon name: its state}) lets an addon's
    own route show the page again after refusing its input, with `status`."""
    entry = service.require_entry(ref)
    summary = summaries([ref])[ref]
    sections = [addon.section(ref, summary, (state or {}).get(addon.name)) for addon in _addons() if addon.section]
    return render_template("blog/entry.html", blog=ref.blog, entry=entry, ref=ref, views=service.view_count(ref),
                           max_index=service.require_blog(ref.blog).max_index,
                           views_counter=service.views_counter(ref), summary=summary, addons=_addons(),
                           sections=sections), status


# --- the front page as a visitor sees it, and the feed, whole --------------------------------------------------------
# A visitor (no session, no query) sees what every other visitor sees, but for the footer's figures
# of this request; a feed is the same for everyone. So each is kept whole in the cache beside the BlogIndex's own
# entry in ndb's global cache, and one round trip reads both (core.datastore.Datastore.peek): a kept copy is served
# only when it was rendered for the max_index that entry holds now. That entry is never older than Datastore (ndb
# locks it before a post commits), so a copy rendered before a post is never served after it: the never-stale
# guarantee of the cached front page (service._page_cache_key) holds for the whole page too. What else the page shows,
# the entries' comment counts, may be KEPT_LIFETIME old, as a cached total may be up to a minute old
# (counters/totals.py).
#
# A kept copy is served ahead of Flask (`serve_kept`, a core.runtime shortcut): no ndb context, no request context,
# no routing, no session; the security headers and the accounting are added as to every response. The views render
# and keep a copy when there is none.
KEPT_LIFETIME = 5  # seconds
_COST = re.compile(r"<span data-cost>.*?</span>", re.S)
_COST_SLOT = "<span data-cost>\x00</span>"
_KEPT_PATH = re.compile(r"/blog/(?P<blog>[^/]+)(?P<feed>/feed\.atom)?")


def is_visitor(environ, session_cookie):
    """Whether this request is a visitor's plain look at a page: nothing about it depends on who asks."""
    return (not environ.get("QUERY_STRING")
            and ("HTTP_COOKIE" not in environ or session_cookie not in parse_cookie(environ["HTTP_COOKIE"])))


def _keys(what, blog):
    """The blog's BlogIndex key, and the key its `what` is kept under. Made without an ndb context (a shortcut has
    none): the project, namespace and database named, as the app's client has them. The app's canonical host name is
    in the key, never the request's: what is kept links by path and names entries by canonical URLs, the same under
    every Host, and a key per Host would let varied Host values (every `<anything>-dot-PROJECT.appspot.com` reaches
    the app on App Engine) each render and bill the page again."""
    rt = runtime.current()
    client = rt.datastore.client
    return _keys_in(client.project, client.namespace, client.database, what, rt.settings.canonical_host, blog)


@functools.lru_cache(maxsize=1024)
def _keys_in(project, namespace, database, what, host, blog):  # once per process each: a Key is slow to build
    blog_key = ndb.Key(BlogIndex, blog, project=project, namespace=namespace, database=database)
    return blog_key, f"kept-{what}:{host}:".encode() + blog_key.urlsafe()


def kept(blog, what):
    """The blog's `what` ("front" or "feed") as kept for the blog's current max_index, as bytes; None when there is
    none (or the cache is away, or the blog does not exist)."""
    blog_key, kept_key = _keys(what, blog)
    try:
        entity, (text,) = runtime.current().datastore.peek(blog_key, kept_key)
    except CACHE_DOWN:
        return None
    if entity is None or text is None:
        return None
    stamp, _, body = text.partition(b"\n")
    return body if int(stamp) == entity.properties["max_index"].integer_value else None


def keep(blog, what, max_index, body):
    """Keep `body`, the blog's `what` rendered for `max_index` (a front page with its footer's figures left out)."""
    if what == "front":
        body = _COST.sub(_COST_SLOT, body, count=1)
    with contextlib.suppress(*CACHE_DOWN):  # not kept this time: the next request renders it again
        runtime.current().datastore.keep(_keys(what, blog)[1], f"{max_index}\n{body}".encode(),
                                         KEPT_LIFETIME)


def serve_kept(app, environ):
    """A shortcut (core.runtime.add_shortcut): a visitor's `GET /blog/<blog>` or anyone's `GET
    /blog/<blog>/feed.atom`, answered with the kept copy while it is current, the front page's footer given this
    request's figures; None for any other request, or when there is no current copy."""
    if environ["REQUEST_METHOD"] != "GET" or environ.get("QUERY_STRING"):
        return None
    match = _KEPT_PATH.fullmatch(environ.get("PATH_INFO", ""))
    if match is None or not service.NAME_PATTERN.fullmatch(match["blog"]):
        return None
    trusted = app.config["TRUSTED_HOSTS"]
    if trusted and not host_is_trusted(get_host(environ), trusted):  # Flask refuses it (400), as it does every page
        return None
    if match["feed"]:
        body = kept(match["blog"], "feed")
        return None if body is None else Response(body, mimetype="application/atom+xml")
    if not is_visitor(environ, app.config["SESSION_COOKIE_NAME"]):
        return None
    body = kept(match["blog"], "front")
    if body is None:
        return None
    cost = app.jinja_env.globals["request_cost"](encoded=True)  # HTML, encoded; None when nothing is counted
    response = Response(body.replace(b"\x00", cost or b"", 1), mimetype="text/html")
    response.vary.add("Cookie")  # a signed-in visitor's page is another
    return response
