"""Request and response codes (docs/format.md); numbers are DLedger's so tools interoperate."""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    """Every request code in one enum: DLedger's, dledger's own, the controller's and a
    broker's (RocketMQ's numbers where it has them); numbers never collide."""

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
    # ours, beside DLedger's (docs/format.md)
    FAULT = 52001  # tests only: obeyed with --enable-fault-injection
    READ = 52002
    AUTH = 52003  # a connection's first request when the server wants a token: meta is the token
    QUERY = 52004
    SNAPSHOT = 52005
    READ_INDEX = 52006
    MEMBERS = 52007  # the group's configuration: voters, learners, their addresses and lag
    CHANGE_MEMBERS = 52008  # admin: add a learner, promote it, remove a member (leader only)
    BROKER_FAULT = 52101  # a broker's FAULT, tests only
    # controller mode: RocketMQ's request codes (RequestCode.java), so tools interoperate
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    UPDATE_CONTROLLER_CONFIG = 1009
    GET_CONTROLLER_CONFIG = 1010
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013
    # a broker's: RocketMQ's where it has one
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    GET_BROKER_RUNTIME_INFO = 28


# RocketMQ's controller requests (BROKER_HEARTBEAT and 1001-1013), as upstream numbers them
CONTROLLER_REQUESTS = frozenset(c for c in RequestCode if c == 904 or 1001 <= c <= 1013)


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
    # a broker set's (RocketMQ's ResponseCode numbers: a send in controller mode)
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12  # written on the master, not acknowledged by enough replicas in time
    SERVICE_NOT_AVAILABLE = 14  # not the master (a slave, fenced, lease expired): try the master
    # ours, beyond DLedger's list
    UNAUTHENTICATED = 430  # no valid client certificate / auth token, or not a member's certificate
    # upstream answers SYSTEM_ERROR with the remark "in-sync replicas not enough": a code of its own
    IN_SYNC_REPLICAS_NOT_ENOUGH = 431
    # an idempotent producer's append (core.producers): a sequence gap (an earlier append of
    # this producer is missing), or a producer the leader does not know (new, or expired)
    # sending a sequence other than 0 (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID)
    OUT_OF_ORDER_SEQUENCE = 432
    UNKNOWN_PRODUCER = 433
    PRODUCER_FENCED = 434  # an older epoch of a producer than the log's (Kafka's INVALID_PRODUCER_EPOCH)
    # an idempotent append refused before anything is written: a producer id created by another
    # principal (certificate or token name); a duplicate sequence whose body differs from the
    # stored entry's (the id is being reused: start a new epoch, or use another id); a principal
    # creating producers faster than producer_creations_per_second (send again shortly)
    PRODUCER_NOT_OWNED = 435
    SEQUENCE_REUSED = 436
    PRODUCER_RATE_LIMITED = 437
    # a duplicate sequence the leader cannot compare with the stored entry, so it must not
    # answer it as one: its place is no longer kept (beyond max_producer_spans) or its entry
    # was deleted (retention, a snapshot). Nothing was written; sending it again cannot help
    DUPLICATE_UNVERIFIABLE = 438
    # membership changes (docs/operations.md): one at a time, learners promoted only caught up
    MEMBERSHIP_CHANGE_PENDING = 439  # an earlier change is not committed yet
    LEARNER_BEHIND = 440  # promote refused: the learner lags the leader by more than learner_max_lag
    MEMBER_EXISTS = 441  # add of an id (or address) already in the configuration (UNKNOWN_MEMBER: not in it)
    NOT_A_MEMBER = 442  # this process was removed from the group (or never added): it serves nothing
    MEMBERSHIP_UNSAFE = 443  # the change would leave fewer live voters than its quorum


class ControllerResponseCode(IntEnum):
    """Controller mode answers (upstream's RequestCode and ResponseCode), RocketMQ's numbers."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    REQUEST_CODE_NOT_SUPPORTED = 3
    NO_PERMISSION = 16
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014
    CONTROLLER_JRAFT_INTERNAL_ERROR = 2015
    CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS = 2016


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


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
ControllerRequestCode = RequestCode
