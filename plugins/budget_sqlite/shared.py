"""The SQLite meter's budget counters and concurrency slots in a shared-memory table beside its
database, written behind to the database (issue 27: no write transaction on a call's path).

Charging a call's ``calls``, its ``bytes_in`` and taking and giving back its concurrency slot
were four SQLite write transactions per op. Here every process using the same state directory
maps ``budget.meter`` (260 KiB: 1,024 slots of 256 bytes, its blocks allocated when it is
made, so a full disk is an error then, never a ``SIGBUS`` later) and changes it under an
exclusive ``flock`` (plus a thread lock: one process's threads share the descriptor's lock), so
a check-and-add is exact across processes and threads as the guarded UPSERT was, in a few
microseconds. How the counts stay exact and durable:

- **One truth per counter.** A (grant key, kind) counter lives in the table from its first
  charge on; its value there is the count. It is loaded from the database when first charged
  (under the lock: nobody can charge it in between), and only ever leaves the table by being
  evicted, after the database holds its value. The database is the truth for counters not in
  the table. A key too long for a slot (over ``KEY_MAX`` bytes) is always charged in the
  database, never here, so no counter has two homes.
- **Written behind.** Each process writes the counters it changed to the database (one
  transaction, absolute values, under the table's lock so an older value never overwrites a
  newer one) at most every ``FLUSH_S`` and when it closes. A process that dies leaves its
  changes in the table, which the kernel keeps (a shared file mapping); the next process to open
  the table writes them (``sweep``), and any process charging the counter again does too.
- **An OS crash** (power loss, kernel panic) may lose what the table held and the database did
  not yet: at most ``FLUSH_S`` of charges, as the evidence log's ``interval`` fsync loses at most
  its interval. The table records the boot it was written in; a table from another boot is
  discarded (it may be torn), and the database's counts stand.
- **Concurrency slots** are not durable: a slot dies with its call. A grant's in-flight count
  has one slot (the total) and each process holding some of its slots one more (pid, the pid's
  start time, how many): when the total reaches the limit, the holdings of processes that no
  longer exist are dropped and the count is taken again, so a killed engine never leaks a slot.

All processes sharing a state directory must run this version of the meter (an older one would
charge the database directly, beside the table) and see the same file (one host: a shared
mapping is not coherent across machines, as the rate windows are not; ``window.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import logging
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Protocol

from plugins.budget_sqlite.leases import process_start
from plugins.budget_sqlite.mapped import lock_whole
from policy_engine.budget import exceeded, too_many
from policy_engine.errors import ErrorCode, PolicyEngineError
from policy_engine.model import BUDGET_KINDS
from policy_engine.pid import current as current_pid

log = logging.getLogger(__name__)

SLOTS = 1024
PROBE = 64
SLOT_SIZE = 256
HEADER = 4096
SIZE = HEADER + SLOTS * SLOT_SIZE
FLUSH_S = 0.2
MAGIC = b"PEMETER1"
_HEAD = struct.Struct("<8s16s")  # magic, boot id
# digest of the slot's name, value, value the database holds (VOLATILE: a slot count, never
# written), owner (a holding: its grant's total's digest), pid and pid start, key length, kind
_FIELDS = struct.Struct("<16sqq16sqqHB")
_NUMBERS = struct.Struct("<qq")  # value, flushed at offset 16
KEY_MAX = SLOT_SIZE - _FIELDS.size
_OWNER_AT = 32
VOLATILE = -1
EMPTY = bytes(16)
TOMB = b"\xff" * 16  # a freed holding: probing goes on past it (EMPTY ends a probe)
_KINDS = {kind: i for i, kind in enumerate(BUDGET_KINDS)}
_LEASES = itertools.count(1)  # ``next`` is atomic under the GIL


class Durable(Protocol):
    """The database under the table (``SqliteBudgetMeter``)."""

    def load(self, key: str, kind: str) -> int:
        """What the database holds for ``key``/``kind`` (0 when nothing)."""
        ...

    def save(self, rows: list[tuple[str, str, int]]) -> None:
        """Set each (key, kind) to its value, in one transaction."""
        ...

    def charge(self, key: str, kind: str, amount: int, limit: int | None) -> int:
        """The database's own guarded charge (a key the table does not hold)."""
        ...


class Full(Exception):
    """No slot for a name within its probe range."""


def boot_id() -> bytes:
    """This boot of the machine (Linux ``boot_id``); a constant where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            return hashlib.blake2b(fh.read().strip(), digest_size=16).digest()
    except OSError:
        return b"no-boot-id".ljust(16, b"\0")


def _digest(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"\0".join(parts), digest_size=16).digest()


_NAMES: dict[tuple[bytes, ...], bytes] = {}
_NAMES_MAX = 4096


def _name(*parts: bytes) -> bytes:
    """``_digest(*parts)``, remembered: a call names the same few slots several times."""
    found = _NAMES.get(parts)
    if found is None:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()  # a cache, not a limit
        found = _NAMES[parts] = _digest(*parts)
    return found


class _Flock:
    """``flock`` held for a ``with`` block (a class: a generator context manager costs more
    than the lock itself)."""

    __slots__ = ("fd", "mode", "path")

    def __init__(self, fd: int, mode: int, path: Path) -> None:
        self.fd, self.mode, self.path = fd, mode, path

    def __enter__(self) -> None:
        lock_whole(self.fd, self.mode, SIZE, self.path)  # a truncated file: OSError, no SIGBUS

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class SharedMeter:
    """The table in ``path`` over ``durable``; opened lazily, reopened after a fork.

    :raises OSError: (from every method) the file cannot be opened or mapped.
    """

    def __init__(self, path: Path, durable: Durable, *, flush_s: float = FLUSH_S) -> None:
        self.path = path
        self.durable = durable
        self.flush_s = flush_s
        self._lock = threading.RLock()
        self._pid = -1
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._dirty: set[int] = set()  # offsets of counters this process changed
        self._held: dict[str, str] = {}  # lease -> grant key, this process's slots
        self._me = b""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    # -- the file -------------------------------------------------------------------------

    def _open(self) -> mmap.mmap:
        if self._map is not None and self._pid == current_pid():
            return self._map
        self._map, self._dirty, self._held = None, set(), {}  # a forked child's are the parent's
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < SIZE:  # a new file: zeroes are empty slots
                # blocks, not a hole: a write to a page of a hole on a full disk is a SIGBUS
                os.posix_fallocate(fd, 0, SIZE)
            table = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid, self._map = fd, current_pid(), table
        self._me = b"%d\0%s" % (self._pid, (process_start(self._pid) or "?").encode())
        with self._locked():
            magic, boot = _HEAD.unpack_from(table, 0)
            if magic != MAGIC or boot != boot_id():
                # another boot's table (or none): what it held may be torn; the database's
                # counts stand, and no slot of that boot's processes is still held
                table[:] = bytes(SIZE)
                _HEAD.pack_into(table, 0, MAGIC, boot_id())
            else:
                self._sweep(table)  # what processes that died left unwritten
        return table

    def _locked(self, mode: int = fcntl.LOCK_EX) -> _Flock:
        return _Flock(self._fd, mode, self.path)

    # -- slots --------------------------------------------------------------------------------

    @staticmethod
    def _home(digest: bytes) -> int:
        return int.from_bytes(digest[:4], "little") % SLOTS

    def _find(self, table: mmap.mmap, digest: bytes) -> tuple[int, int]:
        """(offset of the slot named ``digest`` or -1, offset of the best slot to claim or -1).

        A claimable slot is, best first: never used, a freed holding, an idle slot count, a
        counter the database holds, a counter it does not hold yet (claimed after writing it).
        """
        home = self._home(digest)
        best, rank = -1, 9
        for i in range(PROBE):
            at = HEADER + ((home + i) % SLOTS) * SLOT_SIZE
            seen = table[at:at + 16]
            if seen == digest:
                return at, -1
            if seen == EMPTY:  # the name is not further on; an earlier free slot is nearer
                return -1, best if rank <= 2 else at
            if rank <= 1:
                continue
            if seen == TOMB:
                best, rank = at, 1
                continue
            value, flushed = _NUMBERS.unpack_from(table, at + 16)
            if flushed == VOLATILE:
                if value == 0:  # an idle slot count or holding: nothing is held there
                    best, rank = at, 2
            elif value == flushed and rank > 3:
                best, rank = at, 3
            elif rank > 4:
                best, rank = at, 4
        return -1, best

    def _claim(self, table: mmap.mmap, at: int) -> None:
        """Make ``at`` free to reuse: a counter the database does not hold yet is written."""
        if at < 0:
            raise Full
        seen = table[at:at + 16]
        if seen in (EMPTY, TOMB):
            return
        value, flushed = _NUMBERS.unpack_from(table, at + 16)
        if flushed != VOLATILE and value != flushed:
            self.durable.save([self._row(table, at, value)])

    @staticmethod
    def _row(table: mmap.mmap, at: int, value: int) -> tuple[str, str, int]:
        fields = _FIELDS.unpack_from(table, at)
        key = bytes(table[at + _FIELDS.size:at + _FIELDS.size + fields[6]]).decode()
        return key, BUDGET_KINDS[fields[7]], value

    # -- counters -----------------------------------------------------------------------------

    def charge(self, key: str, kind: str, amount: int, limit: int | None) -> int:
        """Add ``amount`` to ``key``'s ``kind`` within ``limit``; the new total.

        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` (nothing added), or the database's
            error when the counter must be loaded from it or written to make room.
        """
        raw = key.encode()
        if len(raw) > KEY_MAX:  # such a key always lives in the database: one home
            return self.durable.charge(key, kind, amount, limit)
        with self._lock:
            table = self._open()
            with self._locked():
                total = self._charge_in(table, key, raw, kind, amount, limit)
            self._wake_flusher()
            return total

    def _charge_in(self, table: mmap.mmap, key: str, raw: bytes, kind: str, amount: int,
                   limit: int | None) -> int:
        """``charge``'s check-and-add, the table locked (``raw``: the key, short enough)."""
        digest = _name(b"c", kind.encode(), raw)
        at, free = self._find(table, digest)
        if at < 0:
            try:
                self._claim(table, free)
            except Full:  # under the lock: nobody loads it into the table meanwhile
                return self.durable.charge(key, kind, amount, limit)
            used = self.durable.load(key, kind)
            _FIELDS.pack_into(table, free, digest, used, used, EMPTY, 0, 0, len(raw),
                              _KINDS[kind])
            table[free + _FIELDS.size:free + _FIELDS.size + len(raw)] = raw
            at = free
        used, flushed = _NUMBERS.unpack_from(table, at + 16)
        if limit is not None and used + amount > limit:
            raise exceeded(key, kind, limit, used, amount)
        total = used + amount
        _NUMBERS.pack_into(table, at + 16, total, flushed)
        if total != flushed:
            self._dirty.add(at)
        return int(total)

    def used(self, key: str) -> dict[str, int]:
        """The table's counts of ``key`` (kinds it does not hold are the database's)."""
        raw = key.encode()
        if len(raw) > KEY_MAX:
            return {}
        found: dict[str, int] = {}
        with self._lock:
            table = self._open()
            with self._locked(fcntl.LOCK_SH):
                for kind in BUDGET_KINDS:
                    at, _ = self._find(table, _digest(b"c", kind.encode(), raw))
                    if at >= 0:  # a counter loaded and refused at once may hold 0
                        found[kind] = _NUMBERS.unpack_from(table, at + 16)[0]
        return found

    # -- writing behind -----------------------------------------------------------------------

    def _wake_flusher(self) -> None:
        if self._wake.is_set():  # already due (``set`` takes a lock and notifies: ≈ 4 µs)
            return
        if self._flusher is None or not self._flusher.is_alive():
            self._stop.clear()
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="policy-engine-meter-flush")
            self._flusher.start()
        self._wake.set()

    def _flush_loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            self._stop.wait(self.flush_s)  # at most one write per interval
            # INVARIANT: cleared before the write reads the table, so a charge made after the
            # read sets it again (and is written at the next interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 — the counts stay in the table; retried
                if not failing:  # once per failure, not at every retry
                    log.error("budget counters in `%s` not yet written to the database "
                              "(retried every %.1fs): %s", self.path, self.flush_s, exc)
                failing = True
                self._wake.set()
            else:
                if failing:
                    log.warning("budget counters in `%s` written to the database again",
                                self.path)
                failing = False

    def flush(self) -> None:
        """Write the counters this process changed to the database now."""
        with self._lock:
            if self._map is None or self._pid != current_pid() or not self._dirty:
                return
            table = self._map
            with self._locked():
                self._write(table, sorted(self._dirty))

    def _sweep(self, table: mmap.mmap) -> None:
        """Write every counter the database does not hold yet (caller holds the lock)."""
        self._write(table, [HEADER + i * SLOT_SIZE for i in range(SLOTS)])

    def _write(self, table: mmap.mmap, offsets: list[int]) -> None:
        rows, done = [], []
        for at in offsets:
            if table[at:at + 16] in (EMPTY, TOMB):
                continue
            value, flushed = _NUMBERS.unpack_from(table, at + 16)
            if flushed != VOLATILE and value != flushed:
                rows.append(self._row(table, at, value))
                done.append((at, value))
        if rows:
            self.durable.save(rows)  # raises: nothing is marked written
        for at, value in done:
            _NUMBERS.pack_into(table, at + 16, value, value)
        self._dirty.difference_update(offsets)

    # -- concurrency slots ----------------------------------------------------------------------

    def acquire(self, key: str, limit: int) -> str | None:
        """Take one of ``limit`` slots of ``key``; the lease, or ``None`` for a key too long
        for the table (the caller counts it in the database, its one home).

        :raises PolicyEngineError: ``QUOTA.BUDGET_EXCEEDED`` when ``limit`` slots are held;
            ``PROVIDER.UNAVAILABLE`` when the table has no slot for the grant's count.
        """
        raw = key.encode()
        if len(raw) > KEY_MAX:
            return None
        with self._lock:
            table = self._open()
            with self._locked():
                self._hold_in(table, key, raw, limit)
            return self._leased(key)

    def acquire_charging(self, key: str, limit: int, kind: str, amount: int,
                         charge_limit: int | None) -> str | None:
        """``acquire`` and ``charge`` of ``kind`` in one step under the table's lock (a call's
        slot and its ``calls``; issue 27): both or neither. ``None`` (nothing done) for a key
        too long for the table: the caller does both in the database.

        :raises PolicyEngineError: either's refusal (nothing taken, nothing charged), or the
            database's error when the counter must be loaded or written.
        """
        raw = key.encode()
        if len(raw) > KEY_MAX:
            return None
        with self._lock:
            table = self._open()
            with self._locked():
                held = self._count_in(table, raw, limit)
                if held >= limit:  # refused before anything is charged
                    raise too_many(key, limit, held)
                self._charge_in(table, key, raw, kind, amount, charge_limit)
                try:
                    self._hold_in(table, key, raw, limit)
                except PolicyEngineError:  # no room for the slot: the charge is taken back
                    self._charge_in(table, key, raw, kind, -amount, None)
                    raise
            self._wake_flusher()
            return self._leased(key)

    def _leased(self, key: str) -> str:
        # a holding is this process's (``_held``): a process-unique name will do, and costs
        # no system call (``new_lease`` reads the kernel's randomness)
        lease = f"t{next(_LEASES):x}"
        self._held[lease] = key
        return lease

    def _count_in(self, table: mmap.mmap, raw: bytes, limit: int) -> int:
        """How many of the key's slots are held, as ``_hold_in`` counts them (the holdings of
        dead processes dropped once ``limit`` is reached); the table locked."""
        total_d = _name(b"t", raw)
        total_at, _ = self._find(table, total_d)
        if total_at < 0:
            return 0
        count = int(_NUMBERS.unpack_from(table, total_at + 16)[0])
        return self._reclaim(table, total_d, total_at) if count >= limit else count

    def _hold_in(self, table: mmap.mmap, key: str, raw: bytes, limit: int) -> None:
        """``acquire``'s check-and-take, the table locked."""
        total_d = _name(b"t", raw)
        mine_d = _name(b"h", raw, self._me)
        total_at, total_free = self._find(table, total_d)
        mine_at, mine_free = self._find(table, mine_d)
        count = _NUMBERS.unpack_from(table, total_at + 16)[0] if total_at >= 0 else 0
        if count >= limit and total_at >= 0:
            count = self._reclaim(table, total_d, total_at)
        if count >= limit:
            raise too_many(key, limit, count)
        try:
            if total_at < 0:
                self._claim(table, total_free)
                _FIELDS.pack_into(table, total_free, total_d, 0, VOLATILE, EMPTY, 0, 0, 0, 0)
                total_at = total_free
                if mine_free == total_at:  # both probed to the same free slot
                    mine_at, mine_free = self._find(table, mine_d)
            if mine_at < 0:
                self._claim(table, mine_free)
                pid, _, start = self._me.partition(b"\0")
                _FIELDS.pack_into(table, mine_free, mine_d, 0, VOLATILE, total_d,
                                  int(pid), _start_number(start), 0, 0)
                mine_at = mine_free
        except Full:
            raise PolicyEngineError(
                ErrorCode.PROVIDER_UNAVAILABLE, f"the concurrency table `{self.path}` "
                "has no free slot near this grant's (more calls in flight than it "
                "holds)", audit={"grant_key": key}) from None
        held = _NUMBERS.unpack_from(table, mine_at + 16)[0]
        _NUMBERS.pack_into(table, mine_at + 16, held + 1, VOLATILE)
        _NUMBERS.pack_into(table, total_at + 16, count + 1, VOLATILE)

    def _reclaim(self, table: mmap.mmap, total_d: bytes, total_at: int) -> int:
        """Drop the holdings of ``total_d``'s grant by processes that no longer exist; the
        grant's count after."""
        count = int(_NUMBERS.unpack_from(table, total_at + 16)[0])
        pos = table.find(total_d, HEADER)
        while pos >= 0:
            at = pos - _OWNER_AT
            if (at - HEADER) % SLOT_SIZE == 0 and table[at:at + 16] not in (EMPTY, TOMB):
                fields = _FIELDS.unpack_from(table, at)
                pid, start, held = fields[4], fields[5], fields[1]
                alive = process_start(pid)
                if alive is None or _start_number(alive.encode()) != start:
                    count -= held
                    _FIELDS.pack_into(table, at, TOMB, 0, VOLATILE, EMPTY, 0, 0, 0, 0)
            pos = table.find(total_d, pos + 1)
        count = max(count, 0)
        _NUMBERS.pack_into(table, total_at + 16, count, VOLATILE)
        return count

    def release(self, key: str, lease: str) -> bool:
        """Give a slot back; ``False`` when ``lease`` is not one of this process's."""
        return self.release_charging(key, lease, [])

    def release_charging(self, key: str, lease: str,
                         charges: list[tuple[str, int, int | None]]) -> bool:
        """``charge`` of each (kind, amount, limit) in order, then ``release``, in one step
        under the table's lock (a contained read's ``bytes_in`` and its slot; issue 27); the
        slot is given back whatever the charges do. ``False`` (nothing done) when ``lease`` is
        not one of this process's.

        :raises PolicyEngineError: the first charge's refusal (those before it charged, it
            and those after not), once the slot was given back.
        """
        with self._lock:
            if self._pid != current_pid() or self._held.get(lease) != key:
                return False
            del self._held[lease]
            raw = key.encode()
            table = self._open()
            refused: PolicyEngineError | None = None
            with self._locked():
                try:
                    for kind, amount, limit in charges:
                        self._charge_in(table, key, raw, kind, amount, limit)
                except PolicyEngineError as exc:
                    refused = exc
                finally:
                    self._unhold_in(table, raw)
            if charges:
                self._wake_flusher()
            if refused is not None:
                raise refused
            return True

    def _unhold_in(self, table: mmap.mmap, raw: bytes) -> None:
        """``release``'s give-back, the table locked."""
        total_d, mine_d = _name(b"t", raw), _name(b"h", raw, self._me)
        mine_at, _ = self._find(table, mine_d)
        if mine_at < 0:  # dropped as a dead process's: this process's pid was reused?
            return
        held = _NUMBERS.unpack_from(table, mine_at + 16)[0]
        # a holding at 0 stays where it is (the next call of the grant finds it at once) and
        # may be claimed by another name (``_find``)
        _NUMBERS.pack_into(table, mine_at + 16, max(held - 1, 0), VOLATILE)
        total_at, _ = self._find(table, total_d)
        if total_at >= 0:
            count = _NUMBERS.unpack_from(table, total_at + 16)[0]
            _NUMBERS.pack_into(table, total_at + 16, max(count - 1, 0), VOLATILE)

    def held(self, key: str) -> int:
        """How many of ``key``'s slots are held (every process)."""
        with self._lock:
            table = self._open()
            with self._locked(fcntl.LOCK_SH):
                at, _ = self._find(table, _digest(b"t", key.encode()))
                return int(_NUMBERS.unpack_from(table, at + 16)[0]) if at >= 0 else 0

    def close(self) -> None:
        """Write what this process changed, stop writing behind, unmap."""
        self._stop.set()
        self._wake.set()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(5)
        with self._lock:
            try:
                self.flush()
            finally:
                if self._map is not None and self._pid == current_pid():
                    self._map.close()
                    os.close(self._fd)
                self._map, self._fd = None, -1


def _start_number(start: bytes) -> int:
    """A pid's start time (``process_start``) as stored in a holding; ``?`` (unknown) is -1."""
    return int(start) if start.isdigit() else -1
