"""One pass over a chartevents CSV: parallel gzip inflation, Arrow parsing, vitals per charttime;
:class:`StreamUnreadable` hands anything it cannot read to the DuckDB scan. The steps and their
reasons: docs/etl.md, "Module notes".
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from etl.errors import InputError
from etl.sources import TIMESTAMP_FORMAT, Table, gzip_trailer_error
from etl.sql import concept_sql

#: Length of a ``TIMESTAMP_FORMAT`` value with zero-padded fields ('2150-01-01 10:00:00').
_TIMESTAMP_CHARS = 19
#: Arrow types of the four chartevents columns the ETL reads (DuckDB's BIGINT, TIMESTAMP,
#: INTEGER and DOUBLE of etl.mimic.TYPES). charttime is read as its 19 bytes (Arrow refuses a
#: value of another length, and the job goes to DuckDB) and converted by :func:`charttime_us`:
#: fixed-width bytes need no offsets and no UTF-8 check (docs/decisions.md).
ARROW_TYPES = {"stay_id": pa.int64(), "charttime": pa.binary(_TIMESTAMP_CHARS), "itemid": pa.int32(),
               "valuenum": pa.float64()}
#: Bytes of inflated CSV text per parse job (one Arrow batch each, cut at a line end).
BLOCK_BYTES = 8 << 20
#: Parse jobs running at once: Arrow parses a job's text with the GIL released, so two jobs keep
#: both cores of a CI-sized machine busy while one thread inflates and the caller works.
PARSE_WORKERS = 2
#: Most parse jobs held ahead of the consumer (their text and batches: about 12 MiB each); fewer
#: under a small ``--memory-limit``.
MAX_AHEAD = 8
#: Most parse jobs held while a reading started early waits for its consumer (the ETL checks the
#: small tables meanwhile); fewer under a small ``--memory-limit``.
EARLY_AHEAD = 48
#: Nice value added to the threads that parse the jobs of a reading started early (Linux): they
#: take the cores the checks of the small tables leave idle, and slow those checks little. Jobs
#: cut once the consumer is there are parsed at the process's own priority.
EARLY_NICE = 10
#: Text without a line end this long is not a chartevents row: the stream leaves the file to DuckDB.
MAX_LINE_BYTES = 64 << 20
#: stay_id ranges the vital rows are split into (sorted and reduced one at a time).
PARTITIONS = 16
#: Partitions gathered, sorted and reduced at once while the one before them is written: two keep
#: both cores busy at the end of a first run (its reduction then takes about 0.5 s less on 2 cores).
REDUCE_WORKERS = 2
#: Bytes held per buffered vital row (stay_id, charttime, value, code) and the peak factor of the
#: sort and reduction of the partitions reduced at once (each 1 / PARTITIONS of the rows); the
#: buffer spills past memory_limit / SPILL_SHARE.
ROW_BYTES = 25
SPILL_SHARE = 3
#: Schema of the relation (etl/sql/mimic/vitalsign.sql's columns).
SCHEMA = pa.schema([("stay_id", pa.int64()), ("vital", pa.string()), ("charttime", pa.timestamp("us")),
                    ("v", pa.float64()), ("n_rows", pa.int64()), ("n_distinct", pa.int64())])


class StreamUnreadable(Exception):
    """The stream met something it does not read the way DuckDB does; the caller scans with DuckDB.

    Attributes:
        text: for a parse job Arrow refused, the job's text behind the file's header line (a CSV
            of its own; etl.mimic asks DuckDB about it before scanning the whole file), when no
            '"' comes before the job's end (its lines are then whole rows), else None.
        rows_before: data rows of the file before that text.
    """

    def __init__(self, message: str, text: bytes | None = None) -> None:
        super().__init__(message)
        self.text, self.rows_before = text, 0


@dataclass(frozen=True)
class VitalItems:
    """etl/sql/mimic/vital_rows.sql's ``vital_item`` rows as arrays (one entry per itemid).

    ``vitals`` are the vital names sorted (so a vital's code orders as its name, as DuckDB's
    ``ORDER BY vital``); ``vital`` the code of each item's vital.
    """

    itemid: np.ndarray
    vital: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    hi_incl: np.ndarray
    f2c: np.ndarray
    vitals: tuple[str, ...]


def vital_items(text: str | None = None) -> VitalItems:
    """Parse the ``vital_item`` VALUES rows (itemid, vital, lo, hi, hi inclusive, Fahrenheit) of
    a query's text: by default etl/sql/mimic/vital_rows.sql (mimic-code measurement/vitalsign);
    the ETL passes the text of the query whose hash keys the cache entry, so the stream computes
    exactly that query."""
    if text is None:
        text = concept_sql("mimic", "vital_rows", chartevents="chartevents")
    rows = re.findall(r"^\s*\((\d+),\s*'(\w+)',\s*([\d.]+),\s*([\d.]+),\s*(true|false),\s*(true|false)\)",
                      text, flags=re.M)
    if not rows:
        raise RuntimeError("the vital-sign query holds no vital_item rows")
    vitals = tuple(sorted({r[1] for r in rows}))
    return VitalItems(np.array([int(r[0]) for r in rows], np.int32), np.array([vitals.index(r[1]) for r in rows], np.uint8),
                      np.array([float(r[2]) for r in rows]), np.array([float(r[3]) for r in rows]),
                      np.array([r[4] == "true" for r in rows]), np.array([r[5] == "true" for r in rows]), vitals)


def charttime_us(text: pa.Array) -> pa.Array:
    """Timestamps (microseconds) of charttime text (strings, or :data:`ARROW_TYPES`' 19 bytes),
    accepting exactly what the DuckDB scan's ``TIMESTAMP_FORMAT`` accepts in the zero-padded form
    MIMIC-IV writes ('2150-01-01 10:00:00').

    Arrow's ISO 8601 parser also reads '2150-01-01', '2150-01-01T10:00:00', '2150-01-01 10:00'
    and fractions of a second, which the DuckDB scan refuses; a value that is not 19 characters
    with a space at position 10 is therefore left to DuckDB. Within that shape the ISO parser
    and the format agree (both refuse '2150-02-30 10:00:00' and '24:00:00'); a value the ISO parser
    refuses is left to DuckDB too, which reads or refuses it by its own rules (it reads
    '2150-1-1 1:00:00' and a leading blank, for instance).

    Raises:
        StreamUnreadable: some non-empty value is not in that form.
    """
    fast = _charttime_fixed(text)
    if fast is not None:
        return fast
    if pa.types.is_fixed_size_binary(text.type):
        try:
            text = pc.cast(pc.cast(text, pa.binary()), pa.string())
        except pa.ArrowInvalid:
            raise StreamUnreadable("charttime: not UTF-8 text") from None
    ok = pc.and_(pc.equal(pc.utf8_length(text), _TIMESTAMP_CHARS),
                 pc.equal(pc.utf8_slice_codeunits(text, 10, 11), " "))
    if pc.any(pc.invert(ok)).as_py():
        raise StreamUnreadable(f"charttime not written as {TIMESTAMP_FORMAT} with zero-padded fields")
    try:
        return pc.cast(text, pa.timestamp("us"))
    except pa.ArrowInvalid as exc:
        raise StreamUnreadable(f"charttime: {str(exc)[:160]}") from None


def _values(arr: pa.Array, dtype: type, fill=None) -> np.ndarray:
    """The values of a fixed-width Arrow array as NumPy, nulls replaced by ``fill``: a view
    without a copy when there is no null. Read from the buffers because Arrow's ``to_numpy``,
    ``fill_null`` and ``pa.scalar`` import pandas (0.3-0.4 s of the consumer's thread) the first
    time they are called.

    Raises:
        ValueError: the array holds nulls and ``fill`` is None.
    """
    values = np.frombuffer(arr.buffers()[1], dtype, len(arr), arr.offset * np.dtype(dtype).itemsize)
    if not arr.null_count:
        return values
    if fill is None:
        raise ValueError("an array with nulls needs a fill value")
    valid = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), count=arr.offset + len(arr),
                          bitorder="little")[arr.offset:].view(bool)
    return np.where(valid, values, np.asarray(fill, dtype))


def _arrow(values: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """A NumPy array (no nulls) as an Arrow array of ``type`` (default: its dtype's), booleans
    bit-packed, built from its buffers: ``pa.array`` imports pandas the first time (:func:`_values`)."""
    values = np.ascontiguousarray(values)
    if values.dtype == bool:
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))])
    return pa.Array.from_buffers(type or pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def _strings(texts: tuple[str, ...]) -> pa.Array:
    """Arrow strings of ``texts`` (:func:`_arrow`'s reason)."""
    data = [t.encode() for t in texts]
    offsets = np.r_[0, np.cumsum([len(d) for d in data], dtype=np.int64)].astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


#: 'YYYY-MM-DD hh:mm:ss': its separators (position, byte) and its fields (first and end position).
_SEPARATORS = ((4, ord("-")), (7, ord("-")), (10, ord(" ")), (13, ord(":")), (16, ord(":")))
_FIELDS = ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19))


def _charttime_fixed(text: pa.Array) -> pa.Array | None:
    """:func:`charttime_us` of a column without nulls whose every value is a valid
    'YYYY-MM-DD hh:mm:ss' (years 0001 to 9999), read as a (rows, 19) byte matrix with NumPy: about
    half the CPU of Arrow's length checks and cast. None for anything else (a null, another
    length, a character out of place, a field out of range, 2150-02-30), which Arrow's cast then
    reads or refuses as before. Days of the month starts: NumPy's datetime64 (proleptic Gregorian,
    as Arrow and DuckDB)."""
    n = len(text)
    if n == 0 or text.null_count:
        return None
    if pa.types.is_fixed_size_binary(text.type) and text.type.byte_width == _TIMESTAMP_CHARS:
        data, base = text.buffers()[1], text.offset * _TIMESTAMP_CHARS
    elif pa.types.is_string(text.type):
        offsets = np.frombuffer(text.buffers()[1], np.int32, n + 1, text.offset * 4)
        if offsets[-1] - offsets[0] != n * _TIMESTAMP_CHARS or np.any(np.diff(offsets) != _TIMESTAMP_CHARS):
            return None
        data, base = text.buffers()[2], int(offsets[0])
    else:
        return None
    m = np.frombuffer(data, np.uint8, n * _TIMESTAMP_CHARS, base).reshape(n, _TIMESTAMP_CHARS)
    # a stay's vitals charted together repeat one charttime on consecutive rows (about 3 rows
    # per value in MIMIC-IV's order): only the first row of each run of equal text is read, as
    # three 8-byte words that cover its 19 bytes
    words = [np.ndarray((n,), "<u8", buffer=data, offset=base + o, strides=(_TIMESTAMP_CHARS,)) for o in (0, 8, 11)]
    same = np.ones(n - 1, bool)
    for w in words:
        same &= w[1:] == w[:-1]
    heads = np.flatnonzero(np.r_[True, ~same])
    runs = None
    if len(heads) < 0.8 * n:
        runs = np.diff(np.r_[heads, n])
        m = np.take(m, heads, axis=0)
    for pos, ch in _SEPARATORS:
        if not np.all(m[:, pos] == ch):
            return None
    d = m - np.uint8(48)  # a digit -> 0..9, any other byte above 9
    top = d[:, 0].copy()
    fields = []
    for a, b in _FIELDS:
        v = d[:, a].astype(np.int32)
        for k in range(a, b):
            np.maximum(top, d[:, k], out=top)
            if k > a:
                v = v * 10 + d[:, k]
        fields.append(v)
    if top.max() > 9:
        return None
    year, month, day, hour, minute, second = fields
    y0, y1 = int(year.min()), int(year.max())
    if y0 < 1 or month.min() < 1 or month.max() > 12 or day.min() < 1 or hour.max() > 23 \
            or minute.max() > 59 or second.max() > 59:
        return None
    # day number of the first of each month from January y0 to January y1 + 1
    starts = np.arange(np.datetime64(f"{y0:04d}-01", "M"), np.datetime64(f"{y1 + 1:04d}-02", "M")) \
        .astype("datetime64[D]").astype(np.int64)
    ym = (year - y0) * 12 + month - 1
    if np.any(day > np.diff(starts)[ym]):
        return None
    us = ((starts[ym] + (day - 1)) * 86400 + (hour * 3600 + minute * 60 + second)) * 1_000_000
    us = np.ascontiguousarray(us if runs is None else np.repeat(us, runs), np.int64)
    # wrapped without a copy (pa.array would import pandas for a timestamp type)
    return pa.Array.from_buffers(pa.timestamp("us"), n, [None, pa.py_buffer(us)])


#: glibc ``mallopt`` settings for a process that streams chartevents (:func:`hold_freed_memory`):
#: blocks below 256 MiB come from the heap, and up to 1 GiB of freed heap is kept for reuse.
_MALLOPT = ((-3, 256 << 20), (-1, 1 << 30), (-2, 64 << 20))  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD


def hold_freed_memory() -> bool:
    """Let glibc keep the memory the stream frees and hand it out again, instead of returning it
    to the kernel and faulting it back in for the next batch's arrays (each batch allocates and
    frees a few MiB of NumPy and Arrow buffers). On the synthetic default this takes about a quarter
    of the kernel time and 8 % of the wall time off a first ``abps etl`` (docs/decisions.md), for
    about 0.1 GB more peak memory. Process-wide, so the CLI calls it, not the library.

    Returns:
        True when the settings were applied (glibc); False elsewhere (nothing changes).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: other allocators, other settings
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in _MALLOPT)


def streamable(table: Table) -> bool:
    """True for a CSV or gzip CSV chartevents (Parquet is read by DuckDB directly)."""
    return not table.is_parquet


def progress_wanted() -> bool:
    """A progress line only on a terminal, never under pytest or with ``ABPS_NO_PROGRESS`` set."""
    if os.environ.get("PYTEST_CURRENT_TEST") or os.environ.get("ABPS_NO_PROGRESS"):
        return False
    return sys.stderr.isatty()


def memory_bytes(limit: str) -> int:
    """``--memory-limit`` text (``2GB``, ``512MiB``; validated by EtlOptions) as bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*", limit)
    if m is None:
        raise ValueError(f"not a memory size: {limit!r}")
    scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
             "TiB": 2**40}[m.group(2)]
    return int(float(m.group(1)) * scale)


class _Progress:
    """Compressed bytes read, rows parsed, rate and time left (rich), or nothing."""

    def __init__(self, enabled: bool, label: str, total: int) -> None:
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TextColumn("{task.fields[rows]}"), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, rows="0 rows")

    def update(self, done: int, rows: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, rows=f"{rows / 1e6:,.1f} M rows")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


#: A CSV line whose every field is unquoted (no '"') or quoted whole, with '""' inside for a quote.
_QUOTED_LINE = re.compile(rb'(?:"(?:[^"]|"")*"|[^",]*)(?:,(?:"(?:[^"]|"")*"|[^",]*))*\r?')


def utf8_checked(text: bytes | bytearray, size: int) -> None:
    """Raise ``pyarrow.ArrowInvalid`` unless the first ``size`` bytes of ``text`` are UTF-8.

    Arrow's reader checks only the columns it converts; DuckDB's scan refuses a byte that is not
    UTF-8 in any column, so the stream checks the whole text as DuckDB does (Arrow's validation of
    one string over the buffer: about 25 GB/s on a job's 8 MiB, under 0.1 CPU-s for the synthetic
    default's chartevents).
    """
    data = pa.py_buffer(text).slice(0, size)
    offsets = pa.py_buffer(np.array([0, size], dtype=np.int64))
    pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, data]).validate(full=True)


def quotes_closed(text: bytes | bytearray, size: int) -> bool:
    """Whether every line of ``text[:size]`` that holds a '"' is fields quoted whole or without a
    quote. Arrow's quoting reads ``"25"0`` as ``250`` where DuckDB refuses the row, so a job with
    any other line is left to DuckDB (which also reads a quote inside an unquoted field, ``ab"cd``).
    Only the lines around each '"' are matched."""
    pos = text.find(b'"', 0, size)
    while pos >= 0:
        start = text.rfind(b"\n", 0, pos) + 1
        end = text.find(b"\n", pos, size)
        end = size if end < 0 else end
        if _QUOTED_LINE.fullmatch(bytes(text[start:end])) is None:
            return False
        pos = text.find(b'"', end, size)
    return True


class _Buffer:
    """Vital rows split by stay_id range; pieces kept in memory, spilled to Arrow files past a budget."""

    def __init__(self, bounds: np.ndarray, budget: int, scratch: Path) -> None:
        if len(bounds) > 255:
            raise ValueError(f"at most 255 stay_id bounds (256 partitions), got {len(bounds)}")
        self.bounds, self.budget, self.scratch = bounds, budget, scratch
        self.parts: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(len(bounds) + 1)]
        self.files: dict[int, Path] = {}
        self.held = 0

    def add(self, stay: np.ndarray, t: np.ndarray, code: np.ndarray, val: np.ndarray) -> None:
        if len(self.bounds):
            # a stay's rows come together: its partition is looked up once per run of equal
            # stay_ids; partition numbers as uint8, so NumPy's stable sort is a radix sort
            first = np.flatnonzero(np.r_[True, stay[1:] != stay[:-1]])
            part = np.repeat(np.searchsorted(self.bounds, stay[first], side="right").astype(np.uint8),
                             np.diff(np.r_[first, len(stay)]))
            order = np.argsort(part, kind="stable")
            cols = [a.take(order) for a in (stay, t, code, val)]
            ends = np.cumsum(np.bincount(part, minlength=len(self.parts)))
            for k, (a, b) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
                if b > a:
                    self.parts[k].append(tuple(c[a:b] for c in cols))
        else:
            self.parts[0].append((stay, t, code, val))
        self.held += len(stay) * ROW_BYTES
        if self.held > self.budget:
            self.spill()

    def spill(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        for k, pieces in enumerate(self.parts):
            if not pieces:
                continue
            path = self.files.setdefault(k, self.scratch / f"chartevents-part-{k}.arrow")
            tb = pa.table({"s": np.concatenate([p[0] for p in pieces]), "t": np.concatenate([p[1] for p in pieces]),
                           "c": np.concatenate([p[2] for p in pieces]), "v": np.concatenate([p[3] for p in pieces])})
            with path.open("ab") as fh, pa.ipc.new_stream(fh, tb.schema) as w:
                w.write_table(tb)
            pieces.clear()
        self.held = 0

    def partition(self, k: int) -> tuple[np.ndarray, ...] | None:
        pieces = list(self.parts[k])
        self.parts[k] = []
        if k in self.files:
            with self.files[k].open("rb") as fh:
                while fh.peek(1)[:1]:
                    for b in pa.ipc.open_stream(fh):
                        pieces.append(tuple(b.column(i).to_numpy() for i in range(4)))
            self.files.pop(k).unlink()
        if not pieces:
            return None
        return tuple(np.concatenate([p[i] for p in pieces]) for i in range(4))


class ChartBatches:
    """The Arrow batches of a chartevents CSV (gzip or plain) in file order, read ahead on threads.

    One thread inflates the file (ISA-L) and cuts the text at line ends into :data:`BLOCK_BYTES`
    jobs; :data:`PARSE_WORKERS` threads parse the jobs (Arrow, GIL released); at most ``ahead``
    jobs wait for the consumer. Reading starts when the object is made. Lines are cut at ``\\n`` only:
    ``newlines_in_values`` is off, so a line end always ends a row, as in Arrow's own reader.

    Args:
        table: the located chartevents (``read_path``: the file DuckDB would read).
        memory_limit: ``--memory-limit``; bounds ``ahead``.
        progress: show the rich progress line while the batches are consumed.
        early: the reading starts before its consumer is ready (the ETL still checks the other
            tables): up to :data:`EARLY_AHEAD` jobs wait until the first batch is taken, and on
            Linux the jobs cut before then are parsed by threads :data:`EARLY_NICE` nice levels
            below the process, so that they use the cores the checks leave idle.

    Iterating raises :class:`StreamUnreadable` for text the stream does not read (a damaged gzip,
    a malformed row): the caller scans the file with DuckDB instead; and
    :class:`etl.errors.InputError` naming the file for a gzip stream that ends inside a member.
    """

    def __init__(self, table: Table, memory_limit: str = "2GB", progress: bool = False, early: bool = False) -> None:
        self.table, self.progress = table, progress
        self.rows = 0
        fit = max(4, memory_bytes(memory_limit) // SPILL_SHARE // (12 << 20))
        self._ahead = min(MAX_AHEAD, fit)
        self._jobs: queue.Queue = queue.Queue(min(EARLY_AHEAD, fit) if early else self._ahead)
        self._stop = threading.Event()
        self._consumer = threading.Event()  # set when the first batch is asked for
        self._pool = ThreadPoolExecutor(PARSE_WORKERS, thread_name_prefix="chartevents-parse")
        # the jobs cut before the consumer is there: parsed at a lower priority (Linux), by threads
        # of their own, since an unprivileged thread cannot raise its priority again
        self._early_pool = (ThreadPoolExecutor(PARSE_WORKERS, thread_name_prefix="chartevents-early",
                                               initializer=_lower, initargs=(EARLY_NICE,))
                            if early and sys.platform == "linux" else None)
        if not early:
            self._consumer.set()
        self._read = 0  # compressed bytes read
        self._used = False
        self._spare: queue.SimpleQueue[bytearray] = queue.SimpleQueue()  # text buffers of parsed jobs
        self._header_line = b""  # the file's first line, set before the first job is queued
        self._unquoted = True  # no '"' in the jobs queued so far
        names = list(table.columns)
        # the parse options of text with a '"' (DuckDB's quoting rules) and of text without one
        # (most jobs: the open MIMIC-IV demo's chartevents holds no quote character), which Arrow
        # tokenises about a fifth faster with quoting off and reads exactly as quoting on would
        self._parse_opts = {quoted: pacsv.ParseOptions(delimiter=",", quote_char='"' if quoted else False,
                                                      double_quote=quoted, escape_char=False,
                                                      newlines_in_values=False, ignore_empty_lines=False)
                            for quoted in (True, False)}
        # charttime stays bytes here; charttime_us converts it (VitalPass._vital_rows)
        self._convert_opts = pacsv.ConvertOptions(include_columns=list(ARROW_TYPES), column_types=ARROW_TYPES,
                                                  null_values=[""], quoted_strings_can_be_null=True)
        self._read_opts = [pacsv.ReadOptions(column_names=names, skip_rows=skip, block_size=2 * BLOCK_BYTES,
                                             use_threads=False) for skip in (0, 1)]
        self._thread = threading.Thread(target=self._produce, name="chartevents-read", daemon=True)
        self._thread.start()

    def _submit(self, text: bytearray, size: int, header: bool):
        pool = self._pool if self._early_pool is None or self._consumer.is_set() else self._early_pool
        quoted = text.find(b'"', 0, size) >= 0
        # no '"' from the file's start to this job's end: its lines are whole rows (a quoted value
        # may hold a line end, and a cut inside it would give a text DuckDB refuses on its own)
        self._unquoted = self._unquoted and not quoted
        return pool.submit(self._parse, text, size, header, quoted, self._unquoted)

    def _parse(self, text: bytearray, size: int, header: bool, quoted: bool, rows_whole: bool = False) -> pa.Table:
        """Arrow's table of the first ``size`` bytes of ``text``; ``text`` is then handed back for
        the next job's inflation (the table holds copies of the values, not views of the text).
        ``rows_whole``: the text is whole rows (no quote before it), given with the refusal."""
        try:
            if quoted and not quotes_closed(text, size):
                raise pa.ArrowInvalid("a quoted field followed by more text")
            utf8_checked(text, size)
            return pacsv.read_csv(pa.BufferReader(pa.py_buffer(text).slice(0, size)),
                                  read_options=self._read_opts[header], parse_options=self._parse_opts[quoted],
                                  convert_options=self._convert_opts)
        except pa.ArrowInvalid as exc:
            whole = (b"" if header else self._header_line) + bytes(text[:size]) if rows_whole else None
            raise StreamUnreadable(f"ArrowInvalid: {str(exc)[:160]}", whole) from None
        finally:
            if self._spare.qsize() < self._ahead + PARSE_WORKERS:
                self._spare.put(text)

    def _text_buffer(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes: one a finished job handed back, else a new one
        (a new bytearray is zero-filled, which costs about as much as inflating 1 MiB of text)."""
        try:
            buf = self._spare.get_nowait()
        except queue.Empty:
            return bytearray(size)
        return buf if len(buf) >= size else bytearray(size)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._jobs.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        """Inflate the file into job buffers (ISA-L's reader writes the text straight into each
        job's buffer, with the GIL released), cut each at its last line end and queue its parse."""
        path = self.table.read_path
        try:
            with path.open("rb") as raw:
                if path.name.endswith(".gz"):
                    from isal import igzip

                    # the reader under igzip.open's buffered file (docs/decisions.md, "ETL: text
                    # inflated into the parse jobs' buffers"): its readinto inflates straight into
                    # the buffer it is given
                    text = igzip._IGzipReader(raw, 1 << 20)
                else:
                    text = raw
                try:
                    header, rest = True, b""
                    while not self._stop.is_set():
                        buf = self._text_buffer(len(rest) + BLOCK_BYTES)
                        held = len(rest)
                        buf[:held] = rest
                        got = text.readinto(memoryview(buf)[held:held + BLOCK_BYTES])
                        self._read = raw.tell()
                        end = held + got
                        if not got:
                            if end and not self._put(self._submit(buf, end, header)):
                                return
                            break
                        cut = buf.rfind(b"\n", 0, end) + 1
                        if not cut:
                            if end > MAX_LINE_BYTES:
                                raise StreamUnreadable(f"no line end in {MAX_LINE_BYTES >> 20} MiB of text")
                            rest = bytes(buf[:end])
                            continue
                        rest = bytes(buf[cut:end])
                        if header:
                            self._header_line = bytes(buf[:buf.find(b"\n", 0, cut) + 1])
                        if not self._put(self._submit(buf, cut, header)):
                            return
                        header = False
                finally:
                    text.close()
            self._put(None)
        except (StreamUnreadable, MemoryError) as exc:  # handed to the consumer
            self._put(exc)
        except EOFError:
            # the gzip stream ends inside a member (a download cut short): DuckDB's scan would
            # fail there too, after reading the whole file again, so the stream says it now
            self._put(InputError(f"{self.table.path}: unreadable gzip (the compressed data ends early)"))
        except Exception as exc:  # a damaged gzip (ISA-L's IsalError, OSError): DuckDB words it,
            # except a failed trailer check, which DuckDB's reader does not make
            self._put(gzip_trailer_error(self.table.path, exc)
                      or StreamUnreadable(f"{exc.__class__.__name__}: {str(exc)[:160]}"))
        except BaseException as exc:
            self._put(exc)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._used:
            raise RuntimeError("ChartBatches is read once")
        self._used = True
        with self._jobs.mutex:  # the consumer is here: only the usual few jobs wait from now on
            self._jobs.maxsize = self._ahead
        self._consumer.set()
        bar = _Progress(self.progress, f"chartevents ({self.table.path.name})", self.table.read_path.stat().st_size)
        try:
            while True:
                item = self._jobs.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                for batch in item.result().to_batches():
                    self.rows += batch.num_rows
                    bar.update(self._read, self.rows)
                    yield batch
        except StreamUnreadable as exc:
            exc.rows_before = self.rows
            raise
        except (pa.ArrowException, OSError, EOFError, ValueError) as exc:
            raise StreamUnreadable(f"{exc.__class__.__name__}: {str(exc)[:160]}") from None
        finally:
            bar.close()
            self.close()

    def close(self) -> None:
        """Stop reading and release the threads (idempotent)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                item = self._jobs.get(timeout=0.1)
                if item is not None and not isinstance(item, BaseException):
                    item.cancel()
            except queue.Empty:
                pass
        self._thread.join()
        while not self._jobs.empty():
            item = self._jobs.get_nowait()
            if item is not None and not isinstance(item, BaseException):
                item.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._early_pool is not None:
            self._early_pool.shutdown(wait=True, cancel_futures=True)


def _lower(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux: ``setpriority`` on a thread id
    sets that thread's alone); a refusal leaves it as it is."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass


def window_mask(stay: np.ndarray, t: np.ndarray, window: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """True where a row of stay ``stay`` (int64) charted at ``t`` (microseconds) lies in
    ``window`` = ``(stay_ids sorted and unique, start_us, end_us)``, in [start, end]. The stays
    are looked up once per run of equal stay_ids (chartevents lists a stay's rows together)."""
    ids, start, end = window
    if not len(ids) or not len(stay):
        return np.zeros(len(stay), bool)
    first = np.flatnonzero(np.r_[True, stay[1:] != stay[:-1]])
    pos = np.minimum(np.searchsorted(ids, stay[first]), len(ids) - 1)
    known = ids[pos] == stay[first]
    runs = np.diff(np.r_[first, len(stay)])
    # each run's bounds, spread over its rows; a stay outside the window gets an empty one
    lo = np.repeat(np.where(known, start[pos], np.iinfo(np.int64).max), runs)
    hi = np.repeat(np.where(known, end[pos], np.iinfo(np.int64).min), runs)
    return (t >= lo) & (t <= hi)


def in_window(part: pa.Table, window: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pa.Table:
    """The rows of ``part`` (stay_id, charttime columns) inside ``window`` (:func:`window_mask`)."""
    stay = _values(part.column("stay_id").combine_chunks(), np.int64)
    t = _values(part.column("charttime").combine_chunks(), np.int64)  # microseconds
    return part.filter(_arrow(window_mask(stay, t, window)))


def _bits(n: int) -> int:
    return max(int(n).bit_length(), 1)


def reduce_partition(stay: np.ndarray, t: np.ndarray, code: np.ndarray, val: np.ndarray,
                     items: VitalItems) -> pa.Table:
    """Vitals per (stay_id, vital, charttime) of one partition's valid vital rows, sorted by
    stay_id, charttime, vital (etl/sql/mimic/vital_rows.sql + vitalsign.sql).

    Args:
        stay, t: stay_id and charttime (microseconds), int64; code: ``vital << 4 | item index``
            (uint8, item index into ``items``); val: valuenum (float64, inside its valid range).

    Returns:
        Arrow table of :data:`SCHEMA`: ``v`` the mean of the distinct values (Fahrenheit items
        converted first), ``n_rows`` the source rows and ``n_distinct`` the distinct rows behind it.
    """
    n = len(stay)
    smin, tmin = int(stay.min()), int(t.min())
    unit = 1_000_000 if not np.any(t % 1_000_000) else 1
    tt = (t - tmin) // unit
    bs, bt = _bits(int(stay.max()) - smin), _bits(int(tt.max()))
    if bs + bt + 8 <= 64:
        key = ((stay - smin).astype(np.uint64) << np.uint64(bt + 8)) | (tt.astype(np.uint64) << np.uint64(8)) \
            | code.astype(np.uint64)
        order = np.argsort(key, kind="stable")
        key = key.take(order)
        same_row = key[1:] == key[:-1]
        val = val.take(order)
    else:  # ranges too wide to pack: sort on the columns
        order = np.lexsort((code, tt, stay))
        key = None
        stay, t, tt, code, val = (a.take(order) for a in (stay, t, tt, code, val))
        same_row = (stay[1:] == stay[:-1]) & (tt[1:] == tt[:-1]) & (code[1:] == code[:-1])
    if same_row.any():  # runs of one (stay, charttime, item): order their values
        starts = np.flatnonzero(np.r_[True, ~same_row])
        lengths = np.diff(np.r_[starts, n])
        multi = np.repeat(lengths > 1, lengths)
        idx = np.flatnonzero(multi)
        run = np.repeat(np.arange(len(starts)), lengths)[idx]
        sub = idx[np.lexsort((val[idx], run))]
        val[idx] = val[sub]
    new_row = np.r_[True, ~same_row | (val[1:] != val[:-1])]
    d = np.flatnonzero(new_row)
    n_rows_d = np.diff(np.r_[d, n])
    if key is not None:  # the distinct rows' columns read back from the sorted key
        kd = key.take(d)
        sd = (kd >> np.uint64(bt + 8)).astype(np.int64) + smin
        td = ((kd >> np.uint64(8)) & np.uint64((1 << bt) - 1)).astype(np.int64) * unit + tmin
        cd = (kd & np.uint64(255)).astype(np.uint8)
    else:
        sd, td, cd = stay.take(d), t.take(d), code.take(d)
    item = cd & 15
    vd = val.take(d)
    vd = np.where(items.f2c[item], (vd - 32) / 1.8, vd)
    vital = cd >> 4
    new_group = np.r_[True, (sd[1:] != sd[:-1]) | (td[1:] != td[:-1]) | (vital[1:] != vital[:-1])]
    if new_group.all():  # one distinct row per group (the common case): its value and count
        g, n_distinct, mean, n_rows = slice(None), np.ones(len(d), np.int64), vd, n_rows_d
    else:
        g = np.flatnonzero(new_group)
        n_distinct = np.diff(np.r_[g, len(d)])
        mean = np.add.reduceat(vd, g) / n_distinct
        n_rows = np.add.reduceat(n_rows_d, g)
    return pa.table([_arrow(sd[g]), _strings(items.vitals).take(_arrow(vital[g])), _arrow(td[g], pa.timestamp("us")),
                     _arrow(mean), _arrow(n_rows.astype(np.int64)), _arrow(n_distinct.astype(np.int64))],
                    schema=SCHEMA)


class VitalPass:
    """One pass over chartevents -> its vitals per charttime, partition by partition (module doc).

    Args:
        table: the located chartevents (CSV or gzip CSV; ``read_path`` is the file DuckDB would
            read, without gzip padding).
        bounds: sorted stay_id boundaries of the partitions (e.g. icustays quantiles).
        memory_limit: ``--memory-limit``; rows past a third of it are spilled under ``scratch``.
        progress: show the rich progress line.
        items: the vital items (default :func:`vital_items`).
        window: ``(stay_ids, start_us, end_us)``, stay_ids sorted and unique: keep only rows of
            these stays charted in [start, end], bounds included (the cache entry's exact window,
            or the kept stays' within a second, which SQL then applies exactly). None: every
            stay, the whole file.
        batches: the file's :class:`ChartBatches`, when its reading was started before (the
            pass consumes and closes them); by default the pass starts the reading itself.

    Attributes after :meth:`run`: ``rows`` (data rows parsed), ``vital_rows`` (valid vital rows
    kept), ``out_rows`` (rows of the relation), ``seconds`` (``read_s``: inflate, parse and
    split; ``reduce_write_s``: sort, reduce and hand each partition to the sink).
    """

    def __init__(self, table: Table, bounds: np.ndarray, memory_limit: str, scratch: Path,
                 progress: bool = False, items: VitalItems | None = None,
                 window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                 batches: ChartBatches | None = None) -> None:
        self.table, self.bounds, self.scratch, self.progress = table, np.asarray(bounds, np.int64), scratch, progress
        self.batches = batches
        self.memory_limit = memory_limit
        self.window = window
        self.budget = max(memory_bytes(memory_limit) // SPILL_SHARE, 64 << 20)
        self.items = items or vital_items()
        it = self.items
        # per itemid, from 0 to the largest vital itemid (MIMIC-IV's are six digits) and one entry
        # past it for every larger id: an item's valid range as lo < value < hi_open (an inclusive
        # upper bound becomes the next double above it: value <= hi exactly when value <
        # nextafter(hi, +inf)); any other item gets the empty range (+inf, -inf). And its code,
        # vital << 4 | index into the items.
        size = int(it.itemid.max()) + 2
        self._lo, self._hi_open = np.full(size, np.inf), np.full(size, -np.inf)
        self._lo[it.itemid] = it.lo
        self._hi_open[it.itemid] = np.where(it.hi_incl, np.nextafter(it.hi, np.inf), it.hi)
        self._code = np.zeros(size, np.uint8)
        self._code[it.itemid] = (it.vital << 4) | np.arange(len(it.itemid), dtype=np.uint8)
        self.rows = self.vital_rows = self.out_rows = 0
        self.seconds: dict[str, float] = {}

    def _vital_rows(self, batch: pa.RecordBatch) -> tuple[np.ndarray, ...] | None:
        charttime = charttime_us(batch.column("charttime"))  # every row: DuckDB's scan converts them all
        # a null itemid, a negative one: entry 0, a larger one: the last entry (no vital there)
        item = _values(batch.column("itemid"), np.int32, -1)
        if any((pc.min(batch.column(c)).as_py() or 0) < 0 for c in ("stay_id", "itemid")):
            # Arrow reads a hexadecimal id past the type's range as a negative number where DuckDB
            # refuses it (0xFFFFFFFF as itemid -1); no MIMIC-IV id is negative
            raise StreamUnreadable("a negative stay_id or itemid")
        val = _values(batch.column("valuenum"), np.float64, np.nan)
        with np.errstate(invalid="ignore"):
            ok = (val > self._lo.take(item, mode="clip")) & (val < self._hi_open.take(item, mode="clip"))
        stay_col = batch.column("stay_id")
        if stay_col.null_count or charttime.null_count:
            # some row lacks a stay_id or a charttime: refused when it is a valid vital row
            sel = np.flatnonzero(ok)
            stay_col, charttime = stay_col.take(_arrow(sel)), charttime.take(_arrow(sel))
            if stay_col.null_count or charttime.null_count:
                raise StreamUnreadable("a vital row without stay_id or charttime")
            ok = ok[sel]
        else:
            sel = None
        stay, t = _values(stay_col, np.int64), _values(charttime, np.int64)
        if self.window is not None:
            ok &= window_mask(stay, t, self.window)
        keep = np.flatnonzero(ok)
        if not len(keep):
            return None
        rows = keep if sel is None else sel.take(keep)
        return stay.take(keep), t.take(keep), self._code.take(item.take(rows), mode="clip"), val.take(rows)

    def run(self, sink: Callable[[pa.Table], None]) -> None:
        """Read the file once and call ``sink(part)`` with each partition's relation, in
        (stay_id, charttime, vital) order overall.

        Raises:
            StreamUnreadable: the stream cannot read the file the way DuckDB does (nothing was
                given to ``sink`` then, unless the failure came after the read).
        """
        buf = _Buffer(self.bounds, self.budget, self.scratch)
        t0 = time.perf_counter()
        batches, self.batches = self.batches or ChartBatches(self.table, self.memory_limit), None
        batches.progress = self.progress
        try:
            try:
                for batch in batches:
                    cols = self._vital_rows(batch)
                    if cols is not None:
                        self.vital_rows += len(cols[0])
                        buf.add(*cols)
            finally:
                batches.close()
                self.rows = batches.rows
            self.seconds["read_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            # the next REDUCE_WORKERS partitions are gathered, sorted and reduced (NumPy, GIL
            # released) while partition k is written and aggregated (Parquet writer, DuckDB)
            def reduced(k: int) -> pa.Table | None:
                cols = buf.partition(k)
                return None if cols is None else reduce_partition(*cols, self.items)

            n = len(buf.parts)
            with ThreadPoolExecutor(REDUCE_WORKERS, thread_name_prefix="chartevents-reduce") as pool:
                parts = [pool.submit(reduced, k) for k in range(min(REDUCE_WORKERS, n))]
                for k in range(n):
                    if k + REDUCE_WORKERS < n:
                        parts.append(pool.submit(reduced, k + REDUCE_WORKERS))
                    part, parts[k] = parts[k].result(), None
                    if part is not None:
                        self._sink(part, sink)
            self.seconds["reduce_write_s"] = time.perf_counter() - t0
        finally:
            for path in buf.files.values():
                path.unlink(missing_ok=True)

    def _sink(self, part: pa.Table, sink: Callable[[pa.Table], None]) -> None:
        self.out_rows += part.num_rows
        sink(part)
