"""Comments, the third lesson: service.py (the operations), models.py, bookmarks.py (a page's bookmark and the reader's
own comments), recount.py (the repair job), views.py (their section under each entry, the form, /api/.../comments).
Comments build on the blog and the counters; neither knows them.
"""
from flask import Flask

from blog import pages as blog_pages
from comments import demo, production, recount, views
from core import features
from mapper import jobs as mapper_jobs


def init_app(app: Flask) -> None:
    app.register_blueprint(views.bp)
    blog_pages.add_entry_addon(app, views.ENTRY_ADDON)
    mapper_jobs.register(app, recount.RECOUNT)
    features.add(app, features.Feature(
        name="comments",
        lesson=features.Lesson(
            slug="comments", title="3. Comments by composite key",
            sources=("comments/service.py", "comments/models.py"), figure=demo.figure, card="comments/_lesson.html",
            caveats=production.CAVEATS),
        seed=demo.seed))
