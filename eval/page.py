"""A report as data — a title, sections of text, tables, figures and preformatted blocks —
and the three ways it is written: one self-contained HTML page (figures inlined as base64
PNG, the style inline: no external asset, it opens offline and travels as one file), and
the same text and tables as Markdown and as LaTeX (``tabular`` with booktabs rules) to
paste into a paper.

Nothing here reads results or draws: :mod:`privaudit.api.report` builds a :class:`Page`
from what a command wrote; these functions only format it.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

__all__ = ["Code", "Figure", "Page", "Section", "Table", "to_html", "to_latex", "to_markdown"]


@dataclass(frozen=True)
class Table:
    """Rows of cells under a header, every cell already a string; ``note`` below it."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""

    def __post_init__(self) -> None:
        for r in self.rows:
            if len(r) != len(self.header):
                raise ValueError(
                    f"table {self.caption!r}: a row of {len(r)} cells under "
                    f"{len(self.header)} columns"
                )


@dataclass(frozen=True)
class Figure:
    """A PNG image (its bytes) with its caption and the file it came from."""

    caption: str
    png: bytes
    name: str = ""


@dataclass(frozen=True)
class Code:
    """Preformatted text (a configuration, versions), shown as it is."""

    caption: str
    text: str


Item = str | Table | Figure | Code  # a str is a paragraph


@dataclass
class Section:
    """A heading and its items, in order."""

    heading: str
    items: list[Item] = field(default_factory=list)


@dataclass
class Page:
    """A report: a title, a line saying what it reports on, and its sections."""

    title: str
    subtitle: str
    sections: list[Section] = field(default_factory=list)

    def tables(self) -> list[Table]:
        """Every table of the page, in order."""
        return [i for s in self.sections for i in s.items if isinstance(i, Table)]


# --------------------------------------------------------------------------- HTML

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1100px;padding:1.5rem;color:#1a1a1a;line-height:1.45}
h1{font-size:1.5rem;margin:0 0 .2rem} .sub{color:#555;margin:0 0 1.5rem}
h2{font-size:1.15rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0 1.2rem;font-size:.85rem;display:block;
overflow-x:auto;max-width:100%}
caption{text-align:left;font-weight:600;padding:.2rem 0}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3} tbody tr:nth-child(even){background:#fafafa}
figure{margin:.8rem 0 1.4rem} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85rem;color:#444} .note{font-size:.8rem;color:#555}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.78rem}
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    note = f'<p class="note">{_e(t.note)}</p>' if t.note else ""
    return (
        f"<table><caption>{_e(t.caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>{note}"
    )


def _html_item(item: Item) -> str:
    if isinstance(item, Table):
        return _html_table(item)
    if isinstance(item, Figure):
        data = base64.b64encode(item.png).decode("ascii")
        return (
            f'<figure><img alt="{_e(item.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(item.caption)}</figcaption></figure>"
        )
    if isinstance(item, Code):
        return f'<p class="note">{_e(item.caption)}</p><pre>{_e(item.text)}</pre>'
    return f"<p>{_e(item)}</p>"


def to_html(page: Page) -> str:
    """``page`` as one self-contained HTML document: figures inlined as base64 PNG, the
    style inline, no script and no external URL."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(page.title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(page.title)}</h1>",
        f'<p class="sub">{_e(page.subtitle)}</p>',
    ]
    for s in page.sections:
        parts.append(f"<section><h2>{_e(s.heading)}</h2>")
        parts += [_html_item(i) for i in s.items]
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- Markdown


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> str:
    lines = [f"**{t.caption}**", ""]
    lines.append("| " + " | ".join(_md_cell(h) for h in t.header) + " |")
    lines.append("|" + "---|" * len(t.header))
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(lines) + (f"\n\n{t.note}" if t.note else "")


def to_markdown(page: Page) -> str:
    """``page``'s text and tables as Markdown; a figure is named by its caption and the file
    it came from (the HTML page holds the image)."""
    parts = [f"# {page.title}", "", page.subtitle]
    for s in page.sections:
        parts += ["", f"## {s.heading}"]
        for item in s.items:
            if isinstance(item, Table):
                parts += ["", _md_table(item)]
            elif isinstance(item, Figure):
                where = f" (`{item.name}`)" if item.name else ""
                parts += ["", f"*Figure: {item.caption}*{where}"]
            elif isinstance(item, Code):
                parts += ["", item.caption, "", "```", item.text, "```"]
            else:
                parts += ["", item]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- LaTeX

# characters LaTeX treats as commands, and the symbols the tables print, in text mode
_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "ε": r"$\varepsilon$",
    "δ": r"$\delta$",
    "σ": r"$\sigma$",
    "μ": r"$\mu$",
    "∞": r"$\infty$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "±": r"$\pm$",
    "×": r"$\times$",
    "→": r"$\to$",
    "·": r"$\cdot$",
    "−": "-",
    "–": "--",
    "—": "---",
    "`": "",
}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX))


def latex_escape(text: str) -> str:
    """``text`` safe in a LaTeX table cell, its Greek letters and symbols as math."""
    return _LATEX_RE.sub(lambda m: _LATEX[m.group(0)], text)


def _tex_table(t: Table) -> str:
    cols = "l" * len(t.header)
    lines = [
        r"\begin{table}[ht]",
        r"\centering\small",
        rf"\caption{{{latex_escape(t.caption)}}}",
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in t.header) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(latex_escape(c) for c in r) + r" \\" for r in t.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if t.note:
        lines.append(rf"\par\footnotesize {latex_escape(t.note)}")
    lines.append(r"\end{table}")
    return "\n".join(lines)


def to_latex(page: Page) -> str:
    """``page``'s tables as LaTeX ``table`` floats (booktabs rules: ``\\usepackage{booktabs}``),
    one per table, each under a comment naming its section."""
    parts = [
        f"% {latex_escape(page.title)}: {latex_escape(page.subtitle)}",
        "% tables written by privaudit report; needs \\usepackage{booktabs}",
    ]
    for s in page.sections:
        for item in s.items:
            if isinstance(item, Table):
                parts += ["", f"% {s.heading}", _tex_table(item)]
    return "\n".join(parts) + "\n"
