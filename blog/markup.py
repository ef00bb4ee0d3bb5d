"""Entry bodies: Markdown rendered by markdown-it-py, then sanitized by nh3 (Rust's ammonia), so that no HTML a user
typed, and no `javascript:` or `data:` URL, reaches a page: the sanitizer, not the renderer, makes the output safe.
markdown-it-py renders in time linear in the text (issue 57: docs/security.md).
"""
import nh3
from markdown_it import MarkdownIt

TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "code", "em", "strong", "del",
    "ul", "ol", "li", "a", "img", "table", "thead", "tbody", "tr", "th", "td", "sup", "sub",
}
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "th": {"align"}, "td": {"align"}}
URL_SCHEMES = {"http", "https", "mailto"}  # relative URLs stay allowed; every other scheme is dropped


class _Renderer(MarkdownIt):
    """markdown-it-py would leave a `javascript:` link as its literal text; here the link is kept and nh3 drops its
    URL, so one place (URL_SCHEMES) decides which URLs a page may carry."""

    def validateLink(self, url: str) -> bool:  # markdown-it-py's name
        return True


# CommonMark with raw HTML (dropped or kept by nh3 below, as before) and tables; fenced code is CommonMark's own.
_RENDERER = _Renderer("commonmark", {"html": True}).enable("table")


def render_markdown(text: str) -> str:
    """Safe HTML for Markdown `text`."""
    html = _RENDERER.render(text)
    return nh3.clean(html, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="nofollow noopener noreferrer").strip()
