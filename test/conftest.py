"""Shared fixtures."""

import pytest
import torch

from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model


def lively(model):
    """Scale the VLM's projections up so an untrained model's greedy text depends
    on what it sees (at the default initialisation it echoes its last token)."""
    with torch.no_grad():
        for layer in model.language_model.layers:
            for name, p in layer.named_parameters():
                if "proj" in name:
                    p.mul_(3.0)
    return model


@pytest.fixture(scope="session")
def lively_tiny():
    return lively(build_model(TINY, seed=2))
