"""The tour: the home page (one card per lesson, each with a live figure) and the lessons' source files."""
from flask import Blueprint, render_template

from core.errors import found
from tour import service

bp = Blueprint("tour", __name__)


@bp.get("/")
def home():
    """The tour of the lessons."""
    return render_template("tour/home.html", lessons=service.LESSONS, figures=service.figures())


@bp.get("/source/<path:path>")
def source(path):
    """One of the lessons' source files, as text."""
    text = found(service.read_source(path), f"{path!r} is not one of the app's source files.", "no_such_source")
    return render_template("tour/source.html", path=path, lines=text.splitlines())
