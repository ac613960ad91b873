"""Shared fixtures: tiny random models saved in the real formats, built once per test session; a run that
must refuse before its models load."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    # Tiny models run fastest on one thread; intra-op threads only contend on a small (2-core) machine.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """`make_tiny` output: target/, dspark/, dspark-speculators/, dflash/, dflash-zlab/, eagle3/,
    eagle3-speculators/, eagle3-deepspec/."""
    from dspark.synthetic.tiny import make_tiny

    out = tmp_path_factory.mktemp("tiny")
    make_tiny(out, seed=0)
    return out


@pytest.fixture
def no_models(monkeypatch, tmp_path):
    """The runner's session (which loads the models) must never open; the working folder is tmp_path."""
    from harness.runs import runner

    def never(*args, **kwargs):
        raise AssertionError("the run loaded its models before refusing the mistake")

    monkeypatch.setattr(runner.Session, "open", never)
    monkeypatch.chdir(tmp_path)
