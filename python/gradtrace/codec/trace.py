"""Reading and writing gradtrace trace files through the C++ codec.

Every byte of the format is produced and parsed by the C++ codec (proto/),
reached through the extension module ``_gtcodec``; this module only shapes
its results into Python dicts and numpy arrays. See python/README.md.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

import numpy as np

from .. import _gtcodec
from .dtypes import NUMPY_DTYPES, dtype_name, float_to_bf16, is_tensor, tensor_to_numpy

TraceError = _gtcodec.TraceError

_INT64_PATHS = [p.split(".") for p in _gtcodec.int64_paths()]
_STEP_KEYS = {"step", "micro_step", "loss", "valid_tokens", "lr", "reported_grad_norm", "optimizer_step", "input_count",
              "input_sum", "input_sumsq"}
_BUCKET_KEYS = {"step", "micro_step", "bucket_id", "phase", "group", "slices", "bucket_numel", "partition_offset",
                "partition_count", "divisor"}
_SLICE_KEYS = {"param_id", "offset", "values", "mode", "dtype"}


def _ints_from_json(obj, path):
    """Proto JSON prints 64-bit integers as strings; turn the fields at
    ``path`` (from the C++ descriptor) back into ints, in place."""
    if isinstance(obj, list):
        for item in obj:
            _ints_from_json(item, path)
        return
    if not isinstance(obj, dict) or path[0] not in obj:
        return
    if len(path) > 1:
        _ints_from_json(obj[path[0]], path[1:])
        return
    value = obj[path[0]]
    obj[path[0]] = [int(v) for v in value] if isinstance(value, list) else int(value)


def _run_info_from_json(text: str) -> dict:
    run = json.loads(text)
    for path in _INT64_PATHS:
        _ints_from_json(run, path)
    return run


def _run_info_to_json(run_info: dict) -> str:
    """JSON of a user's run_info dict, with the conveniences the writer
    documents: parameter ids default to their index, numel to the product of
    the shape, dtypes in any spelling, non-string ``extra`` values as JSON."""
    run = dict(run_info)
    params = []
    for i, p in enumerate(run.get("params", [])):
        p = dict(p)
        p.setdefault("id", i)
        p["shape"] = [int(d) for d in p.get("shape", [])]
        p.setdefault("numel", int(np.prod(p["shape"], dtype=np.int64)))
        for key in ("dtype", "grad_dtype", "comm_dtype", "accum_dtype"):
            if key in p:
                p[key] = _proto_dtype(p[key])
        params.append(p)
    if params:
        run["params"] = params
    for holder in (run, run.get("config")):
        if isinstance(holder, dict) and "extra" in holder:
            holder["extra"] = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in holder["extra"].items()}
    config = run.get("config")
    if isinstance(config, dict):
        run["config"] = dict(config, **{k: _proto_dtype(config[k]) for k in ("dtype", "comm_dtype") if k in config})
    return json.dumps(run)


def _proto_dtype(dtype):
    """A dtype for proto JSON: common spellings become the enum name; enum
    names (DTYPE_UNSPECIFIED included) and numbers pass through to the parser."""
    if isinstance(dtype, int):
        return dtype
    if isinstance(dtype, str):
        try:
            return dtype_name(dtype)
        except ValueError:
            return dtype  # the proto JSON parser refuses it, naming the field
    return dtype_name(dtype)


class TraceReader:
    """One rank's trace file, read through the C++ codec.

    ``TraceReader(path)`` opens the file and reads its RunInfo; it raises
    :class:`TraceError` if the file cannot be opened or its header/RunInfo is
    bad. ``run_info`` is that RunInfo as a dict (proto field names, enum
    values by name such as ``"FP32"``, every field present, 64-bit ints as
    ints). :meth:`frames` iterates over the StepInfo and BucketRecord frames.

    A truncated file is not an error: iteration returns every complete frame
    and then stops, with ``truncated`` true and ``status`` naming the file and
    offset. A corrupt frame raises :class:`TraceError` (with ``strict=False``
    iteration stops there instead and ``status`` says why).
    """

    def __init__(self, path: str | os.PathLike, *, use_index: bool = True):
        self.path = os.fspath(path)
        self._use_index = use_index
        # No file stays open between calls (a trace set may have thousands
        # of ranks): each pass opens its own C++ reader.
        reader = self._open()
        self.run_info: dict = _run_info_from_json(reader.run_info_json())
        self._has_index = reader.has_index
        self._catalogued = reader.catalogued
        self.format_version: tuple[int, int] = tuple(reader.format_version)
        self._file_size = reader.file_size
        self._random_access = None  # the reader frame_at() keeps
        self.status: str = ""
        self.status_code: str = "ok"
        self.stop_offset: int = 0

    def _open(self):
        return _gtcodec.Reader(self.path, self._use_index)

    def __repr__(self):
        return f"TraceReader({self.path!r}, rank={self.rank}, params={len(self.run_info.get('params', []))})"

    @property
    def rank(self) -> int:
        """The rank the file's RunInfo names."""
        return self.run_info.get("rank", 0)

    @property
    def model_fingerprint(self) -> str:
        """The fingerprint of the file's parameter table (names, shapes, dtypes)."""
        return self.run_info.get("model_fingerprint", "")

    @property
    def has_index(self) -> bool:
        """Whether the file ends with an index frame and footer (closed cleanly)."""
        return self._has_index

    @property
    def catalogued(self) -> bool:
        """Whether the index also catalogues every bucket frame (format 1.1+):
        ``param_ids``, ``group``, ``raw_len``, partition and ``divisor`` per entry."""
        return self._catalogued

    @property
    def file_size(self) -> int:
        """The file's size in bytes when it was opened."""
        return self._file_size

    @property
    def truncated(self) -> bool:
        """True once an iteration of :meth:`frames` met the end of a file cut short."""
        return self.status_code == "truncated"

    @property
    def ok(self) -> bool:
        """True when the last iteration ended cleanly."""
        return self.status_code == "ok"

    def frames(self, *, strict: bool = True, merge_chunks: bool = True) -> Iterator[dict]:
        """Yields each StepInfo and BucketRecord frame as a dict, in file order.

        Every call starts a fresh pass from the first frame (it opens the
        file again), so iterators are independent.

        Step frames: ``{"type": "step", "offset", "step", "micro_step",
        "loss", "valid_tokens", "lr", "reported_grad_norm" (None when not
        reported), "optimizer_step"}``.

        Bucket frames: ``{"type": "bucket", "offset", "step", "micro_step",
        "bucket_id", "phase" ("PRE_REDUCE" | "POST_REDUCE" | "FINAL"),
        "group", "bucket_numel", "partition_offset", "partition_count",
        "divisor", "chunk", "chunk_count", "last_slice_continues",
        "values_from", "slices": [...]}``; ``values_from`` is 0, or (format
        1.6) the offset of the earlier frame whose values a record written by
        reference holds (its slices hold them, as if written again; for a
        merged record, its first chunk's). A record the writer split across frames (above ~4 MiB)
        arrives merged into one dict, its cut slices joined, unless
        ``merge_chunks=False`` (then one dict per chunk, ``chunk`` telling
        which). A record whose chunks a truncated file cut short is dropped,
        like any frame in flight.

        Each slice: ``{"param_id", "offset", "count", "dtype", "mode", ...}``
        and, by mode:

        - ``"full"``: ``"values"``, an ndarray of ``count`` elements in the
          slice's dtype (float32, float16, float64; bf16 as uint16 raw bits,
          see :func:`gradtrace.slice_values` / :func:`gradtrace.bf16_to_float32`);
        - ``"sketch"``: ``"k"``, ``"positions"`` (int64, global element
          indices into the flattened parameter, ascending) and ``"values"``
          (float64, exact widening of the dtype);
        - ``"stats"``: ``"stats"``, a dict with ``count`` (finite elements),
          ``sum``, ``sum_sq``, ``abs_max`` (over finite ones) and ``nonfinite``.

        After the iterator is exhausted, ``status_code`` is "ok", "truncated"
        or, with ``strict=False``, the error's code; ``status`` is the
        message and ``stop_offset`` where reading stopped.
        """
        reader = self._open()
        while True:
            try:
                frame = reader.next(merge_chunks)
            except StopIteration:
                break
            except TraceError as e:
                self._finish(reader, code=getattr(e, "code", "corruption"), message=str(e))
                if strict:
                    raise
                return
            if frame is not None:  # None: a frame type from a newer minor version
                yield frame
        self._finish(reader)
        if self.status_code not in ("ok", "truncated") and strict:
            raise _trace_error(self.status, self.status_code)

    def __iter__(self) -> Iterator[dict]:
        return self.frames()

    def _finish(self, reader, code=None, message=None):
        self.status_code = code or reader.status_code
        self.status = message if message is not None else reader.status_message
        self.stop_offset = reader.stop_offset

    def index(self) -> list[dict]:
        """The index frame's entries (``offset``, ``type``, ``step``,
        ``micro_step``, ``bucket_id``, ``phase``, and the catalogue fields
        ``param_ids``, ``group``, ``raw_len``, ``bucket_numel``,
        ``partition_offset``, ``partition_count``, ``divisor``, which a 1.0
        file leaves empty: see :attr:`catalogued`); empty without an index."""
        return self._open().index() if self._has_index else []

    def frame_at(self, offset: int) -> dict | None:
        """The frame whose header is at ``offset`` (e.g. from :meth:`index`);
        ValueError for an offset outside the data frames. Keeps the file open
        for further calls until the reader is dropped."""
        if self._random_access is None:
            self._random_access = self._open()
        return self._random_access.frame_at(offset)


def _trace_error(message: str, code: str) -> Exception:
    e = TraceError(message)
    e.code = code
    return e


class TraceWriter:
    """Writes one rank's trace file through the C++ codec.

    ``TraceWriter(path, run_info)`` creates ``path`` and writes the file
    header and the RunInfo frame. ``path`` must not exist (TraceError
    "<path>: exists ...", naming the run in it): two runs writing one file
    would corrupt both. ``overwrite=True`` replaces a finished trace on
    purpose; a file another writer still holds open is refused even then. ``run_info`` is a dict in the shape
    :attr:`TraceReader.run_info` returns (proto field names; see
    proto/gradtrace.proto), with conveniences: each parameter's ``id``
    defaults to its index and ``numel`` to the product of its ``shape``;
    dtypes may be spelt "fp32", "float32", "FP32"; ``model_fingerprint`` is
    computed when absent; non-string values in ``extra`` are stored as JSON.
    Unknown keys are an error (ValueError).

    Frames are flushed as written, so a crash loses at most the frame in
    flight. :meth:`close` writes the index and footer; use the writer as a
    context manager, or call it. A writer garbage-collected unclosed is closed
    then; a file whose writer never closed (the process died) reads as
    truncated, with every complete frame.
    """

    def __init__(self, path: str | os.PathLike, run_info: dict, *, mode: str = "full", zstd_level: int | None = None,
                 write_index: bool = True, overwrite: bool = False):
        self.path = os.fspath(path)
        self.mode = _gtcodec.parse_capture_mode(mode)
        # None: the C++ writer's default (WriterOptions, docs/dev/performance.md), not a copy of it.
        args = (self.path, _run_info_to_json(run_info)) + (() if zstd_level is None else (zstd_level,))
        self._writer = _gtcodec.Writer(*args, write_index=write_index, overwrite=overwrite)
        self.run_info: dict = _run_info_from_json(self._writer.run_info_json())
        self.closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing can report it during finalization
                pass

    def __repr__(self):
        return f"TraceWriter({self.path!r}, closed={self.closed})"

    @property
    def bytes_written(self) -> int:
        """Bytes written to the file so far (compressed)."""
        return self._writer.bytes_written

    @property
    def raw_bytes(self) -> int:
        """Serialized protobuf bytes before compression."""
        return self._writer.raw_bytes

    def write_step(self, step: dict) -> None:
        """Appends a StepInfo frame: keys ``step``, ``micro_step``, ``loss``,
        ``valid_tokens``, ``lr`` (missing ones are 0), ``reported_grad_norm``
        (the norm the framework reported; missing or None = not reported) and
        ``optimizer_step`` (True on the frame written after the optimizer step,
        which carries the norm and no loss; FORMAT.md 4.2), and on that frame
        ``input_count``, ``input_sum``, ``input_sumsq`` (the moments of the
        inputs the rank saw in the step; format 1.4, FORMAT.md 4.1)."""
        unknown = set(step) - _STEP_KEYS - {"type", "offset"}
        if unknown:
            raise ValueError(f"unknown StepInfo keys {sorted(unknown)}; expected {sorted(_STEP_KEYS)}")
        self._writer.write_step({k: v for k, v in step.items() if k in _STEP_KEYS})

    def write_bucket(self, record: dict) -> None:
        """Appends a BucketRecord; the C++ codec encodes every slice.

        ``record``: ``step``, ``micro_step``, ``bucket_id``, ``phase``
        (required: "PRE_REDUCE", "POST_REDUCE", "FINAL", any case),
        ``group``, ``bucket_numel``, ``partition_offset``,
        ``partition_count``, ``divisor`` and ``slices``, a list of dicts:

        - ``param_id``: index into ``run_info["params"]``;
        - ``offset``: first element within the flattened parameter (default 0);
        - ``values``: the elements, a numpy array or torch tensor of any
          shape (flattened, copied only if not contiguous): float32, float16,
          float64, a bf16 tensor, or uint16 bf16 bits with ``dtype="bf16"``;
        - ``dtype`` (optional): store as this type, converting the values
          (rounding to nearest even) when they are of another floating type;
        - ``mode`` (optional): "full", "sketch:K" or "stats"; default the
          writer's ``mode``.

        Records larger than a frame are split by the codec into chunks.
        """
        if self.closed:
            raise ValueError(f"write to closed TraceWriter {self.path!r}")
        # What reading gives besides the record's own fields (a read record written again holds its values).
        unknown = set(record) - _BUCKET_KEYS - {"type", "offset", "chunk", "chunk_count", "values_from"}
        if unknown:
            raise ValueError(f"unknown BucketRecord keys {sorted(unknown)}; expected {sorted(_BUCKET_KEYS)}")
        header = {k: v for k, v in record.items() if k in _BUCKET_KEYS and k != "slices"}
        slices = [self._slice_tuple(i, s) for i, s in enumerate(record.get("slices", []))]
        self._writer.write_bucket(header, slices)

    def _slice_tuple(self, i: int, s: dict) -> tuple:
        unknown = set(s) - _SLICE_KEYS
        if unknown:
            raise ValueError(f"slice {i}: unknown keys {sorted(unknown)}; expected {sorted(_SLICE_KEYS)}")
        if "param_id" not in s or "values" not in s:
            raise ValueError(f"slice {i}: needs param_id and values")
        values, dtype = _values_and_dtype(s["values"], s.get("dtype"), f"slice {i}")
        return (int(s["param_id"]), int(s.get("offset", 0)), dtype, values, s.get("mode", self.mode))

    def close(self) -> None:
        """Writes the index frame and footer and closes the file. Idempotent."""
        if not self.closed:
            self.closed = True
            self._writer.close()


def _values_and_dtype(values, requested, where: str):
    """(contiguous 1-D numpy array, codec dtype name) ready for the codec."""
    inferred = None
    if is_tensor(values):
        values, inferred = tensor_to_numpy(values)
    arr = np.asarray(values).reshape(-1)
    want = dtype_name(requested) if requested is not None else None
    if want is None:
        if inferred is not None:
            want = inferred
        elif arr.dtype == np.uint16:
            raise ValueError(f"{where}: uint16 values are ambiguous; pass dtype='bf16' for bf16 bits")
        else:
            want = dtype_name(arr.dtype)
    if want == "BF16":
        if inferred != "BF16" and arr.dtype != np.uint16:
            if not np.issubdtype(arr.dtype, np.floating):
                raise ValueError(f"{where}: cannot store {arr.dtype} values as bf16")
            arr = float_to_bf16(arr)
    elif arr.dtype != NUMPY_DTYPES[want]:
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{where}: cannot store {arr.dtype} values as {want.lower()}")
        arr = arr.astype(NUMPY_DTYPES[want])
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr, want


def read_trace_set(directory: str | os.PathLike) -> list[TraceReader]:
    """Readers for every ``rank-NNNNN.gtrace`` in ``directory``, ordered by rank.

    Raises TraceError when the directory holds no trace file, a ``rank-*.gtrace``
    not named as the writers name them (``rank-1.gtrace``: code
    ``invalid_argument``), or a file whose RunInfo names another rank than its
    file name."""
    directory = os.fspath(directory)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise _trace_error(f"{directory}: cannot list trace set: {e.strerror}", "io_error") from None
    # The C++ rule (proto/rank_file.h), one spelling per rank: a misnamed rank-*.gtrace is a TraceError.
    files = sorted((rank, n) for n in names
                   if (rank := _gtcodec.rank_file_member(os.path.join(directory, n))) is not None)
    if not files:
        raise _trace_error(f"{directory}: no {_gtcodec.RANK_FILE_PATTERN} files", "io_error")
    readers = []
    for rank, name in files:
        reader = TraceReader(os.path.join(directory, name))
        if reader.rank != rank:
            raise _trace_error(f"{reader.path}: file name says rank {rank}, RunInfo says rank {reader.rank}",
                               "mismatch")
        readers.append(reader)
    return readers


def verify(path: str | os.PathLike) -> None:
    """Reads every frame of ``path`` and checks every CRC (as
    ``gradtrace-inspect --verify``); raises TraceError on the first problem."""
    _gtcodec.verify(os.fspath(path))


def sketch_positions(name: str, numel: int, k: int) -> np.ndarray:
    """The sketch positions of parameter ``name`` with ``numel`` elements: the
    first min(k, numel) values of the permutation keyed by the name, sorted
    ascending (int64). Identical to what a ``sketch:K`` slice stores."""
    return _gtcodec.sketch_positions(name, int(numel), int(k))


def model_fingerprint(run_info: dict) -> str:
    """The model fingerprint (hex digest over each parameter's name, shape and
    dtype) the C++ codec computes for ``run_info``."""
    return _gtcodec.model_fingerprint(_run_info_to_json(run_info))
