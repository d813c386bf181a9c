"""Open an HTML file in a real headless browser — Chromium, as Qt WebEngine ships it in the
PyQt6-WebEngine wheels (the dev extra) — and report its layout as the browser computed it,
with a screenshot of the whole page.

Run as a program (its own process: Qt wants the main thread and one application per
process): ``python tests/browser.py PAGE.html SHOT.png [WIDTH]``. Prints one JSON object:
the viewport width, the page's scroll width and height, each image's decoded size and box,
each table's row count and box, each heading's text and top; writes the screenshot. Exit 3
when the page did not load.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no display
os.environ.setdefault("QTWEBENGINE_DISABLE_SANDBOX", "1")  # root in CI: no user namespace
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--disable-gpu --disable-logging")

from PyQt6.QtCore import QSize, QTimer, QUrl  # noqa: E402
from PyQt6.QtWebEngineWidgets import QWebEngineView  # noqa: E402
from PyQt6.QtWidgets import QApplication  # noqa: E402

MEASURE = """JSON.stringify({
  width: window.innerWidth,
  scrollWidth: document.documentElement.scrollWidth,
  height: document.documentElement.scrollHeight,
  images: Array.from(document.images).map(i => {const r = i.getBoundingClientRect();
    return {complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight,
            left: r.left, right: r.right, top: r.top + window.scrollY,
            bottom: r.bottom + window.scrollY};}),
  tables: Array.from(document.querySelectorAll('table')).map(t => {
    const r = t.getBoundingClientRect();
    return {rows: t.tBodies.length ? t.tBodies[0].rows.length : 0, left: r.left, right: r.right,
            top: r.top + window.scrollY, bottom: r.bottom + window.scrollY};}),
  headings: Array.from(document.querySelectorAll('h1, h2')).map(h => ({tag: h.tagName,
    text: h.textContent, top: h.getBoundingClientRect().top + window.scrollY})),
})"""
MAX_HEIGHT = 16000  # the screenshot's height at most (pixels)


def main(page: Path, shot: Path, width: int) -> int:
    app = QApplication(sys.argv[:1])
    view = QWebEngineView()
    view.resize(QSize(width, 900))
    result: dict = {"loaded": False}

    def loaded(ok: bool) -> None:
        result["loaded"] = ok
        if not ok:
            app.quit()
            return
        QTimer.singleShot(300, lambda: view.page().runJavaScript(MEASURE, measured))

    def measured(doc: str) -> None:
        result.update(json.loads(doc))
        view.resize(QSize(width, min(int(result["height"]), MAX_HEIGHT)))
        QTimer.singleShot(2000, lambda: view.page().runJavaScript(MEASURE, grab))

    def grab(doc: str) -> None:
        result.update(json.loads(doc))  # the boxes as the full-height view lays them out
        result["screenshot"] = view.grab().save(str(shot), "PNG")
        app.quit()

    view.loadFinished.connect(loaded)
    view.load(QUrl.fromLocalFile(str(page.resolve())))
    view.show()
    QTimer.singleShot(60_000, app.quit)  # a page that never loads ends the run
    app.exec()
    print(json.dumps(result))
    return 0 if result["loaded"] else 3


if __name__ == "__main__":
    sys.exit(
        main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1000)
    )
