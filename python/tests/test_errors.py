"""Every error class: raised from the crate's errors, with their attributes and bases."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fetchahead
from fetchahead import errors

EXAMPLES = {
    "cuda": (fetchahead.CudaError, {"call": "cuLaunchKernel"}),
    "no_device": (fetchahead.NoDeviceError, {"why": "no device here"}),
    "no_ptx": (fetchahead.NoPtxError, {"arch": "sm_70", "built": "sm_90"}),
    "ids_out_of_range": (
        fetchahead.IdsOutOfRangeError,
        {"count": 2, "first_index": 3, "first_id": 1000, "rows": 100},
    ),
    "row_id": (fetchahead.RowIdError, {"row_ids": [99], "row_range": (0, 10)}),
    "row_lookup": (fetchahead.RowLookupError, {"row_ids": [7]}),
    "row_read": (
        fetchahead.RowReadError,
        {"row_ids": [5, 6, 7], "layer": 2, "offset": 4096, "file": "/models/engram/shard-0.safetensors"},
    ),
    "staging_full": (fetchahead.StagingFullError, {"count": 5000, "capacity": 4096}),
    "not_warmed": (fetchahead.NotWarmedError, {"what": "the prefetcher"}),
    "prefetch_order": (fetchahead.PrefetchOrderError, {}),
    "file": (
        fetchahead.FileError,
        {"op": "read", "file": "/models/engram/shard-0.safetensors", "errno": 5},
    ),
    "file_not_found": (
        fetchahead.MissingFileError,
        {"op": "open", "filename": "/models/engram/shard-0.safetensors", "errno": 2},
    ),
    "file_permission": (
        fetchahead.FilePermissionError,
        {"op": "open", "filename": "/models/engram/shard-0.safetensors", "errno": 13},
    ),
    "table": (fetchahead.TableError, {"tensor": "engram.2.weight"}),
    "read_path": (fetchahead.ReadPathUnavailableError, {"path": "uring"}),
    "invalid": (fetchahead.InvalidArgumentError, {"argument": "kind"}),
    "out_of_memory": (fetchahead.OutOfMemoryError, {"bytes": 1 << 40, "available": 1 << 30}),
    "no_space": (fetchahead.NoSpaceError, {"file": "/models/engram", "need": 1 << 30}),
    "would_overwrite": (fetchahead.WouldOverwriteError, {"file": "/models/engram/model.safetensors"}),
    "not_regular_file": (fetchahead.FileError, {"file": "/tmp/fifo", "kind": "a FIFO"}),
}


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_each_error_kind_raises_its_class_with_its_attributes(kind):
    cls, attrs = EXAMPLES[kind]
    if kind == "cuda" and not fetchahead._native.driver_present():
        pytest.skip("a CUDA error's message comes from the driver library, which is not installed")
    with pytest.raises(cls) as e:
        fetchahead._native._raise_example(kind)
    assert isinstance(e.value, fetchahead.Error)
    assert str(e.value)
    for name, value in attrs.items():
        assert getattr(e.value, name) == value, name


def test_every_class_is_exported_and_derives_from_error():
    for name in errors.__all__:
        cls = getattr(fetchahead, name)
        assert issubclass(cls, fetchahead.Error)
    covered = {cls for cls, _ in EXAMPLES.values()}
    assert covered == {getattr(fetchahead, n) for n in errors.__all__ if n != "Error"}


def test_argument_errors_are_value_errors_and_file_errors_os_errors():
    assert issubclass(fetchahead.InvalidArgumentError, ValueError)
    assert issubclass(fetchahead.TableError, ValueError)
    assert issubclass(fetchahead.FileError, OSError)
    assert issubclass(fetchahead.RowReadError, OSError)
    assert issubclass(fetchahead.OutOfMemoryError, MemoryError)


def test_a_missing_table_is_a_file_error_naming_the_path(tmp_path):
    with pytest.raises(fetchahead.FileError) as e:
        fetchahead.RowStore(tmp_path / "nothing-here")
    assert "nothing-here" in e.value.file


def test_a_missing_table_is_a_file_not_found_error_with_its_filename(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(FileNotFoundError) as e:
        fetchahead.RowStore(missing)
    assert isinstance(e.value, fetchahead.MissingFileError)
    assert e.value.filename == str(missing)
    assert e.value.errno == 2
    # The message, not OSError's "[Errno 2] ...".
    assert str(e.value) == e.value.message and "nothing-here" in str(e.value)


def test_an_unreadable_table_is_a_permission_error_with_its_filename(table, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    shard = sorted(Path(table).glob("*.safetensors"))[0]
    locked = tmp_path / "locked.safetensors"
    locked.write_bytes(shard.read_bytes())
    locked.chmod(0)
    with pytest.raises(PermissionError) as e:
        fetchahead.RowStore(locked)
    assert isinstance(e.value, fetchahead.FilePermissionError)
    assert e.value.filename == str(locked)


def test_every_error_kind_has_its_class():
    # The crate's one ErrorKind list: each kind's Python class exists and derives from Error,
    # and every class here is some kind's (each kind's C status code: host/ffi.rs's test).
    classes = fetchahead._native.error_kinds()
    for cls in classes:
        assert issubclass(getattr(errors, cls), fetchahead.Error), cls
    assert set(classes) == set(errors.__all__) - {"Error"}


def test_constructors_raise_no_device_error_before_touching_torch():
    # Run in a child with no driver visible and torch blocked: NoDeviceError comes first.
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch touched")
sys.meta_path.insert(0, Block())
import fetchahead
m = fetchahead.MemoryTable(8, 256)
made = [
    lambda: fetchahead.Prefetcher(m),
    lambda: fetchahead.Prefetcher(m, device="cuda:1"),
    lambda: fetchahead.L2Plan(),
    lambda: fetchahead.IdStatus(),
    lambda: fetchahead.IdStatus("cuda:0"),
]
for make in made:
    try:
        make()
    except fetchahead.NoDeviceError as e:
        assert e.why, e
    else:
        raise SystemExit("no error")
print("ok")
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_truncated_shard_is_a_table_error_naming_file_and_tensor(table, tmp_path):
    shard = sorted(Path(table).glob("*.safetensors"))[0]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(shard.read_bytes()[: os.path.getsize(shard) // 2])
    with pytest.raises(fetchahead.TableError) as e:
        fetchahead.RowStore(cut)
    assert e.value.file == str(cut)
    assert e.value.tensor.startswith("layers.")


def test_a_missing_layer_is_a_table_error(table):
    store = fetchahead.RowStore(table)
    with pytest.raises(fetchahead.TableError) as e:
        store.lookup(1, [0])
    assert e.value.layer == 1 and e.value.layers == [0, 3]


def test_a_bad_read_path_is_an_invalid_argument(table):
    with pytest.raises(fetchahead.InvalidArgumentError) as e:
        fetchahead.RowStore(table, read_path="fast")
    assert e.value.argument == "read path"
