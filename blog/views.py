"""The blog: /blog pages, the admin post form, the Atom feed, and the /api/blogs routes."""
import contextlib
from collections.abc import Callable, Mapping

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from blog import entries, pages, service, view_counts
from blog.validate import BODY_MAX, TITLE_MAX
from core import budget, idempotency, identity, people, runtime, validate
from core.errors import AppError, BadInput
from core.web import body_limit, form_refused, json_body, text_body_bytes

bp = Blueprint("blog", __name__)
ENTRY_BODY_BYTES = text_body_bytes(TITLE_MAX, BODY_MAX)  # the routes that post an entry; every other takes a few KiB


def _cache_or_not() -> contextlib.AbstractContextManager[None]:
    """The block a page is read in: as usual, or for `?cache=bypass` (admins only: make load compares the two) as if
    there were no cache."""
    value = request.args.get("cache")
    if value is None:
        return contextlib.nullcontext()
    if value != "bypass":
        raise BadInput("cache may only be 'bypass'.", "bad_cache")
    identity.require_admin()
    return runtime.current().cache_bypassed()


@bp.get("/blog")
def blogs() -> ResponseReturnValue:
    """Every blog, and for admins a form to start one."""
    return render_template("blog/blogs.html", blogs=entries.list_blogs(), form={})


@bp.get("/blog/<blog>")
def index(blog: str) -> ResponseReturnValue:
    """A page of a blog's entries, newest first: `?start=<index>` pages back by index."""
    with _cache_or_not():
        return pages.render_index(blog, service.get_page(blog, request.args.get("start")))


@bp.get("/blog/<blog>/<int:index>")
def entry(blog: str, index: int) -> ResponseReturnValue:
    """One entry by its permalink, with what the entry addons show under it; the page's script counts the view."""
    return pages.render_entry(service.entry_ref(blog, index))


@bp.get("/blog/<blog>/feed.atom")
def feed(blog: str) -> ResponseReturnValue:
    """The newest entries as an Atom feed."""
    page = service.get_page(blog, None, service.FEED_SIZE)
    # Well-formed XML whatever the entries hold: one stored before its text was checked may carry a character XML 1.0
    # has no place for, which would make a reader refuse the whole feed. Such characters are never markup.
    feed_xml = validate.without_unsafe_characters(render_template("blog/feed.xml", blog=blog, page=page))
    return feed_xml, {"Content-Type": "application/atom+xml; charset=utf-8"}


def _post_from_form(blog: str, render: Callable[[Mapping[str, str]], str]) -> ResponseReturnValue:
    """Admin: post the form's entry to `blog`; on bad input `render(form)` the page again, the form filled in."""
    user = identity.require_admin()
    budget.spend(user["id"], "posts")
    form = request.form
    try:
        posted = service.post_entry(blog, form.get("title", ""), form.get("body", ""),
                                    people.display_name(user["email"]), form.get("post_token") or None, user["id"])
    except AppError as e:
        return form_refused(e, lambda status: (render(form), status))
    if not posted.replayed:
        flash(f"Posted entry {posted.entry['index']}.", "info")
    return redirect(url_for("blog.entry", blog=blog, index=posted.entry["index"]))


@bp.post("/blog")
@body_limit(ENTRY_BODY_BYTES)
def start_blog_form() -> ResponseReturnValue:
    """Admin: start a blog by posting its first entry."""
    blog = request.form.get("blog", "").strip()
    return _post_from_form(
        blog, lambda form: render_template("blog/blogs.html", blogs=entries.list_blogs(), form=form))


@bp.post("/blog/<blog>/entries")
@body_limit(ENTRY_BODY_BYTES)
def post_form(blog: str) -> ResponseReturnValue:
    """Admin: post an entry from the form on the blog's page."""
    return _post_from_form(blog, lambda form: pages.render_index(blog, service.get_page(blog), form))


@bp.get("/api/blogs")
def api_blogs() -> ResponseReturnValue:
    """Every blog with its number of entries (the first 100 by name)."""
    return jsonify(blogs=[{"name": name, "entries": count} for name, count in entries.list_blogs()])


@bp.post("/api/blogs/<blog>/entries")
@body_limit(ENTRY_BODY_BYTES)
def api_post(blog: str) -> ResponseReturnValue:
    """Admin: {"title", "body"} posts an entry with the blog's next index; at most once per Idempotency-Key."""
    user = identity.require_admin()
    budget.spend(user["id"], "posts")
    data = json_body()
    posted = service.post_entry(blog, data.get("title"), data.get("body"), people.display_name(user["email"]),
                                request.headers.get("Idempotency-Key"), user["id"])
    response = idempotency.marked(jsonify(posted.entry), posted.replayed)
    response.headers["Location"] = url_for("blog.api_entry", blog=blog, index=posted.entry["index"])
    return response, 201


@bp.get("/api/blogs/<blog>/entries")
def api_entries(blog: str) -> ResponseReturnValue:
    """A page of entries, newest first: `?start=<index>&limit=<1..50>`; `next` is the older page's start."""
    with _cache_or_not():
        page = service.get_page(blog, request.args.get("start"), request.args.get("limit"))
        return jsonify(entries=page.items, next=page.next, newer=page.prev, max_index=page.max_index,
                       cached=page.cached)


@bp.post("/api/blogs/<blog>/entries/<index>/views")
def api_view(blog: str, index: str) -> ResponseReturnValue:
    """Count one view of the entry (sent by its page's script; anyone may) -> its view count."""
    return jsonify(views=view_counts.record_view(service.entry_ref(blog, index)))


@bp.get("/api/blogs/<blog>/entries/<index>")
def api_entry(blog: str, index: str) -> ResponseReturnValue:
    """One entry by index, with its view count and what the entry addons add (comments: its comment count)."""
    ref = service.entry_ref(blog, index)
    entry = entries.require_entry(ref)
    return jsonify({**entry, "views": view_counts.view_count(ref), **pages.summaries([ref])[ref]})
