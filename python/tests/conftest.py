"""Shared fixtures: a generated table, and the torch / GPU gates.

Tests that need torch or a GPU skip with the reason; with FETCHAHEAD_REQUIRE_GPU=1 (the GPU
machine) they fail instead.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import fetchahead

REQUIRE_GPU = os.environ.get("FETCHAHEAD_REQUIRE_GPU") == "1"


def _missing(why: str) -> None:
    if REQUIRE_GPU:
        pytest.fail(f"{why} (FETCHAHEAD_REQUIRE_GPU=1)")
    pytest.skip(f"{why}; set FETCHAHEAD_REQUIRE_GPU=1 to make this fail")


@pytest.fixture(scope="session")
def torch():
    try:
        import torch
    except ImportError:
        _missing("torch is not installed")
    except Exception as e:  # a torch build whose libraries are missing here
        _missing(f"torch cannot be imported ({type(e).__name__}: {e})")
    return torch


@pytest.fixture(scope="session")
def cuda(torch):
    if not torch.cuda.is_available():
        _missing("no CUDA device")
    return torch.device("cuda", 0)


ROWS = 1000
LAYERS = [0, 3]


@pytest.fixture(scope="session")
def table(tmp_path_factory) -> Path:
    dir = tmp_path_factory.mktemp("table")
    fetchahead.make_table(dir, rows=ROWS, layers=LAYERS, dim=256, shards=2, seed=7)
    return dir


class Reference:
    """Every tensor of every shard, read from the files with numpy and the safetensors header
    format alone: the reference the row store is checked against."""

    def __init__(self, dir: Path) -> None:
        self.tensors: dict[str, np.ndarray] = {}
        for f in sorted(dir.glob("*.safetensors")):
            raw = f.read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8 : 8 + n])
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                start, end = t["data_offsets"]
                data = np.frombuffer(raw, dtype=np.uint8, count=end - start, offset=8 + n + start)
                self.tensors[name] = data.reshape(t["shape"])

    def rows(self, layer: int, ids) -> tuple[np.ndarray, np.ndarray]:
        w = self.tensors[f"layers.{layer}.engram.embed.weight"]
        s = self.tensors[f"layers.{layer}.engram.embed.scale"]
        return w[np.asarray(ids)], s[np.asarray(ids)]


@pytest.fixture(scope="session")
def reference(table) -> Reference:
    return Reference(table)
