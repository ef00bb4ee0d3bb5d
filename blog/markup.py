"""Entry bodies: Markdown rendered by markdown-it-py, then sanitized by nh3 (Rust's ammonia), so that no HTML a user
typed, and no link or image to a `javascript:` or `data:` URL, ever reaches a page. Markdown passes raw HTML through
by design; the sanitizer, not the renderer, is what makes the output safe, and it runs on every render.

markdown-it-py, not Python-Markdown: Python-Markdown's inline patterns are regular expressions run again over what is
left, and an unclosed bracket makes them scan the rest of the text once per bracket: a body of 6,000 `[` took
11.6 s, 12,000 took 41 s, and the 100,000 characters an entry may hold would take most of an hour of one thread
(issue 57). markdown-it-py parses in one pass with a bounded nesting depth (its `maxNesting`), as CommonMark's
reference parsers do: time grows with the text's length (tests/test_blog.py measures the growth).
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
