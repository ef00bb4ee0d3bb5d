"""The blog's HTML pages, and the hook through which other features add to its entries: a feature that has something
to say about every entry (comments: a count, a section under the entry, a field in its JSON) registers an `EntryAddon`
from its own init_app. The blog never imports them: dependencies run one way, comments -> blog -> counters.
"""
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app, render_template
from markupsafe import Markup

from blog import entries, service, view_counts
from blog.models import EntryRef
from core.fragments import Fragments

EXTENSION = "blog.entry_addons"
FRAGMENTS = "blog.fragments"  # the rendered pages of entries, per process (core/fragments.py)


@dataclass(frozen=True)
class EntryAddon:
    name: str
    # {ref: {field: value}} for a page of entries: one call per page (one memcached round trip, not one per entry).
    # The fields join each entry's JSON and are what `meta_template` and `section` are given.
    summaries: Callable[[list[EntryRef]], dict[EntryRef, dict[str, Any]]]
    # A partial for each entry's meta line, given `ref`, `summary` and `on_entry_page`.
    meta_template: str | None = None
    # (ref, summary, state) -> the HTML under the entry on its page. `state` is what the addon's own route passed to
    # render_entry (comments: the refused form, to show again), else None.
    section: Callable[[EntryRef, dict[str, Any], Any], str] | None = None


def add_entry_addon(app: Flask, addon: EntryAddon) -> None:
    app.extensions.setdefault(EXTENSION, []).append(addon)


def _addons() -> list[EntryAddon]:
    return current_app.extensions.get(EXTENSION, [])


def summaries(refs: list[EntryRef]) -> dict[EntryRef, dict[str, Any]]:
    """{ref: the fields every addon has for it}."""
    merged: dict[EntryRef, dict[str, Any]] = {ref: {} for ref in refs}
    for addon in _addons():
        for ref, fields in addon.summaries(refs).items():
            merged[ref].update(fields)
    return merged


def init_app(app: Flask) -> None:
    app.extensions[FRAGMENTS] = Fragments()


def render_index(blog: str, page: service.BlogPage, form: Mapping[str, str] | None = None) -> str:
    refs = [EntryRef(blog, e["index"]) for e in page.items]
    shown = summaries(refs)
    # The page of entries rendered once per process for what it shows: an entry is never changed once posted, so its
    # blog and index name its content, and the addons' figures (comment counts) are in the key as they are now.
    key = (blog, tuple(ref.index for ref in refs), tuple(tuple(sorted(shown[ref].items())) for ref in refs))
    entries_html = current_app.extensions[FRAGMENTS].get_or_render(key, lambda: Markup(render_template(
        "blog/_entries.html", blog=blog, page=page, refs=refs, summaries=shown, addons=_addons())))
    return render_template("blog/index.html", blog=blog, page=page, form=form or {}, entries_html=entries_html)


def render_entry(ref: EntryRef, status: int = 200, state: dict[str, Any] | None = None) -> tuple[str, int]:
    """The entry page, with each addon's section below the entry; `state` ({addon name: its state}) lets an addon's
    own route show the page again after refusing its input, with `status`."""
    entry = entries.require_entry(ref)
    summary = summaries([ref])[ref]
    sections = [addon.section(ref, summary, (state or {}).get(addon.name)) for addon in _addons() if addon.section]
    return render_template("blog/entry.html", blog=ref.blog, entry=entry, ref=ref, views=view_counts.view_count(ref),
                           max_index=service.require_blog(ref.blog).max_index,
                           views_counter=view_counts.views_counter(ref), summary=summary, addons=_addons(),
                           sections=sections), status
