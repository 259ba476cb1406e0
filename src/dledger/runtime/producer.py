"""The client side of an idempotent producer (core.producers): its id and next sequence.

Appends of one producer go one request at a time, in order, so sequences have no gaps. A
request whose outcome is unknown (a timeout, a lost connection, a leader change) is sent
again with the same sequence until the call's deadline: the leader answers what its log
already holds with the original indexes, so nothing is stored twice. A call that fails
anyway (or is cancelled) leaves its bodies unsettled, whatever its last error said (an
earlier attempt may have been stored): the next call must send the same bodies again (a
retry, deduplicated); other bodies make a producer with an id of its own move to a fresh
id (the unsettled bodies stay as they are: in the log or not), and one with an id given by
the caller refuse (the caller decides how to go on). Other bodies under a stored sequence
are refused by the leader (SEQUENCE_REUSED) where it can compare them.

A producer the leader no longer knows (evicted, or expired after being idle) is answered
UNKNOWN_PRODUCER: the client starts a new session itself (`new_session`: the next epoch,
sequences from 0) and sends the call's bodies again. Bodies whose outcome was unknown when
the producer was evicted may then be stored twice: the leader's memory of them went with
the producer. A client whose epochs mean something of their own (the Spark sink's
micro-batches) turns this off (`new_sessions = False`) and gets UNKNOWN_PRODUCER instead.
"""

from __future__ import annotations

import asyncio
import uuid

from dledger.codes import DLedgerError, ResponseCode

# after these a request may or may not have been stored: an idempotent producer sends it again
UNKNOWN_OUTCOME = frozenset({ResponseCode.TIMEOUT, ResponseCode.NETWORK_ERROR, ResponseCode.TERM_CHANGED,
                             ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.UNKNOWN})


class IdempotentProducer:
    def __init__(self, producer_id: str | None = None, epoch: int = 0) -> None:
        if producer_id is not None and not 0 < len(producer_id) <= 128:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "a producer id has 1 to 128 characters")
        if epoch < 0:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"a producer epoch is >= 0, not {epoch}")
        self.chosen = producer_id is not None  # the caller's id: never replaced behind its back
        self.id = producer_id or uuid.uuid4().hex
        self.epoch = epoch  # a higher epoch restarts the producer's sequences (and fences older ones)
        self.next_seq = 0
        self.duplicates = 0  # bodies found already in the log (retries that had been stored)
        self.new_sessions = True  # UNKNOWN_PRODUCER starts the next epoch (else it is raised)
        self._unsettled: list[bytes] | None = None  # bodies at next_seq whose outcome is unknown
        self._lock: asyncio.Lock | None = None

    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def begin(self, bodies: list[bytes]) -> int:
        """The first sequence of `bodies` (called holding the lock)."""
        if self._unsettled is not None and bodies[: len(self._unsettled)] != self._unsettled:
            if self.chosen:
                raise DLedgerError(ResponseCode.OUT_OF_ORDER_SEQUENCE,
                                   f"producer {self.id!r}: {len(self._unsettled)} bodies from sequence "
                                   f"{self.next_seq} have an unknown outcome; send them again first "
                                   f"(they are deduplicated), or use a new producer id")
            self.renew()
        return self.next_seq

    def settled(self, count: int, duplicates: int) -> None:
        self._unsettled = None
        self.next_seq += count
        self.duplicates += duplicates

    def failed(self, bodies: list[bytes]) -> None:
        """The call failed (or was cancelled): whatever the last error says, an earlier
        attempt may have been stored, so these bodies are unsettled."""
        if self._unsettled is None or len(bodies) > len(self._unsettled):
            self._unsettled = list(bodies)

    def new_session(self) -> None:
        """The leader forgot this producer: the next epoch, from sequence 0, same id (the
        call's bodies go again under it; unsettled ones before may have been stored)."""
        self.epoch += 1
        self.next_seq = 0
        self._unsettled = None

    def renew(self) -> None:
        """A fresh id from sequence 0 (the leader forgot the old one, or it has unsettled bodies)."""
        self.id = uuid.uuid4().hex
        self.next_seq = 0
        self._unsettled = None
