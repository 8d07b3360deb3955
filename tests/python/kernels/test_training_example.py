"""The training example (examples/train_tiny_lm.py): a tiny decoder LM trained with nikki.torch ops
only tracks the same model trained in plain PyTorch, step for step."""

from __future__ import annotations

import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
sys.path.insert(0, str(EXAMPLES))
from train_tiny_lm import Config, largest_gap, plot, train  # noqa: E402


@pytest.fixture(scope="module")
def curves():
    return train(Config(), steps=30)


def test_loss_curve_tracks_pytorch(curves):
    ours, theirs, _ = curves
    # Both runs are float32 from the same weights and batches; only the kernels' summation orders
    # differ (about 1e-7 relative per op), and 30 AdamW steps do not amplify that past 1e-4.
    assert largest_gap(ours, theirs) < 1e-4


def test_the_model_learns(curves):
    ours, _, floor = curves
    assert ours[0] > 4.0  # about ln(64) plus the initial weights' noise
    assert ours[-1] < ours[0] - 1.0
    assert ours[-1] > floor - 0.1  # no model beats the language's entropy by more than batch noise


def test_plot_is_a_png(curves, tmp_path):
    ours, theirs, floor = curves
    path = tmp_path / "loss.png"
    plot(ours, theirs, floor, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
