"""`dledger compact`: compact a plain log's members on demand (admin role; docs/operations.md,
"Compacting a plain log").

Each member writes a snapshot of its producer table (so retention may pass the entries that
table was folded from), then deletes the whole data files that lie before the point, as far
as the floors retention keeps allow: the commit and fsynced indexes, a follower heard from
within `retention_hold_ms` that has not stored the entries yet, a configuration entry no
snapshot holds. A follower silent longer than that holds nothing: it catches up through
InstallSnapshot. A group with a state machine is compacted behind its snapshots instead
(`dledger snapshot`), and refused here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import click

from dledger.clitools import (
    Rows,
    UserError,
    group_option,
    make_client,
    output_option,
    peers_option,
    security_options,
)
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import parse_peers
from dledger.core.messages import SnapshotResponse
from dledger.runtime.client import DLedgerClient

log = logging.getLogger(__name__)

_POLL_S = 0.25
_COMMIT_GRACE_S = 3.0


@dataclass
class Compaction:
    """One member's compaction: asked through `through`, its log began at `before`; it goes
    up to `target` unless a floor holds it back; `begin` is where it stands now."""

    member: str
    through: int
    before: int
    target: int
    begin: int
    held: str = ""  # what held the floor when the member was asked ("" when nothing did)

    def note(self) -> str:
        if self.begin >= self.target:
            if self.target <= self.through:
                return (f"entries {self.target}..{self.through} stay: they share a data file with later entries "
                        "(whole data files are deleted)")
            return ""
        why = f" (when asked: {self.held})" if self.held else ""
        return (f"held back at {self.begin} (target {self.target}): a member still needs those entries (a follower "
                "heard from within retention_hold_ms that has not stored them, a configuration or producer table "
                f"not yet saved){why}; they go once it catches up or is silent longer")

    def row(self) -> dict[str, object]:
        return {"member": self.member, "through": self.through, "begin_before": self.before,
                "begin": self.begin, "target": self.target, "note": self.note()}

    def line(self) -> str:
        note = self.note()
        return (f"{self.member}: compacted through {self.through}: the log begins at {self.begin} "
                f"(was {self.before})" + (f"; {note}" if note else ""))


def _members(c: DLedgerClient) -> list[str]:
    with contextlib.suppress(DLedgerError):
        return [i.id for i in c.members().members]
    return list(c.peers)


def _begin(c: DLedgerClient, member: str) -> int:
    return c.metadata(member).ledger_begin_index


def _ask(c: DLedgerClient, member: str, through: int) -> SnapshotResponse:
    """COMPACT `member`; a follower whose commit index trails `through` by a heartbeat or two
    is asked again for up to _COMMIT_GRACE_S before its refusal stands."""
    deadline = time.monotonic() + _COMMIT_GRACE_S
    while True:
        try:
            return c.compact(member, through)
        except DLedgerError as e:
            if e.code != ResponseCode.INDEX_OUT_OF_RANGE or time.monotonic() >= deadline:
                raise
        time.sleep(_POLL_S)


@click.command()
@peers_option()
@group_option()
@click.option("--through", type=click.IntRange(0), default=None,
              help="Compact the entries up to this index [default: each member's commit index].")
@click.option("--member", default=None, help="Only this member [default: every member].")
@click.option("--wait", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Seconds to wait for the data files to be deleted before reporting.")
@output_option(None, "'MEMBER: compacted through N: the log begins at B (was A)' lines")
@security_options
def compact(peers: str, group: str, through: int | None, member: str | None, wait: float,
            output: str | None) -> None:
    """Compact a plain log (no state machine) through an index: every member deletes the
    whole data files before it, as far as what members still need allows. Reads below the
    new log begin answer INDEX_LESS_THAN_LOCAL_BEGIN; a follower that needs them gets a
    snapshot instead (InstallSnapshot). A member that refuses is named on stderr (exit 1)."""
    parse_peers(peers)
    failed: list[str] = []
    with make_client(peers, group, timeout=60.0, role="admin") as c:
        started: list[Compaction] = []
        for m in [member] if member else _members(c):
            try:
                before = _begin(c, m)
                resp = _ask(c, m, -1 if through is None else through)
            except DLedgerError as e:
                failed.append(m)
                click.echo(f"{m}: {e}", err=True)
                continue
            held = resp.message if resp.message.startswith("held at") else ""
            if resp.message:
                log.info("%s: %s", m, resp.message)
            started.append(Compaction(m, resp.snapshot_index, before, resp.begin_index, before, held))
        deadline = time.monotonic() + wait
        pending = list(started)
        while pending:
            for comp in list(pending):
                with contextlib.suppress(DLedgerError):
                    comp.begin = _begin(c, comp.member)
                if comp.begin >= comp.target:
                    pending.remove(comp)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
    with Rows(output or "json", f"group {group}") as rows:
        for comp in started:
            if output is None:
                click.echo(comp.line())
            else:
                rows.add(comp.row())
    if failed:
        raise UserError(f"not compacted: {', '.join(failed)}")
