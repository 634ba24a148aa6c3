"""The package itself: import without torch, the variant tables, the stub."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fetchahead


def test_import_does_not_import_torch():
    code = "import sys, fetchahead; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_variants_list_both_families_and_the_defaults_are_listed():
    v = fetchahead.variants()
    assert set(v) == {"gather", "gather_dequant"}
    gather = [name for name, _ in v["gather"]]
    dequant = [name for name, _ in v["gather_dequant"]]
    assert "gather_chunk16_nohint_x2" in gather
    assert fetchahead.default_variant("gather") in gather
    assert fetchahead.default_variant("gather_dequant") in dequant
    assert fetchahead.default_variant("gather", "sm_90") in gather
    assert fetchahead.default_variant("gather_dequant", "sm_121a") in dequant


def test_an_unknown_variant_is_a_value_error_naming_it():
    import pytest

    with pytest.raises(ValueError, match="gather_nope"):
        fetchahead._native.variant_index("gather", "gather_nope")


def test_the_package_ships_its_stub_and_marker():
    root = Path(fetchahead.__file__).parent
    assert (root / "py.typed").exists()
    assert (root / "__init__.pyi").exists()


def test_memory_table_is_deterministic():
    a = fetchahead.MemoryTable(64, 256, seed=5).arrays()
    b = fetchahead.MemoryTable(64, 256, seed=5).arrays()
    assert a[0].shape == (64, 256) and a[1].shape == (64, 8)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
