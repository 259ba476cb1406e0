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
from dledger.core.messages import LeadershipTransferRequest
from dledger.security.roles import ALL_ROLES, Access, AccessRole, Principal, needs, refusal_text

# Raft messages between members, client requests, operator requests.
RAFT_ACCESS: dict[int, Access] = {
    RequestCode.VOTE: needs("VOTE", AccessRole.MEMBER),
    RequestCode.HEART_BEAT: needs("HEART_BEAT", AccessRole.MEMBER),
    RequestCode.PUSH: needs("PUSH", AccessRole.MEMBER),
    RequestCode.INSTALL_SNAPSHOT: needs("INSTALL_SNAPSHOT", AccessRole.MEMBER),
    RequestCode.READ_INDEX: needs("READ_INDEX", AccessRole.MEMBER),
    RequestCode.LEADERSHIP_TRANSFER: needs("LEADERSHIP_TRANSFER", AccessRole.MEMBER, AccessRole.ADMIN),
    RequestCode.APPEND: needs("APPEND", AccessRole.CLIENT),
    RequestCode.GET: needs("GET", AccessRole.CLIENT),
    RequestCode.READ: needs("READ", AccessRole.CLIENT),
    RequestCode.QUERY: needs("QUERY", AccessRole.CLIENT),
    # who leads, every member's view: members, controllers and brokers ask it too
    RequestCode.METADATA: Access("METADATA", ALL_ROLES),
    # the configuration (voters, learners, addresses, lag): what a client needs to follow the
    # group's membership, and what a member starting with --join asks for
    RequestCode.MEMBERS: Access("MEMBERS", ALL_ROLES),
    RequestCode.CHANGE_MEMBERS: needs("CHANGE_MEMBERS", AccessRole.ADMIN),
    RequestCode.SNAPSHOT: needs("SNAPSHOT", AccessRole.ADMIN),
    RequestCode.FAULT: needs("FAULT", AccessRole.ADMIN),
}


def content_refusal(code: int, req: Any, principal: Principal) -> str | None:
    """A refusal that depends on the decoded request (the code alone allowed it), or None."""
    if code == RequestCode.LEADERSHIP_TRANSFER and isinstance(req, LeadershipTransferRequest):
        role = AccessRole.MEMBER if req.transfer_id else AccessRole.ADMIN
        what = "a leader's hand-over (LEADERSHIP_TRANSFER naming the leader)" if req.transfer_id \
            else "LEADERSHIP_TRANSFER (asking the leader to hand over)"
        if not principal.has(role):
            return refusal_text(what, (role,), principal)
    return None


__all__ = ["RAFT_ACCESS", "content_refusal"]
