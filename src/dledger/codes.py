"""Request and response codes (SPEC §3); numbers are DLedger's so tools interoperate."""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005
    INSTALL_SNAPSHOT = 51006
    USER_DEFINE_REQUEST = 59999


class ResponseCode(IntEnum):
    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    NEWER_INSTALL_SNAPSHOT_REQUEST_EXIST = 422
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506
    LOAD_SNAPSHOT_ERROR = 507
    INSTALL_SNAPSHOT_ERROR = 508
    # ours, beyond DLedger's list
    UNAUTHENTICATED = 430  # no valid client certificate / auth token, or not a member's certificate


class PushType(IntEnum):
    COMPARE = 0
    TRUNCATE = 1
    APPEND = 2
    COMMIT = 3
    INSTALL_SNAPSHOT = 4
    REPAIR = 5  # ours, not DLedger's: records sent again to overwrite a follower's corrupt copies


DISK_FAULTS = frozenset((ResponseCode.DISK_FULL, ResponseCode.DISK_ERROR))  # the disk, not the request, failed


class DLedgerError(Exception):
    """Every failure users see carries a response code, as DLedger's DLedgerException does."""

    def __init__(self, code: ResponseCode, message: str = "") -> None:
        self.code = ResponseCode(code)
        self.message = message or self.code.name
        super().__init__(f"{self.code.name} ({int(self.code)}): {self.message}")
