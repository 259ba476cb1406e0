"""One request of a Spark query, retried through leader changes (docs/spark.md, "Failures").

Every call the connector makes (a task's read of one chunk, the driver's view of a log for
planning or `latestOffset`, a task's append) gets its own deadline, counted from that
request's first attempt: a task that has read for an hour still gets the whole deadline at
its next leader change. Between attempts it backs off (0.1 s, doubling up to 1 s, ±20 %).

Two things end a request before its deadline:
- an error that retrying cannot mend (UNKNOWN_GROUP, a bad argument, refused credentials);
- nothing listens at any member's address (every connection refused, ECONNREFUSED) for
  UNREACHABLE_S: a wrong `peers` or a group that is down fails in seconds, naming every
  address tried.
An election (members answer, none leads yet) and a stalled member (it accepts connections
and does not answer; its TLS handshake or connect times out; a partition) are waited out up
to the deadline.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import DLedgerClient, refused

log = logging.getLogger(__name__)

UNREACHABLE_S = 5.0  # every member refusing connections this long: nothing to wait for
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 1.0

# Worth waiting for: an election, a member restarting, a network hiccup.
TRANSIENT = frozenset({
    ResponseCode.TIMEOUT,
    ResponseCode.NETWORK_ERROR,
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_NOT_READY,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.TERM_CHANGED,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
    ResponseCode.SERVICE_NOT_AVAILABLE,  # a broker set: no master (yet)
})

# what an operator should know beside the code
_HINTS = {
    ResponseCode.UNKNOWN_GROUP: "the members named by `peers` serve no group of that name: check the option "
                                "`group` (or the names in `groups`)",
}

# None: some member answered (or was not refused); else each address tried and why it failed
Probe = Callable[[], "str | None"]


def describe(e: DLedgerError) -> str:
    """The response code's name and number first: what an operator greps for."""
    return f"{e.code.name} ({int(e.code)}): {e.message}"


def nobody_listens(client: DLedgerClient) -> Probe:
    """A probe of `client`'s members: asks each at once (a refused connection costs nothing).
    Only refusals count: a connect that times out or a TLS handshake that fails may be a
    stalled member, which is waited out."""
    def probe() -> str | None:
        answers = client.metadata_all()
        if not answers or any(not (isinstance(a, DLedgerError) and refused(a)) for a in answers.values()):
            return None
        return "; ".join(f"{m} at {client.peers[m].address if m in client.peers else '?'}: "
                         f"{a.message if isinstance(a, DLedgerError) else a}" for m, a in answers.items())
    return probe


class Retry:
    """The attempts of one request: `failed` after each error, `wait` while what the request
    needs is not there yet. Both back off and return, or raise DLedgerError saying what was
    asked, for how long, and the option that sets the deadline."""

    def __init__(self, what: str, timeout: float, option: str = "timeoutSeconds", probe: Probe | None = None) -> None:
        self.what, self.timeout, self.option, self.probe = what, timeout, option, probe
        self.started = time.monotonic()
        self.attempts = 0
        self._delay = FIRST_DELAY_S
        self._refused_since: float | None = None

    def failed(self, e: DLedgerError, retryable: bool | None = None) -> None:
        """After `e`: back off, or raise. `retryable` overrides the code's own verdict (TRANSIENT)."""
        if not (e.code in TRANSIENT if retryable is None else retryable):
            hint = f"; {_HINTS[e.code]}" if e.code in _HINTS else ""
            raise DLedgerError(e.code, f"{self.what}: {e.message}{hint}") from e
        self._check_reachable(e)
        self._back_off(e.message, e.code)

    def wait(self, why: str) -> None:
        """Not an error: what the request needs is not there yet (`why`); back off, or raise TIMEOUT."""
        self._refused_since = None
        self._back_off(why, ResponseCode.TIMEOUT)

    def _check_reachable(self, e: DLedgerError) -> None:
        """Fail fast when every member refuses connections for UNREACHABLE_S (asked only
        after a refused connection: an answer, even a refusal to lead, proves a member is up;
        a connect timeout or a failed handshake may be a stalled member)."""
        if self.probe is None or not refused(e):
            self._refused_since = None
            return
        tried = self.probe()
        if tried is None:
            self._refused_since = None
            return
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        elif now - self._refused_since >= UNREACHABLE_S:
            raise DLedgerError(ResponseCode.NETWORK_ERROR,
                               f"{self.what}: no member is reachable (every connection refused for "
                               f"{now - self._refused_since:.0f} s; tried {tried}): check the option `peers` "
                               f"(or `groups`) and that the group runs") from e

    def _back_off(self, why: str, code: ResponseCode) -> None:
        self.attempts += 1
        spent = time.monotonic() - self.started
        if spent >= self.timeout:
            raise DLedgerError(code, f"{self.what}: still failing after {spent:.0f} s and {self.attempts} "
                                     f"attempts (option {self.option} = {self.timeout:g} s): {why}")
        log.info("%s: %s; trying again (%.0f s of %g s spent)", self.what, why, spent, self.timeout)
        pause = min(self._delay * random.uniform(0.8, 1.2), max(0.0, self.timeout - spent))
        time.sleep(pause)
        self._delay = min(self._delay * 2, MAX_DELAY_S)
