"""Shared pytest fixtures for nikki's Python tests."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A numpy generator with a fixed seed, so failures reproduce."""
    return np.random.default_rng(1234)


@pytest.fixture
def line_of(request):
    """``line_of(tag)``: the line of the requesting test file marked ``# E:<tag>``, where a test
    expects a located error."""
    path = request.module.__file__

    def find(tag: str) -> int:
        with open(path) as f:
            for number, text in enumerate(f, 1):
                if text.rstrip().endswith(f"# E:{tag}"):
                    return number
        raise AssertionError(f"no line tagged {tag} in {path}")

    return find
