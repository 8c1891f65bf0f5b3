"""Archive: groups in a final state (consumed, dropped, reward_error, curation_error) older than the retention
leave the hot tables for Parquet files (``service.archive.files``), keeping a tombstone each.

Groups the training-health monitors still read are never archived, whatever the retention: those sampled at
a policy version inside the alert window (``current - alert_window_versions`` and newer; the monitors read hot
groups only, so archiving them would resolve their alerts and lift a pause_leases breaker).

The protocol, one batch of groups (pk order) at a time, under one advisory lock (one archiver at a time):

1. read the batch's rows, and in the same statement a fingerprint of each (``repository.group_rows``:
   the md5 of the row's content);
2. write its files, one per (kind, dataset, day), each whole or not at all (``files.Target.write``);
3. in ONE transaction: lock the groups and their trajectories (FOR UPDATE), check every group is still there
   with the content written (the same fingerprints, computed again under the locks), record the files
   (``archive_files``), insert the tombstones, move their stats share to ``stats_archived_cells`` and delete
   the groups rows.

The groups' trajectories, rewards and decisions are not deleted row by row: the tables are partitioned by
group pk range (migration 0015), and after its batches a run drops every range none of whose groups is hot any
more (``service.store.partitions.retire``; the worker does too). Until then those rows stay, unreachable:
every read (GET /v1/groups, export, leases, stats) reaches trajectories through a live group's pk.

A group changed between 1 and 3 (a rescore or recurate that took a dropped group back through scoring and
curation to a final status again, with other rewards: same status, other content) fails the check: the
whole batch stays hot, nothing is recorded, its files are deleted, and the next run archives what is then
stored. The status alone would not tell (A -> B -> A), and deleting then would drop the newer scores with
only the stale copy archived.

A kill at any point leaves each group either hot (step 3 did not commit) or archived (it did): never
neither, never both. Files written by a run that died before step 3 are not recorded; the next run deletes
them before it starts (a batch written again gets the same name anyway): the files whose name carries this
database's archive id (``repository.identity``) and that it has no record of, and its own temporary files.
It never deletes a file another database wrote (another id, or a name from before ids), nor a recorded one
reached through another spelling of the target (a symlink, another mount: files compare by their path below
the root).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from filters.types import TRAINED_ACTIONS
from service.archive import duration, files
from service.archive import repository as repo
from service.policy import service as policy
from service.settings import Settings, get_settings
from service.stats import service as stats
from service.store import partitions

log = logging.getLogger(__name__)

FINAL_STATUSES = repo.FINAL_STATUSES
parse_duration = duration.parse_duration


class ArchiverBusy(RuntimeError):
    """Another archiver holds the lock."""


@dataclass
class ArchiveResult:
    groups: int = 0
    trajectories: int = 0
    files: int = 0
    orphans_removed: int = 0
    skipped: int = 0  # groups that changed between read and record (left hot)
    partitions_dropped: int = 0  # ranges of the partitioned hot tables dropped after the run (all archived)
    locations: list[str] = field(default_factory=list)


def _effective(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectories a trainer trained on: a consumed group's members that a lease delivers (a masked cut
    member, a dropped or remedied one never reaches a trainer)."""
    return [r for r in rows if r["status"] == "consumed" and r["action"] in TRAINED_ACTIONS]


def _partitions(due: list[tuple[int, str, date, str]]) -> dict[tuple[str, date], list[int]]:
    parts: dict[tuple[str, date], list[int]] = defaultdict(list)
    for pk, dataset, day, _status in due:
        parts[(dataset, day)].append(pk)
    return parts


def _write_batch(target: files.Target, rows: list[dict[str, Any]],
                 parts: dict[tuple[str, date], list[int]]) -> list[dict[str, Any]]:
    """Write the batch's files; returns what to record for each (with the pks it covers)."""
    by_pk: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_pk[r["group_pk"]].append(r)
    written = []
    for (dataset, day), pks in sorted(parts.items()):
        part_rows = [r for pk in pks for r in by_pk[pk]]
        for kind, kind_rows in (("all", part_rows), ("effective", _effective(part_rows))):
            if kind == "effective" and not kind_rows:  # "all" always: every tombstone names its file
                continue
            path = target.path(kind, dataset, day, pks[0], pks[-1])
            target.write(path, files.table(kind_rows))
            written.append({"row": {"location": target.location(path), "uri": target.uri(path), "kind": kind,
                                    "dataset": dataset, "day": day, "first_pk": pks[0], "last_pk": pks[-1],
                                    "n_groups": len({r["group_pk"] for r in kind_rows}), "n_rows": len(kind_rows)},
                            "pks": pks, "path": path})
    return written


def fingerprints(pks: list[int], hashes: list[tuple[int, str]]) -> dict[int, tuple[str, ...]]:
    """pk -> its trajectories' ``content_md5`` in index order, from (pk, md5) pairs in that order; a group with
    no row (gone, or no trajectory) maps to ()."""
    out: dict[int, list[str]] = {pk: [] for pk in pks}
    for pk, md5 in hashes:
        out[pk].append(md5)
    return {pk: tuple(h) for pk, h in out.items()}


def _record(session: Session, expected: dict[int, tuple[str, ...]], written: list[dict[str, Any]]) -> bool:
    """Step 3 of the protocol (the caller's one transaction); False (nothing done) when a group is gone or its
    content is no longer what was written (``expected``: ``fingerprints`` at read time)."""
    pks = sorted(expected)
    if repo.lock_groups(session, pks) != set(pks):
        return False
    repo.lock_trajectories(session, pks)
    if fingerprints(pks, repo.content_hashes(session, pks)) != expected:
        return False
    stats.record_archived(session, pks)  # before the rows go: it reads them
    for w in written:
        file_pk = repo.insert_file(session, w["row"])
        if w["row"]["kind"] == "all":
            repo.insert_tombstones(session, w["pks"], file_pk)
    repo.delete_groups(session, pks)
    return True


def _archive_batch(factory: sessionmaker[Session], target: files.Target, due: list[tuple[int, str, date, str]],
                   rows: list[dict[str, Any]], result: ArchiveResult,
                   before_record: Callable[[list[int]], None] | None) -> bool:
    """Steps 2 and 3 for a batch read in step 1, counted into ``result``; False when a group changed meanwhile:
    the batch stays hot (the next run takes it) and its files are deleted (unrecorded, stale)."""
    pks = [d[0] for d in due]
    expected = fingerprints(pks, [(r["group_pk"], r["content_md5"]) for r in rows])
    written = _write_batch(target, rows, _partitions(due))
    if before_record is not None:
        before_record(pks)
    with factory.begin() as session:
        done = _record(session, expected, written)
    if not done:
        result.skipped += len(pks)
        for w in written:
            target.delete(w["path"])
        log.info("archive: a group among pks %d-%d changed while it was archived; the batch stays hot",
                 pks[0], pks[-1])
        return False
    result.groups += len(pks)
    result.trajectories += len(rows)
    result.files += len(written)
    result.locations += [w["row"]["location"] for w in written]
    return True


def remove_orphans(session: Session, target: files.Target) -> int:
    """Delete the files left by this database's interrupted runs: those under the target whose name carries
    its archive id (``target.owner``) and that no recorded file names (compared by their path below the root),
    and its temporary files. Only safe under the archiver's lock."""
    recorded = {files.tail(location) for location in repo.recorded_locations(session)}
    removed = 0
    for path in target.files():
        if target.owns(path) and files.tail(path) not in recorded:
            target.delete(path)
            removed += 1
    for path in target.stale_temps():
        os.unlink(path)
        removed += 1
    return removed


def _retire(factory: sessionmaker[Session]) -> int:
    """Drop the partitions whose groups are all archived now; a failure only waits for the next pass."""
    try:
        return len(partitions.retire(factory))
    except Exception:  # noqa: BLE001 - the groups are archived either way; their bytes go at the next pass
        log.exception("archive: dropping the archived partitions failed; the next pass tries again")
        return 0


def keep_from(session: Session, window_versions: int) -> int:
    """The oldest policy version the monitors still read (``current - window_versions``): groups sampled at it
    or later stay hot."""
    return policy.current_version(session) - window_versions


def archive(engine: Engine, to: str, older_than: timedelta, *, batch_groups: int = 500,
            now: datetime | None = None, on_batch: Callable[[ArchiveResult], None] | None = None,
            window_versions: int | None = None,
            before_record: Callable[[list[int]], None] | None = None) -> ArchiveResult:
    """Archive every group that is final, was created more than ``older_than`` before ``now`` and is outside the
    monitors' window (``window_versions``: ``alert_window_versions`` by default). Raises ArchiverBusy when
    another archiver runs. ``before_record`` is called with a batch's group pks between writing its files and
    the transaction that records them (where a test changes a group, or kills the run)."""
    window = get_settings().alert_window_versions if window_versions is None else window_versions
    cutoff = (now or datetime.now(UTC)) - older_than
    factory = sessionmaker(engine, expire_on_commit=False)
    result = ArchiveResult()
    with engine.connect() as lock_conn:
        if not repo.try_lock(lock_conn):
            raise ArchiverBusy("another archiver is running (it holds the archive lock); try again later")
        lock_conn.commit()
        try:
            with factory.begin() as session:
                target = files.Target.parse(to, repo.identity(session))
                result.orphans_removed = remove_orphans(session, target)
            after = 0
            while True:
                with factory.begin() as session:
                    due = repo.due_groups(session, cutoff, after, batch_groups, keep_from(session, window))
                    rows = repo.group_rows(session, [d[0] for d in due]) if due else []
                if not due:
                    break
                after = due[-1][0]
                if _archive_batch(factory, target, due, rows, result, before_record) and on_batch is not None:
                    on_batch(result)
            result.partitions_dropped = _retire(factory)
        finally:
            repo.unlock(lock_conn)
            lock_conn.commit()
    return result


# -- reading archived groups back ---------------------------------------------------------------------------
def tombstone(session: Session, group_id: str) -> Any:
    """(tombstone, location) of an archived group, or None: ingest answers a re-post from it."""
    return repo.tombstone(session, group_id)


def archived_rows(session_factory: sessionmaker[Session], *, dataset: str | None, statuses: list[str],
                  min_policy_version: int | None, max_policy_version: int | None) -> Any:
    """The archived trajectories (export's row shape), file by file in group order, filtered like an export."""
    with session_factory() as session, session.begin():
        recorded = [(f.uri, f.first_pk) for f in repo.files(session, "all", dataset)]
    for uri, _ in recorded:
        for row in files.export_rows(files.open_file(uri)):
            if row["status"] not in statuses:
                continue
            if min_policy_version is not None and row["policy_version"] < min_policy_version:
                continue
            if max_policy_version is not None and row["policy_version"] > max_policy_version:
                continue
            yield row


# -- on the worker's schedule (GRPO_CURATOR_ARCHIVE_URL, GRPO_CURATOR_RETENTION) ------------------------------
def run_schedule(engine: Engine, settings: Settings, stop: threading.Event) -> None:
    """Until ``stop``: a pass ``min(5 s, archive_every_s)`` after start, then one every ``archive_every_s``."""
    older_than = parse_duration(settings.retention, "GRPO_CURATOR_RETENTION")
    delay = min(5.0, settings.archive_every_s)
    while not stop.wait(delay):
        delay = settings.archive_every_s
        try:
            result = archive(engine, settings.archive_url or "", older_than, batch_groups=settings.archive_batch_groups,
                             window_versions=settings.alert_window_versions)
            if result.groups:
                log.info("archive: %d groups into %d files", result.groups, result.files)
        except ArchiverBusy:
            log.info("archive: another archiver is running; next pass later")
        except Exception:  # the database or the store went away: the next pass tries again
            log.exception("archive pass failed; retrying at the next pass")


def start_schedule(engine: Engine, settings: Settings, stop: threading.Event) -> threading.Thread | None:
    """Start the archive thread when ``archive_url`` is set; None otherwise."""
    if not settings.archive_url:
        return None
    thread = threading.Thread(target=run_schedule, args=(engine, settings, stop), name="archiver", daemon=True)
    thread.start()
    log.info("archive: every %gs to %s, older than %s", settings.archive_every_s, settings.archive_url,
             settings.retention)
    return thread
