"""Published numbers come from the figures command, never from an editor.

Every generated block of README.md and docs/*.md holds exactly the file it names (written by
``python benchmarks/figures.py``), every file under figures/ belongs to one of its jobs, and
every job the manifest records wrote the files it lists."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from figures import BLOCK, DOCS, FIGURES, JOBS, MANIFEST, ROOT, elsewhere  # noqa: E402


def test_every_generated_block_is_its_file():
    blocks = [(doc, m) for doc in DOCS for m in BLOCK.finditer(doc.read_text())]
    assert blocks, "the docs show no generated table"
    jobs = {j.name: j for j in JOBS}
    for doc, m in blocks:
        assert m["job"] in jobs, f"{doc.name}: unknown job {m['job']}"
        assert m["file"].removeprefix("figures/") in jobs[m["job"]].files, (doc.name, m["file"])
        want = (ROOT / m["file"]).read_text()
        assert m["body"].rstrip("\n") == want.rstrip("\n"), (
            f"{doc.relative_to(ROOT)}: the block of {m['file']} was edited or is stale; "
            "run python benchmarks/figures.py"
        )


def test_the_figures_run_on_this_checkouts_code_alone():
    """Every package of privaudit this process imports is this checkout's (a worktree run
    through another checkout's editable install would mix two versions of the code)."""
    assert elsewhere() == []


def test_every_figure_belongs_to_a_job_and_the_manifest_holds():
    manifest = json.loads(MANIFEST.read_text())
    made = {f for j in JOBS for f in j.files} | {f for e in manifest.values() for f in e["files"]}
    files = {
        str(p.relative_to(FIGURES))
        for p in FIGURES.rglob("*")
        if p.is_file() and p != MANIFEST and p.suffix != ".pdf"
    }
    assert files <= made, f"not written by benchmarks/figures.py: {sorted(files - made)}"
    for name, entry in manifest.items():
        assert name in {j.name for j in JOBS}
        assert all((FIGURES / f).is_file() for f in entry["files"])
        assert entry["command"].startswith(("privaudit ", "python benchmarks/"))
        assert entry["code"].startswith("privaudit ")


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add("".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-"))
    return out


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []
