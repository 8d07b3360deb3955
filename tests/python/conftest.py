"""Shared pytest fixtures for nikki's Python tests."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A numpy generator with a fixed seed, so failures reproduce."""
    return np.random.default_rng(1234)
