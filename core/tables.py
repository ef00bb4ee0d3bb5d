"""Markdown tables read back: the benchmarks write their results as markdown (bench/results/*.md), and the planner
(and the tests that hold it to them) read the figures from there rather than copying them."""


def markdown_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """{section heading ("## ..."): [each table row under it as {column: cell}]}; the tables of one section in
    order, one after another."""
    found: dict[str, list[dict[str, str]]] = {}
    heading, header = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            heading, header = line[3:], None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|- "):  # not the line under the header
                found.setdefault(heading, []).append(dict(zip(header, cells, strict=True)))
        else:
            header = None
    return found

