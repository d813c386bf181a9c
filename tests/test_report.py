"""``privaudit report`` end to end: what a new user runs (attack, audit, mia, compare, claims
on tiny settings), then the report of each — one self-contained HTML page, checked
structurally (every image a PNG that decodes, every table with its rows, no external URL)
and in a real headless browser (Chromium, as the PyQt6-WebEngine wheels ship it: a
screenshot that is not blank, images decoded and laid out inside the page) — with its
Markdown and LaTeX tables, and every bad input refused in one line."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

from privaudit.api.cache import code_identity

TINY = ["--agents", "3", "--no-progress"]
BROWSER = Path(__file__).with_name("browser.py")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What a new user's first commands write: an attack (which trains its run), an audit
    and membership inference (message level, and the model-level LOSS game) on that run, a
    comparison and a claims ledger."""
    from privaudit.cli import main

    root = tmp_path_factory.mktemp("outputs")
    out = {k: root / k for k in ("attack", "audit", "mia", "model", "compare", "claims")}
    run = out["attack"] / "run"
    argv = [
        ["attack", "--target", "dpdl-cg", "--round", "2", "--rounds", "3", "--batch-size", "2"]
        + ["--iterations", "4", "--no-lpips", "--out", str(out["attack"]), *TINY],
        ["audit", "--target", "dpdl-cg", "--run", str(run), "--trials", "64"]
        + ["--out", str(out["audit"]), "--no-progress"],
        ["mia", "--target", "dpdl-cg", "--run", str(run), "--messages", "2"]
        + ["--out", str(out["mia"]), "--no-progress"],
        ["mia", "--target", "dpdl-model", "--attack", "loss", "--round", "2", "--run", str(run)]
        + ["--out", str(out["model"]), "--no-progress"],
        ["compare", "--targets", "nd-cg,dpdl-cg", "--rounds", "2", "--victims", "2"]
        + ["--iterations", "2", "--batch-size", "1", "--out", str(out["compare"]), *TINY],
        ["claims", "--target", "nd-cg", "--rounds", "2", "--trials", "64"]
        + ["--out", str(out["claims"]), *TINY],
    ]
    for a in argv:
        assert main(a) == 0, a
    return out


class Structure(HTMLParser):
    """What a page holds: its images' sources, its tables (header and row widths), every
    attribute value, the tags used."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables: list[dict] = []
        self.values: list[str] = []
        self.tags: set[str] = set()
        self.row: list[str] | None = None
        self.where = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.add(tag)
        self.values += [v or "" for _, v in attrs]
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "table":
            self.tables.append({"header": 0, "rows": []})
        elif tag in ("thead", "tbody"):
            self.where = tag
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.row.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self.row is not None:
            if self.where == "thead":
                self.tables[-1]["header"] = len(self.row)
            else:
                self.tables[-1]["rows"].append(len(self.row))
            self.row = None


def check_page(path: Path) -> Structure:
    """The page's structure, asserted self-contained and whole."""
    text = path.read_text(encoding="utf-8")
    page = Structure()
    page.feed(text)
    assert page.tags.isdisjoint({"script", "link", "iframe", "object", "embed"})
    external = [v for v in page.values if "://" in v or v.startswith("//")]
    assert external == [] and "url(" not in text
    for src in page.images:
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        with Image.open(io.BytesIO(base64.b64decode(data))) as im:
            im.load()  # the whole image decodes
            assert im.format == "PNG" and im.size[0] > 50 and im.size[1] > 50
    for t in page.tables:
        assert t["rows"] and all(n == t["header"] for n in t["rows"]), t
    assert code_identity() in text
    return page


def report(capsys, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "report", *argv)


def test_report_of_an_attack_is_one_self_contained_page(outputs, capsys) -> None:
    folder = outputs["attack"]
    code, out, err = report(capsys, str(folder), "--markdown", "--latex")
    assert code == 0, err
    assert out.strip().endswith(f"{folder / 'report.tex'}") and "attack report" in out
    page = check_page(folder / "report.html")
    grid = base64.b64decode(page.images[0].split(",", 1)[1])
    assert grid == (folder / "grid.png").read_bytes()  # the attack's own grid, inlined
    html = (folder / "report.html").read_text()
    for text in ("Per victim", "0 → 1", "dpdl-cg", "Configuration of the run", "Versions"):
        assert text in html
    md, tex = (folder / "report.md").read_text(), (folder / "report.tex").read_text()
    rules = [line for line in md.splitlines() if line.startswith("|---|")]
    assert len(rules) == tex.count(r"\begin{tabular}") == len(page.tables)
    assert r"$\varepsilon$" in tex and "ε" not in tex and r"\_" in tex  # escaped for LaTeX
    # a rerun replaces its own files; a user's file of the same name is refused
    assert report(capsys, str(folder))[0] == 0
    (folder / "report.md").write_text("my notes")
    code, _, err = report(capsys, str(folder), "--markdown")
    assert code == 2 and err.count("\n") == 1 and err.startswith("privaudit: error: --out")
    assert "--overwrite" in err and (folder / "report.md").read_text() == "my notes"
    assert report(capsys, str(folder), "--markdown", "--overwrite")[0] == 0


def test_report_of_an_audit_shows_verdicts_evidence_and_the_dp_region(outputs, capsys) -> None:
    folder = outputs["audit"]
    assert report(capsys, str(folder / "audit.json"))[0] == 0  # a result file names its folder
    page = check_page(folder / "report.html")
    html = (folder / "report.html").read_text()
    audit = json.loads((folder / "audit.json").read_text())
    assert "Verdicts" in html and "Evidence" in html and audit["verdict"] in html
    assert "beyond what (ε = " in html and len(page.images) == 1  # the ROC, with its region
    assert f"<td>{audit['trials']}</td>" in html


def test_report_of_a_membership_inference_states_its_power(outputs, capsys) -> None:
    folder = outputs["mia"]
    assert report(capsys, str(folder))[0] == 0
    page = check_page(folder / "report.html")
    html = (folder / "report.html").read_text()
    assert "not measurable (resolves" in html  # 4 non-members cannot resolve 0.1 % FPR
    assert "Per observed message" in html and len(page.images) == 1
    folder = outputs["model"]  # the model-level game: one row per score of scores.csv
    assert report(capsys, str(folder))[0] == 0
    page = check_page(folder / "report.html")
    result = json.loads((folder / "result.json").read_text())
    html = (folder / "report.html").read_text()
    assert all(f"<td>{name}</td>" in html for name in result["scores"])
    assert len(page.images) == 1 and len(page.tables[0]["rows"]) == len(result["scores"])


def test_report_of_a_comparison_and_of_a_ledger(outputs, capsys) -> None:
    folder = outputs["compare"]
    assert report(capsys, str(folder))[0] == 0
    page = check_page(folder / "report.html")
    shown = sorted(p.name for p in folder.glob("*.png"))
    assert len(page.images) == len(shown) >= 2  # privacy–utility, sweep (and the grid)
    html = (folder / "report.html").read_text()
    assert "privacy vs utility" not in html or "Privacy against utility" in html
    assert "Summary: one row per" in html and "Every attacked cell" in html
    folder = outputs["claims"]
    assert report(capsys, str(folder), "--latex")[0] == 0
    check_page(folder / "report.html")
    html = (folder / "report.html").read_text()
    ledger = json.loads((folder / "ledger.json").read_text())
    assert "The ledger" in html and "Evidence behind each audit" in html
    for row in ledger["rows"]:
        assert f"<td>{row['target']}</td>" in html and row["accounting"]["verdict"] in html


def test_report_of_a_run_folder_needs_its_own_out(outputs, capsys, tmp_path) -> None:
    run = outputs["attack"] / "run"
    code, _, err = report(capsys, str(run))
    assert code == 2 and "run folder" in err and "--out DIR" in err
    assert not (run / "report.html").exists()
    code, _, err = report(capsys, str(run), "--out", str(tmp_path / "r"))
    assert code == 0, err
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Privacy accounting" in html and "checkpoints" in html
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    code, _, err = report(capsys, str(run), "--out", str(mine))
    assert code == 2 and "already holds files" in err and not (mine / "report.html").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "none", "does not exist; give the --out folder of privaudit attack"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file, not a folder"),
        (lambda p: p, "holds no privaudit result"),
        (lambda p: (p / "result.json").write_text("{oops") and p, "cannot read"),
        (lambda p: (p / "summary.csv").write_text("target\n") and p, "did not finish"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(make, message, tmp_path, capsys) -> None:
    code, out, err = report(capsys, str(make(tmp_path)))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("privaudit: error: ") and message in err
    assert not (tmp_path / "report.html").exists()


def _browser_missing() -> bool:
    try:
        return importlib.util.find_spec("PyQt6.QtWebEngineWidgets") is None
    except ModuleNotFoundError:
        return True


@pytest.mark.skipif(
    _browser_missing(),
    reason="no headless browser: PyQt6-WebEngine (its Chromium) is not installed "
    "(pip install -e .[dev])",
)
@pytest.mark.parametrize("kind", ["attack", "compare"])
def test_report_renders_in_a_headless_browser(outputs, kind, capsys, tmp_path) -> None:
    folder = outputs[kind]
    assert report(capsys, str(folder), "--overwrite")[0] == 0
    page = check_page(folder / "report.html")
    shot, width = tmp_path / "shot.png", 1000
    proc = subprocess.run(
        [sys.executable, str(BROWSER), str(folder / "report.html"), str(shot), str(width)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loaded"] and got["screenshot"]
    # every image decoded by the browser at its PNG's own size, inside the page, none
    # overlapping the next; no horizontal scrolling; every table with its rows
    sizes = [Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))).size for s in page.images]
    assert [(i["naturalWidth"], i["naturalHeight"]) for i in got["images"]] == sizes
    assert all(i["complete"] and 0 <= i["left"] < i["right"] <= width for i in got["images"])
    boxes = sorted((i["top"], i["bottom"]) for i in got["images"])
    assert all(a[1] <= b[0] for a, b in zip(boxes, boxes[1:], strict=False))
    assert got["scrollWidth"] <= width
    assert [t["rows"] for t in got["tables"]] == [len(t["rows"]) for t in page.tables]
    assert all(t["right"] <= width for t in got["tables"])
    heads = got["headings"]
    assert heads[0]["tag"] == "H1" and kind in heads[0]["text"]
    tops = [h["top"] for h in heads]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)
    # the screenshot: the whole page, not blank, each image painted where the layout put it
    with Image.open(shot) as im:
        assert im.size[0] == width and im.size[1] >= min(got["height"], 16000) - 1
        pixels = np.asarray(im.convert("L"), dtype=float)
    assert (pixels < 250).mean() > 0.02 and pixels.std() > 10
    for i in got["images"]:
        box = pixels[
            int(i["top"]) + 2 : int(i["bottom"]) - 2, int(i["left"]) + 2 : int(i["right"]) - 2
        ]
        assert box.size and box.std() > 5, i  # a painted figure, not white space
    assert pixels[: int(tops[1]), :].min() < 100  # the title's dark text at the top
