"""Comments: their section under each entry (the blog's EntryAddon hook), the comment form, their /api routes."""
import re
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, jsonify, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup, escape

from blog import pages as blog_pages
from blog import service as blog_service
from blog.models import EntryRef
from comments import service
from core import budget, idempotency, identity
from core.errors import AppError
from core.web import body_limit, form_refused, json_body, text_body_bytes

bp = Blueprint("comments", __name__)
URL = re.compile(r"https?://[^\s<>\"']+")
TRAILING = ".,;:!?)]}'\""
RECENT_SESSION_KEY = "recent_comments"  # the ids of a person's latest comments, kept in their session cookie
RECENT_KEEP = 5
COMMENT_BODY_BYTES = text_body_bytes(service.TEXT_MAX)


@bp.app_template_filter()
def linkify(text: str) -> Markup:
    """Plain comment text as HTML: everything escaped, http(s) URLs (only those: `javascript:` stays text) made links
    that cannot pass on the page's authority."""
    out: list[Markup] = []
    last = 0
    for match in URL.finditer(text):
        url = match.group(0).rstrip(TRAILING)
        out += [escape(text[last:match.start()]),
                Markup('<a href="{0}" rel="nofollow noopener noreferrer">{0}</a>').format(url)]
        last = match.start() + len(url)
    out.append(escape(text[last:]))
    return Markup("").join(out)


def _remember(comment: dict[str, Any]) -> None:
    """Keep the id of the person's new comment in their session, so pages show it at once (service.get_comments)."""
    recent = [c for c in session.get(RECENT_SESSION_KEY, []) if c != comment["id"]]
    session[RECENT_SESSION_KEY] = (recent + [comment["id"]])[-RECENT_KEEP:]


def _summaries(refs: list[EntryRef]) -> dict[EntryRef, dict[str, Any]]:
    return {ref: {"comment_count": n} for ref, n in service.comment_counts(refs).items()}


def _section(ref: EntryRef, summary: dict[str, Any], form: Mapping[str, str] | None) -> str:
    """An entry's comments on its page (?after=, ?before=, ?page=last), and the form, refilled after a refusal."""
    args = request.args
    page = service.get_comments(ref, args.get("after"), args.get("before"), last=args.get("page") == "last",
                                own=session.get(RECENT_SESSION_KEY, ()))
    return Markup(render_template("comments/_section.html", ref=ref, comments=page,
                                  comment_count=summary["comment_count"], comment_form=form or {},
                                  comment_max=service.TEXT_MAX))


ENTRY_ADDON = blog_pages.EntryAddon(name="comments", summaries=_summaries, meta_template="comments/_meta.html",
                                    section=_section)


@bp.post("/blog/<blog>/<int:index>/comments")
@body_limit(COMMENT_BODY_BYTES)
def post_form(blog: str, index: int) -> ResponseReturnValue:
    """A signed-in person's comment from the form under an entry."""
    user = identity.require_user()
    budget.spend(user["id"], "comments")
    ref = blog_service.entry_ref(blog, index)
    try:
        comment = service.post_comment(ref, user, request.form.get("text", ""),
                                       request.form.get("comment_token") or None)
    except AppError as e:
        return form_refused(e, lambda status: blog_pages.render_entry(ref, status, state={"comments": request.form}))
    _remember(comment)
    return redirect(url_for("blog.entry", blog=blog, index=index, page="last") + "#comments-end")


@bp.post("/api/blogs/<blog>/entries/<index>/comments")
@body_limit(COMMENT_BODY_BYTES)
def api_post(blog: str, index: str) -> ResponseReturnValue:
    """Signed in: {"text": 1..2000 characters} comments on the entry, at most once per Idempotency-Key."""
    user = identity.require_user()
    budget.spend(user["id"], "comments")
    comment, replayed = service.commented(blog_service.entry_ref(blog, index), user, json_body().get("text"),
                                          request.headers.get("Idempotency-Key"))
    _remember(comment)
    return idempotency.marked(jsonify(comment), replayed), 201


@bp.get("/api/blogs/<blog>/entries/<index>/comments")
def api_list(blog: str, index: str) -> ResponseReturnValue:
    """A page of the entry's comments, oldest first: ?after=<id> or ?before=<id>, ?limit=1..100, ?page=last: newest."""
    args = request.args
    page = service.get_comments(blog_service.entry_ref(blog, index), args.get("after"), args.get("before"),
                                args.get("limit"), last=args.get("page") == "last",
                                own=session.get(RECENT_SESSION_KEY, ()))
    return jsonify(comments=page.items, next=page.next, prev=page.prev)
