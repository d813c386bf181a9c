"""The one figure style: every figure saved as 300 dpi PNG and PDF, numbers to 3 significant
digits, one colour and marker per (target, ε), titles naming the threat, and grids whose
reconstructions sit under their own originals (victim by victim)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from privaudit.eval import membership_scoring, report, style
from privaudit.eval.figures import EMPTY_BLOCK, GridBlock, build_grid, reconstruction_grid

NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?")


def significant(text: str) -> int:
    """The significant digits of a number as printed (1e-05 → 1, 3.67 → 3, 0.0218 → 3)."""
    mantissa = text.split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def captured(monkeypatch: pytest.MonkeyPatch, module: object) -> list:
    """Figures ``module`` saves, kept (still written, through the real save)."""
    figs = []

    def keep(fig, path):
        figs.append(fig)
        return style.save(fig, path)

    monkeypatch.setattr(module, "save", keep)
    return figs


def test_save_writes_a_300_dpi_png_and_a_pdf_beside_it(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1])
    written = style.save(fig, tmp_path / "grid-eps0.5")  # a dotted name keeps its dot
    assert [p.name for p in written] == ["grid-eps0.5.png", "grid-eps0.5.pdf"]
    assert written[1].read_bytes()[:5] == b"%PDF-"
    with Image.open(written[0]) as im:
        assert im.size == (300, 300) and round(im.info["dpi"][0]) == 300
    assert [p.name for p in style.save(fig, tmp_path / "roc.png")] == ["roc.png", "roc.pdf"]


def test_numbers_and_epsilon_to_three_significant_digits() -> None:
    assert style.eps_text(3.6708) == "ε = 3.67" and style.eps_text(None) == "ε = ∞"
    assert style.num(0.021830405889) == "0.0218" and style.num(float("inf")) == "∞"
    assert membership_scoring.roc_bound_label(3.6708, 1e-5) == "(ε = 3.67, δ = 1e-05)-DP"


def test_one_colour_and_marker_per_series_key() -> None:
    keys = [("dpdl-cg", e) for e in (1.0, 2.0, 4.0, 8.0, None)] + [
        (f"t{i}", 1.0) for i in range(59)
    ]
    styles = style.series_style(keys)
    assert len(set(styles.values())) == len(keys) == 64
    assert styles[("dpdl-cg", 1.0)][0] != styles[("dpdl-cg", 8.0)][0]
    assert styles[("dpdl-cg", 1.0)][1] != styles[("dpdl-cg", 8.0)][1]


def test_titles_name_the_threat_not_the_first_of_many_links() -> None:
    links = [f"link {i}<->{(i + 1) % 8}" for i in range(8)]
    assert style.threat_text(links) == "link threat, 8 observations"
    assert style.threat_text(["link 0<->1"]) == "link 0<->1"
    assert (
        style.title("link 0<->1", "dpdl-cg", 2, 3.6708)
        == "link 0<->1 · dpdl-cg · round 2 · ε = 3.67"
    )


def test_roc_legend_has_three_significant_digits_and_the_dp_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = captured(monkeypatch, membership_scoring)
    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 1, 300), rng.normal(0, 1, 300)
    curves = {
        "decompose (AUC 0.760)": membership_scoring.roc(a, b),
        "lr (AUC 0.7)": membership_scoring.roc(b, a),
    }
    out = membership_scoring.plot_roc(
        curves, tmp_path / "roc.png", bound=(3.6708, 1e-5), title="link 0<->1"
    )
    assert out == tmp_path / "roc.png" and (tmp_path / "roc.pdf").read_bytes()[:5] == b"%PDF-"
    ax = figs[0].axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("ε = 3.67" in t for t in texts) and not any("3.6708" in t for t in texts)
    assert all(significant(n) <= 3 for t in texts for n in NUMBER.findall(t)), texts
    assert len({line.get_color() for line in ax.get_lines()[-2:]}) == 2  # one overlay, 2 colours
    assert ax.collections, "the region beyond the DP bound is shaded"


def _blocks() -> list[GridBlock]:
    """Three targets: all three victims' images; victim 1 only (victim 0's batch empty);
    no image at all."""
    rng = np.random.default_rng(0)
    img = [rng.random((1, 8, 8), dtype=np.float32) for _ in range(5)]
    full = GridBlock(
        "nd-cg",
        np.stack(img[:3]),
        np.stack(img[2::-1]),
        [(0, 0), (1, 0), (1, 1)],
        ["9 dB\n0.1"] * 3,
    )
    part = GridBlock(
        "dpdl-cg",
        np.stack([img[3]]),
        np.stack([img[4]]),
        [(1, 0)],
        ["8 dB\n0.2"],
        absent={(0, 0): "victim 0:\nempty batch"},
    )
    empty = GridBlock("pdsl-cg", np.zeros((0, 1, 8, 8)), np.zeros((0, 1, 8, 8)), [])
    return [full, part, empty]


def _axes(fig) -> dict[str, object]:
    return {ax.get_label(): ax for ax in fig.axes}


def _column(ax) -> int:
    return ax.get_subplotspec().colspan.start


def test_grid_puts_each_reconstruction_under_its_own_original() -> None:
    blocks = _blocks()
    fig = build_grid(blocks, "link threat · round 2", {(0, 0): "victim 0", (1, 0): "victim 1"})
    axes = _axes(fig)
    # the second block's victim-1 image sits in victim 1's column, not shifted to column 0,
    # under its own ground truth (a new row: its original differs from the first block's)
    for b, block in enumerate(blocks[:2]):
        for k, key in enumerate(block.columns):
            rec = axes[f"recon {b} {key!r}"]
            truths = [
                ax
                for ax in fig.axes
                if ax.get_label() == f"truth {key!r}"
                and ax.get_images()
                and np.array_equal(ax.get_images()[0].get_array(), block.truth[k][0])
            ]
            assert truths and all(_column(t) == _column(rec) for t in truths)
            assert np.array_equal(rec.get_images()[0].get_array(), block.recon[k][0])
    assert _column(axes[f"recon 1 {(1, 0)!r}"]) == 1
    gap = axes[f"recon 1 {(0, 0)!r}"]
    assert not gap.get_images() and "empty batch" in gap.texts[0].get_text()
    # the imageless target is a labelled empty row, not a vanished one
    empty = axes["empty 2"]
    assert EMPTY_BLOCK in [t.get_text() for t in empty.texts] and empty.get_ylabel() == "pdsl-cg"
    titles = {ax.get_title() for ax in fig.axes if ax.get_label().startswith("truth")}
    assert {"victim 0", "victim 1"} <= titles


def test_cell_block_keys_images_by_victim_from_links_and_batch_sizes() -> None:
    row = {
        "target": "dpdl-cg",
        "epsilon_requested": 1.0,
        "epsilon": None,
        "threat": "link",
        "attack": "ig",
        "links": [[0, 1], [1, 0], [2, 1]],
        "batch_sizes": [2, 0, 1],
        "per_image": {"psnr": [9.0, 8.0, 7.0], "ssim": [0.1, 0.2, 0.3]},
    }
    tensors = {"truth": torch.rand(3, 1, 8, 8), "recon": torch.rand(3, 1, 8, 8)}
    block, headers = report.cell_block(row, tensors)
    assert list(block.columns) == [(0, 0), (0, 1), (2, 0)]
    assert block.absent == {(1, 0): "victim 1:\nempty batch"}
    assert headers[(0, 1)] == "victim 0 · 2" and headers[(2, 0)] == "victim 2"
    assert "ε asked 1" in block.label and "link · ig" in block.label


def test_attack_grid_labels_each_column_and_writes_a_pdf(tmp_path: Path, monkeypatch) -> None:
    from privaudit.eval import figures

    figs = captured(monkeypatch, figures)
    true, rec = torch.rand(3, 1, 8, 8), torch.rand(3, 1, 8, 8)
    labels = [f"victim {v}\nlink {v}→{v + 1} · ig" for v in range(3)]
    per = {"psnr": [10.3314, 9.0, None], "ssim": [0.021830, 0.5, None]}
    out = reconstruction_grid(
        true, rec, per, "link threat, 8 observations", tmp_path / "grid.png", column_labels=labels
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.pdf", "grid.png"] and out.exists()
    titles = [ax.get_title() for ax in figs[0].axes if ax.get_label().startswith("truth")]
    assert titles == labels
    captions = [ax.get_xlabel() for ax in figs[0].axes if ax.get_label().startswith("recon")]
    assert captions[0] == "PSNR 10.3 dB\nSSIM 0.022" and "n/a" in captions[2]
    with pytest.raises(ValueError, match="column labels"):
        reconstruction_grid(true, rec, None, "x", tmp_path / "bad.png", column_labels=["a"])


def _summary(target: str, asked: float | None, psnr: float | None) -> dict:
    return {
        "target": target,
        "round": 2,
        "epsilon_requested": asked,
        "epsilon": None,
        "threat": "link",
        "psnr": psnr,
        "psnr_spread": 0.1,
        "test_acc": 0.5,
        "test_acc_spread": 0.0,
        "audit_epsilon_lo": None,
        "audit_epsilon_upper": None,
    }


def test_privacy_utility_tells_apart_one_target_at_two_epsilons(
    tmp_path: Path, monkeypatch
) -> None:
    figs = captured(monkeypatch, report)
    summary = [
        _summary("dpdl-cg", 1.0, 10.0),
        _summary("dpdl-cg", 8.0, 12.0),
        _summary("nd-cg", None, 20.0),
        _summary("pdsl-cg", 1.0, None),
    ]
    written = report.privacy_utility_figure(summary, 2, tmp_path / "privacy-utility-r2")
    assert [p.suffix for p in written] == [".png", ".pdf"]
    fig = figs[0]
    assert "link threat" in fig.get_suptitle() and "round 2" in fig.get_suptitle()
    ax = fig.axes[0]
    drawn = [
        (line.get_color(), line.get_marker())
        for line in ax.get_lines()
        if line.get_marker() in style.MARKERS and len(line.get_xdata())
    ]
    assert len(drawn) == 3 and len(set(drawn)) == 3  # ε 1 and ε 8 of dpdl-cg differ
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert (
        "dpdl-cg · ε asked 1, accounted ∞" in labels
        and "dpdl-cg · ε asked 8, accounted ∞" in labels
    )
    assert any("pdsl-cg" in t and "no image" in t for t in labels)
