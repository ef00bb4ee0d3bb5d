"""The features an app is built from, as each one's `init_app` describes itself (`add`): its nav entry, its lesson
(title, source files, live figure on the tour) and its demo content. Nothing registers by being imported; the tour,
the nav and `flask seed` read this registry instead of naming features themselves."""
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Caveat:
    """How production (Firestore in Datastore mode, today) differs from the lesson as 2008 taught it: the fact, the
    Google page that states it, and what this app does about it (changed code, or a limit it states)."""
    fact: str
    source: str
    app: str


@dataclass(frozen=True)
class Lesson:
    slug: str
    title: str
    sources: tuple  # the files the lesson is about, shown on its tour card
    figure: Callable[[], dict | None]  # its live figure for the tour, read the way the lesson teaches; None: no demo
    card: str  # the template of its card on the tour, given `lesson` and its figure `f`
    caveats: tuple = ()  # its "In production today" part (Caveat), on its page and in the README


@dataclass(frozen=True)
class Feature:
    name: str  # its package: every .py file in its folder is readable at /source/<path>
    nav: tuple | None = None  # (endpoint, label) in the top navigation
    lesson: Lesson | None = None
    seed: Callable[[], bool] | None = None  # adds its demo content where there is none yet -> whether it did


@dataclass
class Features:
    """app.extensions["features"]: the features in the order they were added (the order of `create_app`'s list)."""
    all: list | tuple = field(default_factory=list)  # a tuple once complete: `add` refuses then
    # Set by `complete`, once all are added: what every page and the tour use, derived once per process.
    source_files: frozenset = frozenset()
    navigation: tuple = ()
    lesson_index: dict = field(default_factory=dict)

    def complete(self) -> None:
        self.all = tuple(self.all)
        self.navigation = tuple(f.nav for f in self.all if f.nav)
        self.lesson_index = {f.lesson.slug: f.lesson for f in self.all if f.lesson}
        # The files a visitor may read at /source/: a fixed set, found once, so no path a visitor types reaches
        # anything else.
        self.source_files = frozenset(
            str(p.relative_to(REPO)) for folder in ["core", *(f.name for f in self.all)]
            for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"
        ) | {"index.yaml", "app.yaml", "queue.yaml", "main.py"}

    def caveats(self, slug: str) -> tuple:
        """The lesson's "In production today" caveats (none for an unknown slug): templates/_in_production.html."""
        lesson = self.lesson_index.get(slug)
        return lesson.caveats if lesson else ()


def of(app: Any) -> Features:
    return app.extensions.setdefault("features", Features())


def add(app: Any, feature: Feature) -> None:
    features = of(app)
    if isinstance(features.all, tuple):
        raise RuntimeError(f"feature {feature.name!r} added after the app's features were completed")
    features.all.append(feature)
