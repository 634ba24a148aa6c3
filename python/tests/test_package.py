"""The package itself: import without torch, the variant tables, the stub."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
        fetchahead._native.variant("gather", "gather_nope")


def test_a_variant_is_a_handle_resolved_once_with_its_name_and_family():
    v = fetchahead._native.variant("gather_dequant", None, "sm_90")
    assert v.family == "gather_dequant"
    # A default picks by each call's rows.
    assert v.name == "default"
    for rows in (72, 65536, 4 << 20):
        assert v.name_for(rows) == fetchahead.default_variant("gather_dequant", "sm_90", rows)
    assert fetchahead.default_variant("gather", "sm_90", 72) != fetchahead.default_variant(
        "gather", "sm_90", 4 << 20
    )
    named = fetchahead._native.variant("gather", "gather_chunk16")
    assert (named.family, named.name) == ("gather", "gather_chunk16")
    assert "gather_chunk16" in repr(named)


def test_the_package_ships_its_stub_and_marker():
    root = Path(fetchahead.__file__).parent
    assert (root / "py.typed").exists()
    assert (root / "__init__.pyi").exists()


def test_memory_table_is_deterministic():
    a = fetchahead.MemoryTable(64, 256, seed=5).arrays()
    b = fetchahead.MemoryTable(64, 256, seed=5).arrays()
    assert a[0].shape == (64, 256) and a[1].shape == (64, 8)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


def test_the_prefetcher_defaults_agree_in_python_and_rust():
    # C's are checked against Rust's by tests/ffi_l2_plan.rs, the demo's by the lab's tests.
    import inspect

    # The lab's demo takes Rust's (its own test checks that).
    stated = fetchahead._native.default_prefetcher_config()
    params = inspect.signature(fetchahead.Prefetcher).parameters
    python = {name: params[name].default for name in stated["rust"]}
    assert python == stated["rust"], stated
    # The measured best (BENCHMARKS.md): the shared flag lane, tagged gathers.
    assert (python["completion"], python["join"]) == ("flag", "tags")


def test_show_config_prints_and_returns_the_report(capsys):
    report = fetchahead.show_config()
    printed = capsys.readouterr().out
    assert report["version"] == fetchahead.__version__
    assert report["git_commit"] == fetchahead.__git_commit__
    assert report["archs"] and all(a.startswith("sm_") for a in report["archs"])
    assert fetchahead.__version__ in printed and "embedded PTX" in printed
    # No GPU here: the device says why; with one, it names the PTX it loads.
    device = report["device"]
    if isinstance(device, str):
        assert device.startswith("no device")
    else:
        assert device["ptx"] in report["archs"]
    families = {k for d in report["default_variants"] for k in ("gather", "gather_dequant") if d[k]}
    assert families == {"gather", "gather_dequant"}
    assert [p["path"] for p in report["read_paths"]] == ["uring", "preadv", "buffered", "mmap"]
    settings = {s["name"]: s for s in report["settings"]}
    for name, _ in fetchahead.env_settings():
        assert name in settings, name
    assert "FETCHAHEAD_NVTX" in settings and "FETCHAHEAD_LOG" in settings


def test_a_setting_from_the_environment_is_reported_as_such():
    code = (
        "import fetchahead; s = {x['name']: x for x in fetchahead.show_config(print_it=False)"
        "['settings']}; print(s['FETCHAHEAD_CACHE_BYTES']['value'], "
        "s['FETCHAHEAD_CACHE_BYTES']['source'], s['FETCHAHEAD_READ_PATH']['source'])"
    )
    env = dict(os.environ, FETCHAHEAD_CACHE_BYTES="64M")
    env.pop("FETCHAHEAD_READ_PATH", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["64M", "env", "default"]


def test_python_dash_m_and_the_console_script_run_the_cli():
    import json
    import shutil

    out = subprocess.run(
        [sys.executable, "-m", "fetchahead", "info", "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["version"] == fetchahead.__version__
    out = subprocess.run([sys.executable, "-m", "fetchahead", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"fetchahead {fetchahead.__version__}"
    bad = subprocess.run([sys.executable, "-m", "fetchahead", "no-such-command"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no-such-command" in bad.stderr
    # Beside the interpreter for an install into an environment; in `<target>/bin` for
    # `pip install --target <target>` (the package then sits in `<target>/fetchahead`).
    places = [os.path.dirname(sys.executable), os.path.join(os.path.dirname(os.path.dirname(fetchahead.__file__)), "bin")]
    script = shutil.which("fetchahead", path=os.pathsep.join(places))
    assert script, f"the wheel installs a fetchahead command in one of {places}"
    out = subprocess.run([script, "kernels"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "sm_90" in out.stdout


def test_nvtx_is_off_and_loads_nothing_by_default(tmp_path):
    code = """
import fetchahead, numpy as np
fetchahead.make_table(DIR, rows=64, layers=[0], dim=256)
fetchahead.RowStore(DIR).lookup(0, np.arange(8))
maps = open("/proc/self/maps").read()
print(fetchahead._native.nvtx_state(), "nvToolsExt" in maps or "nvtx3interop" in maps)
""".replace("DIR", repr(str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k != "FETCHAHEAD_NVTX"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["off", "False"]


_NO_NVIDIA_PACKAGES = """
import sys
class Block:  # pip's nvidia-* packages out of reach: no NVTX library anywhere
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia" or name.startswith("nvidia."):
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
"""


def test_nvtx_on_without_the_library_warns_once(tmp_path):
    code = _NO_NVIDIA_PACKAGES + """
import logging, fetchahead, numpy as np
logging.basicConfig(level=logging.WARNING, format="%(name)s|%(message)s")
fetchahead.make_table(DIR, rows=64, layers=[0], dim=256)
store = fetchahead.RowStore(DIR)
for _ in range(3):
    store.lookup(0, np.arange(8))
fetchahead.flush_logs()
print(fetchahead._native.nvtx_state())
""".replace("DIR", repr(str(tmp_path)))
    env = dict(os.environ, FETCHAHEAD_NVTX="1", LD_LIBRARY_PATH="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("on"):
        pytest.skip("libnvToolsExt.so.1 is installed here: the ranges are on")
    assert out.stdout.startswith("unavailable: "), out.stdout
    warnings = [l for l in out.stderr.splitlines() if "FETCHAHEAD_NVTX" in l]
    assert len(warnings) == 1, out.stderr
    assert warnings[0].startswith("fetchahead.kernels|") and "libnvToolsExt.so.1" in warnings[0]


def test_nvtx_on_with_pips_library_pushes_ranges(tmp_path):
    import importlib.util
    import glob

    spec = importlib.util.find_spec("nvidia")
    found = [
        p
        for root in (spec.submodule_search_locations if spec else [])
        for name in ("libnvToolsExt.so.1", "libnvtx3interop.so.1")
        for p in glob.glob(os.path.join(root, "*", "lib", name))
    ]
    if not found:
        pytest.skip("no pip NVTX library here (torch's CUDA wheels install one)")
    code = """
import fetchahead, numpy as np
fetchahead.make_table(DIR, rows=64, layers=[0], dim=256)
weights, _ = fetchahead.RowStore(DIR).lookup(0, np.arange(8))
maps = open("/proc/self/maps").read()
print(fetchahead._native.nvtx_state(), "libnvToolsExt" in maps or "libnvtx3interop" in maps, weights.shape[0])
""".replace("DIR", repr(str(tmp_path)))
    env = dict(os.environ, FETCHAHEAD_NVTX="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    state, mapped, rows = out.stdout.rsplit(" ", 2)
    assert state.startswith("on ("), out.stdout
    assert mapped == "True" and rows.strip() == "8", out.stdout
