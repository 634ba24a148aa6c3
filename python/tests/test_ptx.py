"""Which embedded PTX the package loaded for the device, and why (``fetchahead.loaded_ptx``)."""
from __future__ import annotations

import os

import fetchahead


def test_loaded_ptx_says_which_and_why(cuda):
    got = fetchahead.loaded_ptx(cuda)
    arch = got["arch"]
    assert arch.startswith("sm_"), got
    assert got["why"].startswith(f"{arch} PTX for a "), got
    forced = os.environ.get("FETCHAHEAD_PTX_ARCH")
    if forced:
        assert arch == forced and f"forced by FETCHAHEAD_PTX_ARCH={forced}" in got["why"], got
    # What the PTX lacks are variants, each needing an SM newer than the PTX's.
    names = {name for family in fetchahead.variants().values() for name, _ in family}
    sm = int(arch[3:].rstrip("a"))
    for name, needs in got["not_held"]:
        assert name in names and needs > sm, (name, needs)
    if sm >= 90:
        assert got["not_held"] == []
    else:
        assert ("gather_dequant_cvt", 89) in got["not_held"], got
