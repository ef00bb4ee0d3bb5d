"""The blog, the second lesson: service.py (posting by a transactional index, pages by index), models.py (with
EntryRef, an entry's identity), pages.py (its HTML pages and the hook other features add to entries through),
views.py (/blog and /api/blogs); beside them validate.py, entries.py, view_counts.py and markup.py.
"""
from flask import Flask

from blog import demo, pages, production, views
from core import features


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    pages.init_app(app)
    features.add(app, features.Feature(
        name="blog", nav=("blog.blogs", "Blog"),
        lesson=features.Lesson(
            slug="blog", title="2. A blog paged by index", sources=("blog/service.py", "blog/models.py"),
            figure=demo.figure, card="blog/_lesson.html", caveats=production.CAVEATS),
        seed=demo.seed))
