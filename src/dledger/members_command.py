"""`dledger members`: read and change a group's membership (docs/operations.md), and what
`dledger server --join` asks the group before a new member starts.

Changes go one server at a time, as `etcdctl member`: add a learner, start it with `--join`,
promote it once it caught up, remove the member it replaces. Changes need the admin role
(admin.pem of --tls-dir, DLEDGER_ADMIN_TOKEN); `list` any role.
"""

from __future__ import annotations

import json
import logging
import time

import click

from dledger.clitools import (
    UserError,
    emit,
    emit_record,
    group_option,
    make_client,
    output_option,
    peers_option,
    security,
    security_options,
)
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import ConfigError, parse_peers
from dledger.membership import Membership
from dledger.runtime.client import Members
from dledger.security.tls import TlsConfig

log = logging.getLogger(__name__)

_CHANGE_TIMEOUT_S = 15.0  # a change is answered once its entry commits


@click.group()
def members() -> None:
    """List a group's voters and learners, add a learner, promote it, remove a member."""


def member_rows(m: Members) -> list[dict[str, object]]:
    """One row per member: voters first, the leader marked; match and lag as the leader knows
    them ("" when the answer was not the leader's)."""
    rows: list[dict[str, object]] = []
    for info in m.voters + m.learners:
        rows.append({"id": info.id, "address": info.address, "role": "voter" if info.voter else "learner",
                     "match": info.match_index if info.match_index >= 0 else "",
                     "lag": info.lag if info.lag >= 0 else "", "leader": "*" if info.leader else ""})
    return rows


def members_json(m: Members) -> dict[str, object]:
    return {"leader": m.leader_id, "term": m.term, "config_index": m.config_index, "committed": m.committed,
            "answered_by": m.answered_by, "peers": m.peers_string(),
            "members": [{"id": i.id, "address": i.address, "voter": i.voter, "match_index": i.match_index,
                         "lag": i.lag} for i in m.voters + m.learners]}


@members.command("list")
@peers_option()
@group_option()
@output_option("table")
@security_options
def members_list(peers: str, group: str, output: str) -> None:
    """Each member's id, address, role (voter or learner), match index and lag behind the
    leader (the leader's view), the leader marked *; -o json: one object."""
    parse_peers(peers)
    with make_client(peers, group, timeout=10.0) as c:
        m = c.members()
    if output == "json":
        click.echo(json.dumps(members_json(m)))
        return
    state = "committed" if m.committed else "a change under way"
    emit(member_rows(m), "table", f"group {group}: term {m.term}, configuration entry {m.config_index} ({state})")


def _change(peers: str, group: str, output: str, op: str, member_id: str, address: str = "",
            wait: float = 0.0) -> None:
    """Send one change to the leader (redirects followed); print what was appended."""
    parse_peers(peers)
    deadline = time.monotonic() + wait
    with make_client(peers, group, timeout=_CHANGE_TIMEOUT_S, role="admin") as c:
        while True:
            try:
                if op == "add-learner":
                    index = c.add_learner(member_id, address)
                elif op == "promote":
                    index = c.promote(member_id)
                else:
                    index = c.remove_member(member_id)
                break
            except DLedgerError as e:
                # a learner still catching up, or the previous change not committed yet: --wait
                waitable = (ResponseCode.LEARNER_BEHIND, ResponseCode.MEMBERSHIP_CHANGE_PENDING,
                            ResponseCode.LEADER_NOT_READY)
                if e.code not in waitable or time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
        record: dict[str, object] = {"op": op, "member": member_id, **({"address": address} if address else {}),
                                     "config_index": index}
        try:  # the change is made; the group's new peers string is a convenience (a leader removed
            record["peers"] = c.members().peers_string()  # is electing its successor now)
        except DLedgerError as e:
            log.info("the configuration after the change: %s", e)
    emit_record(record, output, f"group {group}")


@members.command("add-learner")
@peers_option()
@group_option()
@click.option("--id", "member_id", required=True, help="The new member's id.")
@click.option("--addr", "address", required=True, metavar="HOST:PORT",
              help="Where clients and members reach it (its --peers address).")
@output_option("json")
@security_options
def members_add_learner(peers: str, group: str, member_id: str, address: str, output: str) -> None:
    """Add member ID at HOST:PORT as a learner (it gets the log, neither votes nor counts for
    commit); then start it with `dledger server --join`."""
    try:
        parse_peers(f"{member_id}-{address}")
    except ConfigError as e:
        raise click.UsageError(f"--id {member_id} --addr {address}: {e.message}") from None
    _change(peers, group, output, "add-learner", member_id, address)


@members.command("promote")
@peers_option()
@group_option()
@click.option("--id", "member_id", required=True, help="The learner to make a voter.")
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0), metavar="SECONDS",
              help="While the learner is still behind (LEARNER_BEHIND), ask again for up to SECONDS.")
@output_option("json")
@security_options
def members_promote(peers: str, group: str, member_id: str, wait: float, output: str) -> None:
    """Make learner ID a voter: refused (LEARNER_BEHIND) while it trails the leader by more
    than the group's learner_max_lag entries."""
    _change(peers, group, output, "promote", member_id, wait=wait)


@members.command("remove")
@peers_option()
@group_option()
@click.option("--id", "member_id", required=True, help="The member to remove (a voter or a learner).")
@output_option("json")
@security_options
def members_remove(peers: str, group: str, member_id: str, output: str) -> None:
    """Remove member ID (the leader itself hands over once the change commits); stop its
    process afterwards: it serves nothing any more."""
    _change(peers, group, output, "remove", member_id)


JOIN_HELP = ("Join a running group through any of these members (instead of --peers): its configuration is read "
             "from the group, which must name this --id (`dledger members add-learner` first).")


def join_into(join: str, data: dict[str, object], peers: str | None, default_group: str) -> Membership:
    """`--join` of `dledger server` and `dledger controller`: the group's configuration, read
    from any member of `join`, for the node to start from (`Node(..., membership=)`: used only
    while neither this member's log nor its snapshot holds one: a member restarting later takes
    its own). `data["peers"]` is set to it as well (the command line's fallback: every member's
    client address, this one's included). `peers`: the --peers flag given."""
    if peers is not None:
        raise click.UsageError("--join reads the members from the group: give it without --peers")
    if data.get("peer_listen"):
        # a configuration records one address per member, where clients reach it: a member-only
        # listener would be known to no other member
        raise click.UsageError("--join does not take --peer-listen (the group's configuration has one address "
                               "per member)")
    if "self_id" not in data:
        raise click.UsageError("--join needs --id (the id given to `dledger members add-learner`)")
    group = str(data.get("group", default_group))
    membership = join_configuration(join, group, str(data["self_id"]), security())
    data["peers"] = membership.peers_string()
    return membership


def join_configuration(join: str, group: str, self_id: str, security: dict[str, str],
                       wait: float = 30.0) -> Membership:
    """`dledger server --join`: the group's configuration from any reachable member of `join`
    (its MEMBERS answer); this member must be in it (added with add-learner first).
    `security`: the server's own options (its member certificate, or the cluster token)."""
    parse_peers(join)
    paths = [security.get(k, "") for k in ("tls_ca", "tls_cert", "tls_key")]
    tls = TlsConfig(*paths) if all(paths) else None
    token = security.get("auth_token") or None
    from dledger.runtime.client import DLedgerClient

    deadline = time.monotonic() + wait
    with DLedgerClient(join, group, timeout=10.0, tls=tls, auth_token=token) as c:
        while True:
            try:
                m = c.members()
                break
            except DLedgerError as e:
                final = (ResponseCode.UNAUTHENTICATED, ResponseCode.UNKNOWN_GROUP, ResponseCode.UNSUPPORTED)
                if e.code in final or time.monotonic() >= deadline:
                    raise UserError(f"--join {join}: cannot read group {group}'s configuration: {e}") from e
                time.sleep(0.5)
    mine = next((i for i in m.members if i.id == self_id), None)
    if mine is None:
        raise UserError(f"member {self_id} is not in group {group}'s configuration ({m.peers_string()}): "
                        f"add it first: dledger members add-learner --peers '{join}' --group {group} "
                        f"--id {self_id} --addr HOST:PORT")
    log.info("joining group %s as %s at %s: %s", group, "voter" if mine.voter else "learner", mine.address,
             m.peers_string())
    return configuration_of(m)


def configuration_of(m: Members) -> Membership:
    """A MEMBERS answer as the configuration it describes."""
    return Membership({i.id: i.address for i in m.voters}, {i.id: i.address for i in m.learners})


__all__ = ["JOIN_HELP", "configuration_of", "join_configuration", "join_into", "member_rows", "members", "members_json"]
