"""ConfigProbe: what a member learns, from the members it knows, of configurations its own log
does not hold yet (docs/architecture.md, "Membership").

A member's log may lag behind the entries that changed its group. Two things then go wrong,
and both are settled by asking the members of its configurations (in force and committed)
for MEMBERS:

* **A leader (or candidate) it does not know.** The thesis (§4.1) takes every RPC without
  consulting the configuration, so a lagging member follows a leader added after its log ends.
  Where member identities are verified (TLS: `strict`), that rule lets any certificate of the
  group's CA lead a member that hears no live leader: one forged push of a high term rewrote
  committed history. So there a leader's message (push, heartbeat, snapshot) or a vote request
  is taken only from a member a configuration of ours names, or one *vouched for*: a voter of
  the newest configuration, newer than ours, that a member we know answered. A refused one
  starts a round; the sender's next message is taken once vouched for, and a leader's pushes
  bring the configuration entries. Without verified identities (no TLS) any sender can claim
  a known id anyway, so the thesis' rule stands: a leader's messages are also taken from an
  unknown member while no live leader is heard (or from the one we follow).
* **A removal it never received** (the leader stops replicating to a member once its removal
  commits, and a member away then never appends it). A voter of a *committed* configuration
  newer than ours, which names that voter and not us, makes us a removed member (`removed`):
  we never campaign and answer clients NOT_A_MEMBER with that configuration, until our own log
  reaches it. A leader holds every committed entry (Leader Completeness), so it believes no
  such answer.

A round is asked when an unknown leader or candidate knocks, when a vote request is refused
because the voter knows no such member, or after a long time with no leader; at most one
round per `max_vote_interval_ms` (per `_SILENT_ROUND_MS` for the last), so a flood of forged
messages costs one small request per known member per interval, and whatever it claims, the
vouched set is the newest configuration's voters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.configs import ConfigHistory
from dledger.core.contexts import MembersCtx
from dledger.core.env import MemberEnv
from dledger.core.messages import MembersRequest, MembersResponse
from dledger.membership import MAX_MEMBERS

log = logging.getLogger(__name__)

# a leader's messages and vote requests: from a member no configuration of ours names, taken
# only once vouched for (and, without verified identities, a leader's while none is live)
_ASKED_ABOUT = frozenset((RequestCode.PUSH, RequestCode.HEART_BEAT, RequestCode.INSTALL_SNAPSHOT,
                          RequestCode.VOTE))
_VOUCH_MS = 10_000  # a vouch lasts this long; a sender still unknown then is asked about again
_SILENT_ROUND_MS = 5_000  # no leader heard this long: ask whether we were removed, this often


class ProbeEnv(MemberEnv, Protocol):
    @property
    def cfg(self) -> DLedgerConfig: ...
    @property
    def configs(self) -> ConfigHistory: ...

    def send(self, peer: str, code: int, msg: MembersRequest, ctx: MembersCtx,
             data: bytes = b"", timeout_ms: int | None = None) -> None: ...


class ConfigProbe:
    def __init__(self, env: ProbeEnv, strict: bool, leader_alive: Callable[[], bool]) -> None:
        self.env = env
        self.strict = strict  # member identities are verified (TLS): vouched-for leaders only
        self._leader_alive = leader_alive
        self.vouch_index = -1  # the configuration the vouched voters (MemberState.vouched) come from
        self.removed_by = -1  # a committed configuration a known voter holds, not naming us
        self.view: MembersResponse | None = None  # that configuration, as its member answered it
        self._round = 0
        self._next_at = -(1 << 62)  # no round before this
        self._silent_at = -(1 << 62)  # nor a silence round before this

    @property
    def removed(self) -> bool:
        return self.removed_by > self.env.configs.index

    def takes(self, code: int, sender: str) -> bool:
        """A leader's message or a vote request from `sender`, whom no configuration of ours
        names: a voter vouched for; without verified identities also a leader's message while
        no live leader is heard, or from the leader we follow (thesis §4.1)."""
        if code not in _ASKED_ABOUT:
            return False
        if self.env.member.vouched.get(sender, -1) > self.env.now:
            return True
        if self.strict or code == RequestCode.VOTE:
            return False
        return self.env.member.leader_id == sender or not self._leader_alive()

    def unknown(self, code: int, sender: str, term: int) -> None:
        """A leader's message or vote request from a member no configuration of ours names was
        refused: ask the members we know about newer configurations (a stale term leads nobody)."""
        if code in _ASKED_ABOUT and term >= self.env.member.term:
            self.ask()

    def silence(self, leader_alive: bool) -> None:
        """Each tick: a member that heard no leader for a long time asks whether it was removed
        (a learner does not campaign, so nothing else would tell it)."""
        now = self.env.now
        if leader_alive:
            self._silent_at = now + _SILENT_ROUND_MS
        elif now >= self._silent_at:
            self._silent_at = now + _SILENT_ROUND_MS
            self.ask()

    def ask(self) -> None:
        """One round of MEMBERS to every other member of our configurations in force and
        committed (not older ones: a member long removed is no witness)."""
        env = self.env
        now, cfg, m = env.now, env.cfg, env.member
        if now < self._next_at:
            return
        self._next_at = now + cfg.max_vote_interval_ms
        self._round += 1
        for peer in dict.fromkeys([*m.membership.members, *sorted(m.committed_members)]):
            if peer != m.self_id:
                env.send(peer, RequestCode.MEMBERS, MembersRequest(m.group, "", peer), MembersCtx(self._round, peer),
                         timeout_ms=cfg.max_vote_interval_ms)

    def on_answer(self, ctx: MembersCtx, resp: object) -> bool:
        """A known member's MEMBERS answer. True if it made us a removed member."""
        configs, m = self.env.configs, self.env.member
        if not isinstance(resp, MembersResponse) or resp.config_index <= configs.index or \
                resp.code not in (ResponseCode.SUCCESS, ResponseCode.NOT_A_MEMBER) or len(resp.members) > MAX_MEMBERS:
            return False
        voters = {i.id for i in resp.members if i.voter}
        if resp.config_index >= self.vouch_index:  # the newest configuration seen: its voters only
            if resp.config_index > self.vouch_index:
                log.info("%s/%s: %s holds configuration %d (ours is %d): its voters %s are taken", m.group,
                         m.self_id, ctx.peer, resp.config_index, configs.index, ",".join(sorted(voters)))
            self.vouch_index = resp.config_index
            until = self.env.now + _VOUCH_MS
            m.vouched.clear()
            m.vouched.update((v, until) for v in voters if v != m.self_id)
        if resp.committed and ctx.peer in voters and m.self_id not in {i.id for i in resp.members} and \
                not m.is_leader and resp.config_index > self.removed_by:
            log.warning("%s/%s: voter %s holds committed configuration %d, which does not name us (ours is %d): "
                        "removed from the group, we no longer campaign", m.group, m.self_id, ctx.peer,
                        resp.config_index, configs.index)
            self.removed_by, self.view = resp.config_index, resp
            return True
        return False

    def caught_up(self) -> None:
        """Our configurations changed: what our log now holds replaces what we were told."""
        index = self.env.configs.index
        if self.vouch_index <= index:
            self.env.member.vouched.clear()
        if 0 <= self.removed_by <= index:
            self.removed_by, self.view = -1, None
