"""The export's statements: stored trajectories with their group and prompt, in (group, index) order, read
one keyset page of whole groups at a time (``group_page`` then ``page_rows``), each page in a short
transaction of its own, so memory stays constant in the number of rows and no transaction outlives a page."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Text, any_, func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, Trajectory
from service.store.queries import array_param, rewards_column


def _filtered(stmt: Any, *, dataset: str | None, min_policy_version: int | None, max_policy_version: int | None,
              statuses: list[str]) -> Any:
    stmt = stmt.where(Group.status.in_(statuses))
    if dataset is not None:
        stmt = stmt.where(Group.dataset == dataset)
    if min_policy_version is not None:
        stmt = stmt.where(Group.policy_version >= min_policy_version)
    if max_policy_version is not None:
        stmt = stmt.where(Group.policy_version <= max_policy_version)
    return stmt


def _pk_range(column: Any, pks: list[int]) -> tuple[Any, ...]:
    """``column`` in ``pks`` (one array parameter: the statement's text is the same for every page), said also
    as the range they span: the planner then reads a partitioned table by its (group_pk, ...) index and prunes
    its partitions, whatever its statistics say -- with the list alone, a table filled but not yet analyzed got
    a sequential scan of all its rows per page (measured: a 100k-trajectory export read the whole table 100
    times, 37 ms a page instead of 5)."""
    return column == any_(array_param("pks", pks, BigInteger)), column.between(min(pks), max(pks))


def group_bytes(session: Session, pks: list[int]) -> dict[int, int]:
    """About how many bytes each group's rows read: its trajectories' messages and metadata as JSON text, and
    their token arrays (read by the rollouts export)."""
    t = Trajectory.__table__
    # the whole arrays: the stored bytes and, when a member's prompt is stored once for its group, the prefix's
    whole = ((t.c.token_ids, 4), (t.c.loss_mask, 1), (t.c.logprobs, 4))
    arrays = sum((func.coalesce(func.octet_length(c) + t.c.prefix_len * size, 0) for c, size in whole),
                 start=func.octet_length(t.c.metadata.cast(Text)))
    size = func.sum(func.octet_length(t.c.messages.cast(Text)) + arrays)
    stmt = select(t.c.group_pk, size).where(*_pk_range(t.c.group_pk, pks)).group_by(t.c.group_pk)
    return {pk: int(n or 0) for pk, n in session.execute(stmt)}


def group_page(session: Session, *, after_pk: int, max_rows: int, dataset: str | None,
               min_policy_version: int | None, max_policy_version: int | None, statuses: list[str],
               max_bytes: int | None = None) -> list[int]:
    """The pks of the next groups after ``after_pk`` (in pk order) that match, as many as fit in ``max_rows``
    trajectories and (with ``max_bytes``) about that many bytes of trajectory JSON (at least one group)."""
    stmt = select(Group.pk, Group.n_trajectories).where(Group.pk > after_pk).order_by(Group.pk).limit(max_rows)
    stmt = _filtered(stmt, dataset=dataset, min_policy_version=min_policy_version,
                     max_policy_version=max_policy_version, statuses=statuses)
    pks, rows = [], 0
    for pk, n in session.execute(stmt):
        if pks and rows + n > max_rows:
            break
        pks.append(pk)
        rows += n
    if max_bytes is None or len(pks) <= 1:
        return pks
    sizes, read = group_bytes(session, pks), 0
    for i, pk in enumerate(pks):
        read += sizes.get(pk, 0)
        if i and read > max_bytes:
            return pks[:i]
    return pks


def page_rows(session: Session, pks: list[int], *, statuses: list[str], with_rewards: bool,
              with_arrays: bool = False, with_reference: bool = False, members: bool = True) -> list[dict[str, Any]]:
    """One dict per trajectory of the groups ``pks`` (still in ``statuses``), ordered by group then index;
    ``with_arrays``: the stored token ids / log-probs / loss masks (bytes); ``with_reference``: the prompt's;
    not ``members``: one dict per group that has trajectories, its group's and prompt's keys only (what an
    export of one row per prompt reads: no member's messages are read or sent).
    Each prompt is read once per page (a second statement), and the page's rows of one prompt share its
    values -- read-only, like every value of a row: a page has many rows per prompt (a group's members), and
    reading its messages per row was a fifth of the page's time."""
    columns = [
        Group.pk.label("group_pk"), Group.id.label("group_id"), Group.prompt_id, Group.dataset,
        Group.policy_version, Group.status.label("group_status"), Group.reward_spec_name, Group.reward_spec_version,
    ]
    in_range = Trajectory.group_pk.between(min(pks), max(pks))
    if not members:
        has_members = select(Trajectory.group_pk).where(Trajectory.group_pk == Group.pk, in_range).exists()
        stmt = select(*columns).where(*_pk_range(Group.pk, pks), Group.status.in_(statuses), has_members)
        return _with_prompts(session, session.connection().execute(stmt.order_by(Group.pk)), with_reference)
    columns += [
        Trajectory.idx, Trajectory.messages, Trajectory.final_answer, Trajectory.finish_reason,
        Trajectory.num_tokens, Trajectory.num_turns, Trajectory.metadata_.label("metadata"), Trajectory.total_reward,
        Trajectory.outcome, Trajectory.advantage, Trajectory.action, Trajectory.reason,
        Trajectory.segments, Trajectory.segment_advantages,
    ]
    if with_rewards:
        columns.append(rewards_column().label("rewards"))
    if with_arrays:
        columns += [Trajectory.token_ids, Trajectory.logprobs, Trajectory.loss_mask]
    stmt = (
        select(*columns)
        .join(Trajectory, Trajectory.group_pk == Group.pk)
        .where(*_pk_range(Group.pk, pks), Group.status.in_(statuses), in_range)
        .order_by(Group.pk, Trajectory.idx)
    )
    # plain rows: no ORM loading step for a select of columns
    return _with_prompts(session, session.connection().execute(stmt), with_reference)


def _with_prompts(session: Session, result: Any, with_reference: bool) -> list[dict[str, Any]]:
    """``result``'s rows as dicts, each with its prompt's messages and metadata (and reference), read once per
    prompt."""
    keys = tuple(result.keys())
    rows = [dict(zip(keys, row, strict=True)) for row in result.all()]
    if not rows:
        return rows
    prompt_columns = [Prompt.messages.label("prompt_messages"), Prompt.metadata_.label("prompt_metadata")]
    if with_reference:
        prompt_columns.append(Prompt.reference.label("prompt_reference"))
    ids = sorted({r["prompt_id"] for r in rows})
    stmt = select(Prompt.id, *prompt_columns).where(Prompt.id == any_(array_param("ids", ids, Text)))
    result = session.connection().execute(stmt)
    names = tuple(result.keys())[1:]
    prompts = {row[0]: dict(zip(names, row[1:], strict=True)) for row in result.all()}
    out = []
    for r in rows:
        prompt = prompts.get(r["prompt_id"])
        if prompt is not None:  # (the prompt's foreign key: always)
            r.update(prompt)
            out.append(r)
    return out
