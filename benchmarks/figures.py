"""Regenerate every published figure and table: ``figures/`` and the docs blocks that show them.

Each job is one command (a ``privaudit`` command or a benchmark) whose files land in
``figures/``; the Markdown table it writes is then copied, verbatim, into every block of
README.md and docs/*.md marked

    <!-- generated: figures/NAME.md (python benchmarks/figures.py --only JOB) -->
    …
    <!-- end generated -->

so that no published number is edited by hand (tests/test_published.py checks that every
block equals its file). ``figures/MANIFEST.json`` records, per job, the command, the code
that ran it (:func:`privaudit.api.cache.code_identity`), when and how long; every file in
``figures/`` belongs to a job there.

    python benchmarks/figures.py [--only compare,claims,…] [--data-root DIR]
                                 [--work privaudit-out/figures] [--list]
                                 [--decattack PATH --decattack-deps DIR]

Jobs that need MNIST (``--data-root`` with its t10k files) are skipped with a line without
it; the ``anchor`` job runs El Mrini et al.'s own code and is skipped without
``--decattack`` (its recipe: docs/threat-models.md). Each job resumes from its own
``--work`` folder (the commands cache their cells), so an interrupted regeneration picks up
where it stopped; a line per job says what it ran and how long it took.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from privaudit.api.cache import PACKAGES, code_identity

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"
MANIFEST = FIGURES / "MANIFEST.json"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(<!-- generated: (?P<file>\S+) \(python benchmarks/figures\.py --only (?P<job>\S+)\) -->\n)"
    r"(?P<body>.*?)(<!-- end generated -->)",
    re.S,
)
PRIVAUDIT = [sys.executable, "-m", "privaudit.cli"]
BENCH = [sys.executable]


@dataclass(frozen=True)
class Job:
    """One published result: ``argv`` (``{work}``, ``{data}``, ``{figures}``, ``{decattack}``
    and ``{decattack_deps}`` filled in) writes ``files`` (paths under figures/); ``mnist``: it
    needs --data-root; ``decattack``: a checkout of El Mrini et al.'s code (--decattack)."""

    name: str
    argv: list[str]
    files: list[str]
    mnist: bool = False
    decattack: bool = False  # it runs the anchor's code: needs --decattack
    copies: dict[str, str] = field(default_factory=dict)  # work file → figures file


JOBS = [
    Job(
        "headline",
        [*BENCH, "benchmarks/nd_vs_dpdl.py", "--figures", "{figures}"]
        + ["--markdown", "{figures}/headline.md"],
        ["headline.md", "nd-cg-b1-r200.png", "dpdl-cg-b1-r200.png"],
    ),
    Job(
        "compare",
        [*PRIVAUDIT, "compare", "--out", "{work}", "--figures", "{figures}/compare"]
        + ["--overwrite", "--no-progress"],
        ["compare/summary.md", "compare/grid-r1-eps1.png", "compare/grid-r50-eps1.png"]
        + ["compare/sweep-round-eps1.png", "compare/privacy-utility-r50.png"],
    ),
    Job(
        "claims",
        [*PRIVAUDIT, "claims", "--out", "{work}", "--markdown", "{figures}/claims.md"]
        + ["--overwrite", "--no-progress"],
        ["claims.md"],
    ),
    Job(
        "claims-sigma1",
        [*PRIVAUDIT, "claims", "--sigma", "1", "--out", "{work}"]
        + ["--markdown", "{figures}/claims-sigma1.md", "--overwrite", "--no-progress"],
        ["claims-sigma1.md"],
    ),
    Job(
        "audit",
        [*BENCH, "benchmarks/audit.py", "--markdown", "{figures}/audit.md", "--out", "{work}"],
        ["audit.md"],
    ),
    Job(
        "audit-pooled",
        [*BENCH, "benchmarks/audit.py", "--canaries", "256", "--markdown"]
        + ["{figures}/audit-pooled.md", "--out", "{work}"],
        ["audit-pooled.md"],
    ),
    Job(
        "audit-beyond",
        [*BENCH, "benchmarks/audit_beyond.py", "--markdown", "{figures}/audit-beyond.md"]
        + ["--out", "{work}"],
        ["audit-beyond.md"],
    ),
    Job(
        "anchor",
        [*BENCH, "benchmarks/anchor.py", "--decattack", "{decattack}", "--decattack-deps"]
        + ["{decattack_deps}", "--agents", "35", "--sets", "3"]
        + ["--markdown", "{figures}/anchor.md"],
        ["anchor.md"],
        decattack=True,
    ),
    Job(
        "distance",
        [*BENCH, "benchmarks/distance.py", "--figures", "{figures}/distance"]
        + ["--markdown", "{figures}/distance/distance.md", "--out", "{work}"],
        ["distance/distance.md", "distance/distance-dp-dpsgd.png"]
        + ["distance/distance-muffliato.png", "distance/distance-dsgd.png"],
    ),
    Job(
        "graphs-distance",
        [*BENCH, "benchmarks/distance.py", "--topologies", "torus,exponential,erdos-renyi"]
        + ["--defenses", "dp-dpsgd,muffliato", "--figures", "{figures}/distance"]
        + ["--prefix", "graphs-", "--markdown", "{figures}/distance/graphs-distance.md"]
        + ["--out", "{work}"],
        ["distance/graphs-distance.md", "distance/graphs-distance-dp-dpsgd.png"]
        + ["distance/graphs-distance-muffliato.png"],
    ),
    Job(
        "frontier",
        [*PRIVAUDIT, "compare", "--preset", "utility", "--dataset", "mnist"]
        + ["--data-root", "{data}", "--out", "{work}", "--figures", "{figures}/frontier"]
        + ["--overwrite", "--no-progress"],
        ["frontier/frontier.md", "frontier/accuracy.md", "frontier/frontier.png"]
        + ["frontier/summary.md"]
        + ["frontier/grid-rlast-eps8.png"],
        mnist=True,
    ),
    Job(
        "frontier-membership",
        [*PRIVAUDIT, "compare", "--preset", "utility", "--dataset", "mnist"]
        + ["--targets", "dsgd-half-model,dpdl-cg,dp-dpsgd-half-model", "--epsilons", "1,8,inf"]
        + ["--data-root", "{data}", "--out", "{work}"]
        + ["--figures", "{figures}/frontier-membership", "--overwrite", "--no-progress"],
        ["frontier-membership/frontier.md", "frontier-membership/accuracy.md"]
        + ["frontier-membership/frontier.png"],
        mnist=True,
    ),
    Job(
        "disaggregation",
        [*BENCH, "benchmarks/disaggregation.py", "--models", "mlp", "--attacks"]
        + ["spear,cpa:refine=off,cpa:complete=off,cpa", "--batch-sizes", "16,64,128,256"]
        + ["--batches", "5", "--threads", "1", "--data-root", "{data}"]
        + ["--markdown", "{figures}/disaggregation/batches.md"],
        ["disaggregation/batches.md"],
        mnist=True,
    ),
    Job(
        "disaggregation-cnn",
        [*BENCH, "benchmarks/disaggregation.py", "--models", "fedavg-cnn", "--attacks"]
        + ["spear,cpa", "--batch-sizes", "8,64", "--sigmas", "0,1e-6,1e-5", "--batches", "2"]
        + ["--threads", "2"]
        + ["--data-root", "{data}", "--markdown", "{figures}/disaggregation/cnn.md"],
        ["disaggregation/cnn.md"],
        mnist=True,
    ),
    Job(
        "disaggregation-noise",
        [*BENCH, "benchmarks/disaggregation_noise.py", "--data-root", "{data}"]
        + ["--figures", "{figures}/disaggregation"],
        ["disaggregation/sigma.md", "disaggregation/sigma.png"],
        mnist=True,
    ),
    Job(
        "frontier-mlp",
        [*PRIVAUDIT, "compare", "--preset", "utility", "--dataset", "mnist", "--model", "mlp"]
        + ["--targets", "dsgd-half-model,dpdl-cg,dp-dpsgd-half-model", "--epsilons", "1,8,inf"]
        + ["--attack", "auto", "--data-root", "{data}", "--out", "{work}"]
        + ["--figures", "{figures}/frontier-mlp", "--overwrite", "--no-progress"],
        ["frontier-mlp/frontier.md", "frontier-mlp/accuracy.md", "frontier-mlp/frontier.png"],
        mnist=True,
    ),
    Job(
        "dpdl-table3",
        [*PRIVAUDIT, "reproduce", "dpdl-table3", "--data-root", "{data}"]
        + ["--agents", "10,20,30", "--rounds", "20", "--batch-size", "1", "--victims", "4"]
        + ["--iterations", "500", "--out", "{work}", "--overwrite", "--no-progress"],
        ["dpdl-table3.md"],
        mnist=True,
        copies={"table3.md": "dpdl-table3.md"},
    ),
]


def elsewhere() -> list[str]:
    """The packages of privaudit this process would import from outside this checkout: an
    editable install of another checkout maps them there, and a figure made so would mix
    two versions of the code while its manifest names one."""
    out = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        roots = [Path(r).resolve() for r in (spec.submodule_search_locations or [])]
        if not roots or not all(r.is_relative_to(ROOT) for r in roots):
            out.append(f"{package} ({', '.join(map(str, roots)) or 'not found'})")
    return out


def shown(argv: list[str]) -> str:
    """A job's command as a user types it: ``privaudit …`` or ``python benchmarks/…``."""
    words = ["privaudit", *argv[3:]] if argv[:3] == PRIVAUDIT else ["python", *argv[1:]]
    return " ".join(w.replace(str(ROOT) + "/", "") for w in words)


def run_job(
    job: Job, work: Path, data: str | None, decattack: tuple[str, str] = ("", "")
) -> dict[str, object]:
    """Run ``job`` into ``work/NAME`` and figures/, then check that it wrote its files."""
    folder = work / job.name
    places = dict(work=folder, data=data, figures=FIGURES)
    places.update(decattack=decattack[0], decattack_deps=decattack[1])
    argv = [a.format(**places) for a in job.argv]
    FIGURES.mkdir(exist_ok=True)
    t0, start = time.perf_counter(), time.time() - 1
    subprocess.run(argv, cwd=ROOT, check=True)
    for src, dst in job.copies.items():
        (FIGURES / dst).write_bytes((folder / src).read_bytes())
    missing = [f for f in job.files if not (FIGURES / f).is_file()]
    if missing:
        raise SystemExit(f"figures.py: {job.name} did not write {', '.join(missing)}")
    written = {  # what it wrote under figures/, the files it must write and any others
        str(f.relative_to(FIGURES))
        for f in FIGURES.rglob("*")
        if f.is_file() and f.suffix != ".pdf" and f != MANIFEST and f.stat().st_mtime >= start
    }
    return {
        "command": shown(argv),
        "files": sorted(written | set(job.files)),
        "code": code_identity(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0),
    }


def refresh_docs() -> list[Path]:
    """Copy every generated file into the docs blocks that show it; the docs changed."""
    changed = []
    for doc in DOCS:
        text = doc.read_text()

        def fill(m: re.Match[str]) -> str:
            body = (ROOT / m["file"]).read_text()
            return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(5)

        new = BLOCK.sub(fill, text)
        if new != text:
            doc.write_text(new)
            changed.append(doc)
    return changed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated jobs (default: all)")
    p.add_argument("--data-root", default=None, help="MNIST (t10k files) for the MNIST jobs")
    p.add_argument("--work", default="privaudit-out/figures", help="the commands' outputs")
    p.add_argument("--list", action="store_true", help="list the jobs and their commands")
    p.add_argument("--decattack", default=None, help="a decAttack checkout, for the anchor job")
    p.add_argument("--decattack-deps", default="", help="the packages it needs beyond ours")
    a = p.parse_args()
    names = [j.name for j in JOBS]
    only = a.only.split(",") if a.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        p.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    if a.list:
        for j in JOBS:
            print(f"{j.name}{' (MNIST)' if j.mnist else ''}: {shown(j.argv)}")
        return 0
    mixed = elsewhere()
    if mixed:
        p.error(
            f"privaudit's code comes from outside {ROOT}: {'; '.join(mixed)}; install this "
            f"checkout (pip install -e {ROOT}) in the environment that runs it"
        )
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    for i, job in enumerate(j for j in JOBS if j.name in only):
        if job.mnist and not a.data_root:
            print(f"[{i + 1}/{len(only)}] {job.name}: skipped (needs --data-root with MNIST)")
            continue
        if job.decattack and not a.decattack:
            print(f"[{i + 1}/{len(only)}] {job.name}: skipped (needs --decattack PATH)")
            continue
        print(f"[{i + 1}/{len(only)}] {job.name}: running", flush=True)
        anchor = (a.decattack or "", a.decattack_deps)
        manifest[job.name] = run_job(job, Path(a.work).resolve(), a.data_root, anchor)
        MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")  # as it goes
        print(f"[{i + 1}/{len(only)}] {job.name}: done in {manifest[job.name]['seconds']} s")
    for doc in refresh_docs():
        print(f"refreshed the generated blocks of {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
