"""The roles each request of the group protocol needs (docs/security.md, "Roles").

The transport checks a request's code against this table before any handler runs
(`TransportServer.policy`); a code without an entry is not served. A request whose role
depends on what it says is listed with every role it may need, and narrowed after decoding
(`content_refusal`): LEADERSHIP_TRANSFER is a member's hand-over when it names the current
leader (`transfer_id`), else an operator's (admin) request.
"""

from __future__ import annotations

from typing import Any

from dledger.codes import RequestCode
from dledger.core.messages import FAULT, QUERY, READ, READ_INDEX, SNAPSHOT, LeadershipTransferRequest
from dledger.security.roles import ALL_ROLES, Access, Principal, Role, needs, refusal_text

# Raft messages between members, client requests, operator requests.
RAFT_ACCESS: dict[int, Access] = {
    RequestCode.VOTE: needs("VOTE", Role.MEMBER),
    RequestCode.HEART_BEAT: needs("HEART_BEAT", Role.MEMBER),
    RequestCode.PUSH: needs("PUSH", Role.MEMBER),
    RequestCode.INSTALL_SNAPSHOT: needs("INSTALL_SNAPSHOT", Role.MEMBER),
    READ_INDEX: needs("READ_INDEX", Role.MEMBER),
    RequestCode.LEADERSHIP_TRANSFER: needs("LEADERSHIP_TRANSFER", Role.MEMBER, Role.ADMIN),
    RequestCode.APPEND: needs("APPEND", Role.CLIENT),
    RequestCode.GET: needs("GET", Role.CLIENT),
    READ: needs("READ", Role.CLIENT),
    QUERY: needs("QUERY", Role.CLIENT),
    # who leads, every member's view: members, controllers and brokers ask it too
    RequestCode.METADATA: Access("METADATA", ALL_ROLES),
    SNAPSHOT: needs("SNAPSHOT", Role.ADMIN),
    FAULT: needs("FAULT", Role.ADMIN),
}


def content_refusal(code: int, req: Any, principal: Principal) -> str | None:
    """A refusal that depends on the decoded request (the code alone allowed it), or None."""
    if code == RequestCode.LEADERSHIP_TRANSFER and isinstance(req, LeadershipTransferRequest):
        role = Role.MEMBER if req.transfer_id else Role.ADMIN
        what = "a leader's hand-over (LEADERSHIP_TRANSFER naming the leader)" if req.transfer_id \
            else "LEADERSHIP_TRANSFER (asking the leader to hand over)"
        if not principal.has(role):
            return refusal_text(what, (role,), principal)
    return None


__all__ = ["RAFT_ACCESS", "content_refusal"]
