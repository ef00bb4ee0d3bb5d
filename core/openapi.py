"""The OpenAPI 3.1 document of the JSON API, merged once per process from core/openapi.yaml and the openapi.yaml beside
each registered blueprint, served at GET /api/openapi.json. Written by hand beside the code it describes (the views
validate in the services: nothing for a generator to read); the tests validate every /api response against it.
"""
from pathlib import Path
from typing import Any

import yaml

FILE = "openapi.yaml"
# docs/api.md's conventions, true of every operation: a refused request is a 4xx with the error shape and writes
# nothing; 503 when Datastore does not answer (or contention outlasts the retries).
ERRORS = {"4XX": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}


def _merge(into: dict, part: dict, where: str) -> None:
    for name, value in part.items():
        if name in into:
            raise ValueError(f"OpenAPI: {where}/{name} is defined twice")
        into[name] = value


def _extend(schemas: dict, extensions: dict, where: str) -> None:
    """A part's `x-extends`: properties and required fields it adds to a schema another part defines, the way a
    feature adds to another's JSON through a hook (comments to the blog's entries) without that part naming it."""
    for name, extension in extensions.items():
        if name not in schemas:
            raise ValueError(f"OpenAPI: {where} extends {name}, which no registered part defines")
        _merge(schemas[name].setdefault("properties", {}), extension.get("properties", {}), f"{name}/properties")
        schemas[name].setdefault("required", []).extend(extension.get("required", []))


def build(app: Any) -> dict:
    """The document for `app`: core's part, then each blueprint's, in the order they were registered."""
    core = Path(__file__).parent
    document = yaml.safe_load((core / FILE).read_text(encoding="utf-8"))
    extensions = []
    for folder in dict.fromkeys(Path(blueprint.root_path) for blueprint in app.blueprints.values()):  # each once
        path = folder / FILE
        part = yaml.safe_load(path.read_text(encoding="utf-8")) if folder != core and path.exists() else None
        if not part:
            continue
        _merge(document["paths"], part.get("paths", {}), "paths")
        for section, entries in part.get("components", {}).items():
            _merge(document["components"].setdefault(section, {}), entries, f"components/{section}")
        extensions.append((folder.name, part.get("x-extends", {})))
    for where, extension in extensions:
        _extend(document["components"]["schemas"], extension, where)
    for operations in document["paths"].values():
        for operation in operations.values():
            for status, response in ERRORS.items():
                operation["responses"].setdefault(status, response)
    return document
