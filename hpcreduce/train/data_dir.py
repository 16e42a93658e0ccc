"""A data set on disk: a directory of ``.npy`` shards and a manifest (``hpcreduce train --data DIR``).

    DIR/manifest.json
    DIR/train-00000.ids.npy   DIR/train-00000.label.npy   DIR/train-00001.ids.npy ...
    DIR/test-00000.ids.npy    ...

``manifest.json`` (written last, so a directory with one is complete)::

    {"format": "hpcreduce-data", "version": 1, "name": "synthetic-ctr",
     "arrays": {"ids": {"dtype": "int64", "shape": [32]}, "label": {"dtype": "float32", "shape": []}},
     "splits": {"train": [15625, 15625, ...], "test": [5000, ...]},
     "info": {"bayes_accuracy": 0.8197, ...}}

``arrays`` gives each array's dtype and the shape of one example; ``splits`` the rows of each
shard, in order (shard ``s`` of ``split`` is the files ``{split}-{s:05d}.{array}.npy``, one per
array, each of ``rows`` examples). A batch is ``{array: rows}``, as the built-in models read.
Shards are opened the first time a batch touches them, so a worker opens only the shards
``partition`` gives it; ``opened`` lists them. A batch's rows are read from the open files
(``pread``), never mapped, so a shard file changed or cut while the run reads it is an
``InputFileError`` naming it (checked when it is opened, before each read and by each read's
length), never a SIGBUS.
``problems`` checks the manifest and the headers of a part of the files (existence, dtype,
shape, length: sizes multiplied exactly), and ``run_checks`` splits that check over the ranks and gives every
rank the whole list, before anything trains. The folder may be shared: every file is read
as ``runtime.given_files`` reads what we are pointed at (regular files only, the manifest
bounded), and an array name of the manifest is one plain name, so every shard path stays
inside the folder. ``write_data_dir`` writes such a directory
from any data set whose batches are dicts of arrays (``hpcreduce data write``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..errors import InputFileError, OutputFileError, Problem, setting_problem, worded
from ..runtime.files import atomic_file, write_json
from ..runtime.given_files import inside, nbytes, npy_file_header, npy_header, open_regular, read_json
from .data import Dataset
from .partition import even_shards, share_bounds, shard_layout

MANIFEST = "manifest.json"
FORMAT, VERSION = "hpcreduce-data", 1
SPLITS = ("train", "test")
SHOWN = 5  # problems one rank reports in full; the rest are counted


def shard_file(split: str, shard: int, array: str) -> str:
    return f"{split}-{shard:05d}.{array}.npy"


class DirDataset(Dataset):
    """The data set in directory ``path``; ``expects``: array names the model reads."""

    def __init__(self, path: str, expects: Sequence[str] = ()):
        self.path, self.expects = os.fspath(path), tuple(expects)
        self.opened: Set[Tuple[str, int]] = set()
        self._files: Dict[Tuple[str, int], Dict[str, _Opened]] = {}
        self.manifest, self.manifest_problem = _read_manifest(self.path)
        self.name = self.manifest.get("name", "data-dir") if self.manifest else "data-dir"

    def _path(self, split: str, shard: int, array: str) -> str:
        return inside(self.path, shard_file(split, shard, array))

    def _problem(self, why: str) -> Problem:
        return setting_problem("{data} {path}: {why}", path=self.path, why=why)

    def size(self, split: str) -> int:
        return sum(self.shard_sizes(split))

    def shard_sizes(self, split: str) -> Tuple[int, ...]:
        if self.manifest is None:
            raise ValueError(worded(self.manifest_problem, {"data": "data directory"}))
        return tuple(self.manifest["splits"][split])

    def problems(self, part: int, parts: int) -> List[Problem]:
        """The manifest's problems (every part), then those of part ``part`` of the shard files."""
        if self.manifest is None:
            return [self._problem(self.manifest_problem)]
        found = self._manifest_problems()
        if found:
            return found
        files = [(split, shard, array) for split in SPLITS for shard in range(len(self.manifest["splits"][split]))
                 for array in sorted(self.manifest["arrays"])]
        start, stop = share_bounds(len(files), part, parts)
        for split, shard, array in files[start:stop]:
            why = self._file_problem(split, shard, array)
            if why:
                found.append(self._problem(why))
        if len(found) > SHOWN:
            found = found[:SHOWN] + [self._problem(f"{len(found) - SHOWN} more shard files with problems")]
        return found

    def _manifest_problems(self) -> List[Problem]:
        manifest = self.manifest
        arrays, splits = manifest.get("arrays"), manifest.get("splits")
        if not isinstance(arrays, dict) or not arrays or not isinstance(splits, dict) or \
                any(not isinstance(splits.get(split), list) or not splits[split] for split in SPLITS):
            return [self._problem(f"{MANIFEST} needs 'arrays' and non-empty 'splits' train and test")]
        found = [self._problem(f"{MANIFEST}: array {name!r} {why}") for name, why in
                 ((name, self._name_problem(name) or _spec_problem(spec)) for name, spec in sorted(arrays.items()))
                 if why]
        bad = [split for split in SPLITS if any(not isinstance(rows, int) or rows < 1 for rows in splits[split])]
        if bad:
            found.append(self._problem(f"{MANIFEST}: every shard of {' and '.join(bad)} needs 1 or more rows"))
        missing = [name for name in self.expects if name not in arrays]
        if missing:
            found.append(self._problem(f"holds arrays {', '.join(sorted(arrays))}; the model reads "
                                       f"{', '.join(self.expects)} (missing {', '.join(missing)})"))
        return found

    def _name_problem(self, name: str) -> Optional[str]:
        """Why array ``name`` cannot name a shard file inside the folder, or None."""
        try:
            self._path("train", 0, name)
        except ValueError:
            return "is not a plain name (its shard files would be outside the folder)"
        return None

    def _file_problem(self, split: str, shard: int, array: str) -> Optional[str]:
        """Why shard file (split, shard, array) does not match the manifest, or None."""
        name = shard_file(split, shard, array)
        spec = self.manifest["arrays"][array]
        rows = self.manifest["splits"][split][shard]
        try:
            shape, dtype, length = npy_file_header(self._path(split, shard, array))
        except FileNotFoundError:
            return f"shard file {name} is missing ({split} shard {shard} of {len(self.manifest['splits'][split])})"
        except (OSError, ValueError) as err:
            return f"shard file {name} is not a readable .npy file: {err}"
        wanted = (rows, *spec["shape"])
        if dtype != np.dtype(spec["dtype"]) or shape != wanted:
            return (f"shard file {name} holds {dtype} {list(shape)}; the manifest says "
                    f"{spec['dtype']} {list(wanted)}")
        if length < nbytes(shape, dtype):
            return f"shard file {name} is truncated ({length} of {nbytes(shape, dtype)} data bytes)"
        return None

    def _shard(self, split: str, shard: int) -> Dict[str, "_Opened"]:
        """Shard (split, shard)'s files, opened the first time; ``InputFileError`` naming a file
        that no longer matches the manifest or was cut since it was opened (one fstat a file)."""
        key = (split, shard)
        if key not in self._files:
            self._files[key] = {array: self._opened(split, shard, array) for array in self.manifest["arrays"]}
            self.opened.add(key)
        for opened in self._files[key].values():
            size = os.fstat(opened.handle.fileno()).st_size
            if size < opened.needs:
                raise opened.cut(size)
        return self._files[key]

    def _opened(self, split: str, shard: int, array: str) -> "_Opened":
        """Shard file (split, shard, array) kept open, once it matches the manifest."""
        path = self._path(split, shard, array)
        why = self._file_problem(split, shard, array)
        if why:
            raise InputFileError(f"data directory {self.path}: {why} (changed since the run checked it)")
        try:
            handle = open_regular(path)
        except (OSError, ValueError) as err:
            raise InputFileError(f"data shard file {path} cannot be opened: {err}") from None
        try:
            shape, dtype, _ = npy_header(handle, os.fstat(handle.fileno()).st_size)
        except (OSError, ValueError) as err:  # changed again in between
            handle.close()
            raise InputFileError(f"data shard file {path} cannot be opened: {err}") from None
        return _Opened(handle, handle.tell(), np.dtype(dtype), tuple(shape))

    def batch(self, split: str, indices: np.ndarray) -> Dict[str, np.ndarray]:
        indices = np.asarray(indices, np.int64)
        _, firsts = shard_layout(self.shard_sizes(split))
        shards = np.searchsorted(firsts, indices, side="right") - 1
        out = {array: np.empty((len(indices), *spec["shape"]), spec["dtype"])
               for array, spec in self.manifest["arrays"].items()}
        for shard in np.unique(shards):
            where = np.flatnonzero(shards == shard)
            rows = indices[where] - firsts[shard]
            for array, opened in self._shard(split, int(shard)).items():
                out[array][where] = opened.rows(rows)
        return out

    def info(self) -> Dict[str, Any]:
        return {**(self.manifest or {}).get("info", {}), **super().info(), "path": self.path}


def _spec_problem(spec: Any) -> Optional[str]:
    """Why an ``arrays`` entry of the manifest is not ``{"dtype": numeric dtype, "shape": [ints >= 1]}``."""
    shape = spec.get("shape") if isinstance(spec, dict) else None
    if not isinstance(shape, list) or any(not isinstance(n, int) or n < 1 for n in shape):
        return "needs a 'shape' of one example: a list of sizes >= 1"
    try:
        dtype = np.dtype(spec.get("dtype"))
    except TypeError:
        return f"has an unknown dtype {spec.get('dtype')!r}"
    return None if dtype.kind in "biuf" else f"has dtype {dtype}, not a number type"


@dataclass
class _Opened:
    """A shard file kept open (``handle``): rows of ``row_shape`` ``dtype`` from byte ``offset``.
    Rows are read (``pread``), never mapped: a file cut meanwhile gives a short read, raised as
    ``InputFileError`` naming it, where reading a mapped page past the file's end is a SIGBUS."""

    handle: BinaryIO
    offset: int
    dtype: np.dtype
    shape: Tuple[int, ...]

    @property
    def row_shape(self) -> Tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def needs(self) -> int:
        """The file's length its header promises."""
        return self.offset + self.shape[0] * self.row_bytes

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed): one read of their span where it is at most
        ``SPAN_READ`` times what they hold (or 1 MiB), else one read a run of consecutive rows."""
        wanted, inverse = np.unique(rows, return_inverse=True)
        first, span = int(wanted[0]), int(wanted[-1]) - int(wanted[0]) + 1
        if span * self.row_bytes <= max(SPAN_READ * len(wanted) * self.row_bytes, 1 << 20):
            values = self._read(first, span)[wanted - first]
        else:
            runs = np.split(wanted, np.flatnonzero(np.diff(wanted) != 1) + 1)
            values = np.concatenate([self._read(int(run[0]), len(run)) for run in runs])
        return values[inverse]

    def _read(self, first: int, count: int) -> np.ndarray:
        size = count * self.row_bytes
        data = os.pread(self.handle.fileno(), size, self.offset + first * self.row_bytes)
        if len(data) < size:
            raise self.cut(os.fstat(self.handle.fileno()).st_size)
        return np.frombuffer(data, self.dtype).reshape(count, *self.row_shape)

    def cut(self, size: int) -> InputFileError:
        return InputFileError(f"data shard file {self.handle.name} was cut to {size} bytes while the run read it "
                              f"({self.needs} needed); restore it (hpcreduce data write) and rerun")


SPAN_READ = 8
"""A batch's rows of one shard file are read in one piece while their span is at most this many
times the bytes they hold."""


def _read_manifest(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(manifest, None), or (None, why it cannot be read)."""
    if not os.path.isdir(path):
        return None, "is not a directory"
    try:
        manifest = read_json(os.path.join(path, MANIFEST))
    except FileNotFoundError:
        return None, f"has no {MANIFEST} (write one with hpcreduce data write)"
    except (OSError, ValueError) as err:
        return None, f"{MANIFEST} cannot be read: {err}"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        return None, f"{MANIFEST} is not format {FORMAT!r} version {VERSION}"
    return manifest, None


def write_data_dir(dataset: Dataset, path: str, *, train_shards: int, test_shards: int,
                   examples: Optional[int] = None) -> Dict[str, Any]:
    """Write ``dataset`` (its first ``examples`` training examples when given) into the new or
    empty directory ``path`` as shards; returns the manifest, written last."""
    if os.path.isdir(path) and os.listdir(path):
        raise OutputFileError(f"{path} is not empty; give a new or empty directory")
    try:
        os.makedirs(path, exist_ok=True)
        counts = {"train": min(examples or dataset.size("train"), dataset.size("train")),
                  "test": dataset.size("test")}
        splits, arrays = {}, {}
        for split, shards in (("train", train_shards), ("test", test_shards)):
            splits[split] = list(even_shards(counts[split], shards))
            _, firsts = shard_layout(splits[split])
            for shard, (first, rows) in enumerate(zip(firsts, splits[split])):
                batch = dataset.batch(split, np.arange(first, first + rows))
                if not isinstance(batch, dict):
                    raise TypeError(f"{dataset.name}: batches are {type(batch).__name__}, not dicts of arrays")
                for array, values in batch.items():
                    values = np.ascontiguousarray(values)
                    arrays[array] = {"dtype": values.dtype.name, "shape": list(values.shape[1:])}
                    with atomic_file(os.path.join(path, shard_file(split, shard, array)), "wb") as out:
                        np.save(out, values)
        info = {key: value for key, value in dataset.info().items()
                if key not in ("name", "train_examples", "test_examples", "train_shards")}
        manifest = {"format": FORMAT, "version": VERSION, "name": dataset.name, "arrays": arrays,
                    "splits": splits, "info": info}
        write_json(os.path.join(path, MANIFEST), manifest)
    except OSError as err:  # an OutputFileError (atomic_file's) names its file already
        raise OutputFileError(f"cannot write the data directory {path}: {err}") from err
    return manifest
