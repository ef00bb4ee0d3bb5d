"""Entry bodies: Markdown rendered by Python-Markdown, then sanitized by nh3 (Rust's ammonia), so that no HTML a user
typed, and no link or image to a `javascript:` or `data:` URL, ever reaches a page. Markdown passes raw HTML through
by design; the sanitizer, not the renderer, is what makes the output safe, and it runs on every render.
"""
import markdown
import nh3

TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "code", "em", "strong", "del",
    "ul", "ol", "li", "a", "img", "table", "thead", "tbody", "tr", "th", "td", "sup", "sub",
}
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "th": {"align"}, "td": {"align"}}
URL_SCHEMES = {"http", "https", "mailto"}  # relative URLs stay allowed; every other scheme is dropped
EXTENSIONS = ["fenced_code", "tables", "sane_lists"]


def render_markdown(text: str) -> str:
    """Safe HTML for Markdown `text`."""
    html = markdown.markdown(text, extensions=EXTENSIONS, output_format="html")
    return nh3.clean(html, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="nofollow noopener noreferrer")
