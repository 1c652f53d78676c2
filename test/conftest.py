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


@pytest.fixture(scope="session")
def random_tiny_dir(tmp_path_factory):
    """A native checkpoint of the untrained tiny preset (seed 0): for node tests that
    need long answers (the shipped default model says EOS after a few tokens)."""
    from oxygen_ros.core.checkpoints import save_native
    from oxygen_ros.core.tokenizer import default_tokenizer_path

    out = tmp_path_factory.mktemp("random_tiny")
    save_native(build_model(TINY, seed=0), out, tokenizer_path=default_tokenizer_path())
    return str(out)
