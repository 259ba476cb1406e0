"""A broker's persistent id (upstream's ReplicasManager.register).

`brokerIdentity` holds `cluster#broker#id` once the controller accepted the id;
`brokerIdentity-temp` holds `cluster#broker#id#checkCode` while it is being applied for.
Both are written temp + fsync + rename (upstream copied to .bak and overwrote in place).
Register states: INITIAL -> CREATE_TEMP_METADATA_FILE_DONE -> CREATE_METADATA_FILE_DONE -> REGISTERED.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller.client import ControllerClient
from dledger.controller.messages import Response
from dledger.fsutil import fsync_path, write_atomic

log = logging.getLogger(__name__)

METADATA_FILE = "brokerIdentity"
TEMP_FILE = "brokerIdentity-temp"


class RegisterState(Enum):
    INITIAL = 0
    CREATE_TEMP_METADATA_FILE_DONE = 1
    CREATE_METADATA_FILE_DONE = 2
    REGISTERED = 3


@dataclass(frozen=True)
class Identity:
    cluster: str
    broker: str
    broker_id: int
    check_code: str = ""  # the temp file's only


class IdentityError(DLedgerError):
    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.INCONSISTENT_STATE, message)


def read_identity(path: Path) -> Identity | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    parts = text.split("#")
    if len(parts) not in (3, 4) or not parts[2].lstrip("-").isdigit():
        raise IdentityError(f"{path} is not a broker identity file: {text[:80]!r}")
    return Identity(parts[0], parts[1], int(parts[2]), parts[3] if len(parts) == 4 else "")


def write_identity(path: Path, identity: Identity) -> None:
    fields = [identity.cluster, identity.broker, str(identity.broker_id)]
    if identity.check_code:
        fields.append(identity.check_code)
    write_atomic(path, "#".join(fields).encode())


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        fsync_path(path.parent)


class Registration:
    """The register() state machine over one store directory."""

    def __init__(self, store_dir: Path, cluster: str, broker: str, address: str) -> None:
        self.dir, self.cluster, self.broker, self.address = store_dir, cluster, broker, address
        self.state = RegisterState.INITIAL
        self.broker_id = -1
        self.response: Response | None = None  # the REGISTER_BROKER answer (it may name the master)
        self._confirm_state()

    def _check(self, identity: Identity, path: Path) -> None:
        """checkMetadataValid: the files belong to this cluster and broker name."""
        if (identity.cluster, identity.broker) != (self.cluster, self.broker):
            raise IdentityError(f"{path} says cluster {identity.cluster!r} broker {identity.broker!r}, but this "
                                f"broker is configured as cluster {self.cluster!r} broker {self.broker!r}: "
                                "fix the configuration or use another store directory")

    def _confirm_state(self) -> None:
        """confirmNowRegisteringState: how far an earlier run got."""
        meta = read_identity(self.dir / METADATA_FILE)
        if meta is not None:
            self._check(meta, self.dir / METADATA_FILE)
            self.state, self.broker_id = RegisterState.CREATE_METADATA_FILE_DONE, meta.broker_id
            return
        temp = read_identity(self.dir / TEMP_FILE)
        if temp is not None:
            self._check(temp, self.dir / TEMP_FILE)
            self.state, self.broker_id = RegisterState.CREATE_TEMP_METADATA_FILE_DONE, temp.broker_id

    async def register(self, client: ControllerClient) -> bool:
        """One pass through the states; True when registered (else retry later)."""
        if self.state == RegisterState.INITIAL:
            resp = await client.get_next_broker_id(self.cluster, self.broker)
            if resp.code != RC.SUCCESS or resp.next_broker_id is None:
                log.warning("broker %s: no next broker id: %s", self.broker, resp.remark or resp.code)
                return False
            code = f"{self.address};{int(time.time() * 1000)}"
            write_identity(self.dir / TEMP_FILE, Identity(self.cluster, self.broker, resp.next_broker_id, code))
            self.state, self.broker_id = RegisterState.CREATE_TEMP_METADATA_FILE_DONE, resp.next_broker_id
        if self.state == RegisterState.CREATE_TEMP_METADATA_FILE_DONE:
            temp = read_identity(self.dir / TEMP_FILE)
            assert temp is not None
            resp = await client.apply_broker_id(self.cluster, self.broker, temp.broker_id, temp.check_code)
            if resp.code != RC.SUCCESS:
                log.warning("broker %s: applying for id %d failed (%s): asking again", self.broker,
                            temp.broker_id, resp.remark or resp.code)
                remove(self.dir / TEMP_FILE)
                self.state, self.broker_id = RegisterState.INITIAL, -1
                return False
            write_identity(self.dir / METADATA_FILE, Identity(self.cluster, self.broker, temp.broker_id))
            remove(self.dir / TEMP_FILE)
            self.state, self.broker_id = RegisterState.CREATE_METADATA_FILE_DONE, temp.broker_id
        resp = await client.register_broker(self.cluster, self.broker, self.broker_id, self.address)
        if resp.code != RC.SUCCESS:
            log.warning("broker %s id %d: registration refused: %s", self.broker, self.broker_id,
                        resp.remark or resp.code)
            return False
        self.response, self.state = resp, RegisterState.REGISTERED
        return True
