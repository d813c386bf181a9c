"""A plugin written against the previous release's dict form of ``Public``
(``view.public["params"]``) keeps working: the same Observation as the attribute form, with
a DeprecationWarning naming the attribute to use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny

from privaudit.api.pipeline import observe
from privaudit.plugins import load_plugins
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin" / "privaudit_example"


def old_style(tmp_path: Path) -> Path:
    """The example plugin's defense as the previous release had it: ``public["params"]``
    and ``public["batch_size"]``, under names of its own (the registry is global)."""
    text = (EXAMPLE / "defense.py").read_text()
    text = text.replace("view.public.params", 'view.public["params"]')
    text = text.replace("view.public.batch_size", 'view.public["batch_size"]')
    text = text.replace('"cta-dpsgd-halfnoise"', '"old-public-cta-half"')
    text = text.replace('"cta-dpsgd"', '"old-public-cta"')
    text = text.replace("class CTADPSGD", "class OldCTA").replace("(CTADPSGD)", "(OldCTA)")
    assert 'public["params"]' in text and "old-public-cta" in text
    path = tmp_path / "old_public_plugin.py"
    path.write_text(text)
    return path


def test_a_plugin_using_the_dict_form_still_observes_with_a_warning(tmp_path):
    load_plugins([old_style(tmp_path)])
    run = Run.create(tiny("old-public-cta", sigma=0.5, epsilon=None), tmp_path / "run")
    with pytest.warns(DeprecationWarning, match=r"use view\.public\.params"):
        (o,) = observe(run, "old-public-cta-model", 1, victims=[0], progress=False)
    assert o.noise_std == pytest.approx(0.5 * 1.0 / run.cfg.batch_size)
    assert all(torch.isfinite(v).all() for v in o.target.values())


def test_the_dict_form_reads_what_the_attributes_hold(tmp_path):
    run = Run.create(tiny("dp-dpsgd", sigma=0.5, epsilon=None), tmp_path / "run")
    public = run.public()
    with pytest.warns(DeprecationWarning):
        assert public["params"] == public.params and public["n"] == public.n
    with pytest.warns(DeprecationWarning):
        assert public.get("delta") == public.delta
    assert public.get("no-such-fact", 7) == 7
    with pytest.raises(KeyError):
        public["no-such-fact"]
