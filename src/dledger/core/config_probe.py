"""ConfigProbe: what a member learns, from the members it knows, of configurations its own log
does not hold yet (docs/architecture.md, "Membership").

A member's log may lag behind the entries that changed its group. Two things then go wrong,
and both are settled by asking the members it knows for MEMBERS:

* **A leader it does not know.** The thesis (§4.1) takes every RPC without consulting the
  configuration, so a lagging member follows a leader added after its log ends. With member
  certificates that rule lets any certificate of the group's CA lead a member that hears no
  live leader: one forged push of a high term rewrote committed history. So a leader's message
  (push, heartbeat, snapshot) is taken only from a member a configuration of ours names, or one
  *vouched for*: named a voter by the configuration a member we know holds, newer than ours.
  The first refused message starts a round of MEMBERS to the members we know; the leader's
  next message, once vouched for, is taken and brings the configuration entries with it.
* **A removal it never received** (the leader stops replicating to a member once its removal
  commits, and a member away then never appends it). A known member's *committed*
  configuration, newer than ours and not naming us, makes us a removed member (`removed`):
  we never campaign and answer clients NOT_A_MEMBER with that configuration, until our own
  log reaches it (a committed configuration never rolls back).

A round is asked when an unknown leader knocks, when a vote request is refused because the
voter knows no such member, or after a long time with no leader; at most one round per
`max_vote_interval_ms` (per `_SILENT_ROUND_MS` for the last), so a flood of forged messages
costs one small request per known member per interval.
"""

from __future__ import annotations

import logging
from typing import Protocol

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.configs import ConfigHistory
from dledger.core.contexts import MembersCtx
from dledger.core.env import MemberEnv
from dledger.core.messages import MembersRequest, MembersResponse

log = logging.getLogger(__name__)

# a leader's messages: taken only from a member known or vouched for
LEADER_CODES = frozenset((RequestCode.PUSH, RequestCode.HEART_BEAT, RequestCode.INSTALL_SNAPSHOT))
_VOUCH_MS = 10_000  # a vouch lasts this long; a leader still unknown then is asked about again
_SILENT_ROUND_MS = 5_000  # no leader heard this long: ask whether we were removed, this often
_MAX_VOUCHED = 64  # ids vouched for at once (every one named by a configuration we were shown)


class ProbeEnv(MemberEnv, Protocol):
    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def configs(self) -> ConfigHistory: ...

    def send(self, peer: str, code: int, msg: MembersRequest, ctx: MembersCtx,
             data: bytes = b"", timeout_ms: int | None = None) -> None: ...


class ConfigProbe:
    def __init__(self, env: ProbeEnv) -> None:
        self.env = env
        self.vouched: dict[str, tuple[int, int]] = {}  # id -> (configuration index, until)
        self.removed_by = -1  # a committed configuration a known member holds, not naming us
        self.view: MembersResponse | None = None  # that configuration, as its member answered it
        self._round = 0
        self._asked = ""  # the unknown leader the round asks about ("" none)
        self._next_at = -(1 << 62)  # no round before this
        self._silent_at = -(1 << 62)  # nor a silence round before this

    @property
    def removed(self) -> bool:
        return self.removed_by > self.env.configs.index

    def takes(self, code: int, sender: str) -> bool:
        """A leader's message from `sender`, whom no configuration of ours names: vouched for."""
        v = self.vouched.get(sender)
        return v is not None and code in LEADER_CODES and self.env.now < v[1]

    def unknown_leader(self, code: int, sender: str, term: int) -> None:
        """A leader's message from a member no configuration of ours names was refused: ask the
        members we know whether a newer configuration names it (a stale term is no leader)."""
        if code in LEADER_CODES and term >= self.env.member.term:
            self.ask(sender)

    def silence(self, leader_alive: bool) -> None:
        """Each tick: a member that heard no leader for a long time asks whether it was removed
        (a learner does not campaign, so nothing else would tell it)."""
        now = self.env.now
        if leader_alive:
            self._silent_at = now + _SILENT_ROUND_MS
        elif now >= self._silent_at:
            self._silent_at = now + _SILENT_ROUND_MS
            self.ask("")

    def ask(self, about: str) -> None:
        """One round of MEMBERS to every other member our configurations name."""
        env = self.env
        now, cfg = env.now, env.cfg
        if now < self._next_at:
            return
        self._next_at = now + cfg.max_vote_interval_ms
        self._round += 1
        self._asked = about
        m = env.member
        for peer in env.configs.member_ids():
            if peer != m.self_id:
                env.send(peer, RequestCode.MEMBERS, MembersRequest(m.group, "", peer), MembersCtx(self._round, peer),
                         timeout_ms=cfg.max_vote_interval_ms)

    def on_answer(self, ctx: MembersCtx, resp: object) -> bool:
        """A known member's MEMBERS answer. True if it made us a removed member."""
        configs, m = self.env.configs, self.env.member
        if not isinstance(resp, MembersResponse) or resp.config_index <= configs.index or \
                resp.code not in (ResponseCode.SUCCESS, ResponseCode.NOT_A_MEMBER):
            return False
        names = {i.id: i.voter for i in resp.members}
        about = self._asked if ctx.round == self._round else ""
        if about and names.get(about) and (about in self.vouched or len(self.vouched) < _MAX_VOUCHED):
            log.info("%s/%s: %s named %s a voter of configuration %d (ours is %d): following it", m.group,
                     m.self_id, ctx.peer, about, resp.config_index, configs.index)
            self.vouched[about] = (resp.config_index, self.env.now + _VOUCH_MS)
        if resp.committed and m.self_id not in names and resp.config_index > self.removed_by:
            log.warning("%s/%s: %s holds committed configuration %d, which does not name us (ours is %d): "
                        "removed from the group, we no longer campaign", m.group, m.self_id, ctx.peer,
                        resp.config_index, configs.index)
            self.removed_by, self.view = resp.config_index, resp
            return True
        return False

    def caught_up(self) -> None:
        """Our configurations changed: what our log now holds replaces what we were told."""
        index = self.env.configs.index
        for k in [k for k, (i, _) in self.vouched.items() if i <= index]:
            del self.vouched[k]
        if self.removed_by >= 0 and self.removed_by <= index:
            self.removed_by, self.view = -1, None
