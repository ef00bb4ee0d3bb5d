"""The tour: the home page (one card per lesson, each with a live figure) and the app's source files."""
from flask import Blueprint, current_app, redirect, render_template, url_for
from flask.typing import ResponseReturnValue

from core import features
from core.errors import found
from tour import service

bp = Blueprint("tour", __name__)


@bp.get("/")
def home() -> ResponseReturnValue:
    lessons = features.of(current_app).lesson_index
    figures = {slug: lesson.figure() for slug, lesson in lessons.items()}  # None: no demo content yet
    return render_template("tour/home.html", lessons=lessons, figures=figures)


@bp.get("/tour")
@bp.get("/source")
@bp.get("/source/")
def tour_again() -> ResponseReturnValue:
    """Addresses a visitor guesses for the tour and the source files: the tour, whose cards list each lesson's."""
    return redirect(url_for("tour.home"))


@bp.get("/comments")
def comments_lesson() -> ResponseReturnValue:
    """The comments lesson has no page of its own (comments live on an entry's page): its card on the tour."""
    return redirect(url_for("tour.home", _anchor="lesson-comments"))


@bp.get("/source/<path:path>")
def source(path: str) -> ResponseReturnValue:
    """One of the app's source files, as text."""
    text = found(service.read_source(path, features.of(current_app).source_files),
                 f"{path!r} is not one of the app's source files.", "no_such_source")
    return render_template("tour/source.html", path=path, lines=text.splitlines())
