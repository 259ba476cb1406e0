"""A client of the controller: what brokers and the admin commands use.

Requests go to the leader ("active controller"): a CONTROLLER_NOT_LEADER answer names it and
the request follows; an unreachable controller is skipped. Heartbeats go to every controller
(each keeps its own liveness table), on connections kept open: a broker whose process dies
closes them, and the controllers see it at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence

from dledger.address import AddressError, parse_address
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.config import ConfigError, parse_peers
from dledger.controller import messages as m
from dledger.runtime.transport import FaultInjector, Message, TransportClient
from dledger.security.roles import AccessRole, expect_role
from dledger.security.tls import TlsConfig, client_context

RETRY_PAUSE_S = 0.1


def parse_controllers(text: str) -> list[str]:
    """'host:port;host:port', or a peers string ('n0-host:port;...'), as addresses."""
    parts = [p.strip() for p in text.replace(",", ";").split(";") if p.strip()]
    if not parts:
        raise ConfigError("no controller address given")
    if all("-" in p.split(":")[0] for p in parts):
        return [p.address for p in parse_peers(";".join(parts)).values()]
    for p in parts:
        try:
            parse_address(p, "controller address")
        except AddressError as e:
            raise ConfigError(str(e)) from None
    return parts


class ControllerClient:
    def __init__(self, controllers: str | Sequence[str], timeout: float = 5.0, tls: TlsConfig | None = None,
                 auth_token: str | None = None, faults: FaultInjector | None = None) -> None:
        self.addresses = parse_controllers(controllers) if isinstance(controllers, str) else list(controllers)
        self.timeout = timeout
        self._transport = TransportClient(ssl=client_context(tls) if tls else None,
                                          server_check=expect_role(AccessRole.CONTROLLER),
                                          auth_token=auth_token.encode() if auth_token else None,
                                          backoff_max_s=0.5, faults=faults)
        self._leader: str | None = None

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call_at(self, address: str, req: m.Request, timeout: float | None = None) -> m.Response:
        """One request to one controller (raises DLedgerError NETWORK_ERROR / TIMEOUT)."""
        code = int(req.__struct_config__.tag)  # type: ignore[arg-type]
        raw = await self._transport.request(address, Message(code, m.encode(req)), timeout or self.timeout)
        try:
            return m.decode_response(raw.meta)
        except m.DECODE_ERRORS:
            return m.Response(int(RC.REQUEST_CODE_NOT_SUPPORTED), f"{address} answered {raw.code}: not a controller")

    async def call(self, req: m.Request) -> m.Response:
        """A request to the leader, following redirects and skipping dead controllers until
        the timeout; the last answer (or DLedgerError when none came)."""
        deadline = time.monotonic() + self.timeout
        last: m.Response | None = None
        error: DLedgerError | None = None
        while True:
            order = ([self._leader] if self._leader else []) + [a for a in self.addresses if a != self._leader]
            elsewhere: str | None = None
            for address in order:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    resp = await self.call_at(address, req, left)
                except DLedgerError as e:
                    error = e
                    continue
                if resp.code != RC.CONTROLLER_NOT_LEADER:
                    self._leader = address
                    return resp
                last = resp
                named = resp.leader_address
                if named and named != address:
                    if named in self.addresses:
                        self._leader = named
                        break  # go to the named leader first
                    # not listed (another name for a listed one, or a partial list): the listed
                    # ones first, so a broker's requests share its heartbeats' connection
                    elsewhere = elsewhere or named
            else:
                if elsewhere is not None:
                    self._leader = elsewhere
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                if last is not None:
                    return last
                raise error or DLedgerError(ResponseCode.TIMEOUT, "no controller answered")
            await asyncio.sleep(RETRY_PAUSE_S)

    async def heartbeat(self, hb: m.BrokerHeartbeat, timeout: float | None = None) -> list[m.Response]:
        """Send a heartbeat to every controller; the answers that came (the leader's may grant
        a master lease)."""
        results = await asyncio.gather(*(self.call_at(a, hb, timeout) for a in self.addresses),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, m.Response)]

    def beat_forever(self, heartbeat: Callable[[], m.BrokerHeartbeat], interval_s: float) -> asyncio.Task[None]:
        """A task sending `heartbeat()` to every controller every `interval_s` until cancelled
        (what a broker runs; one slow controller never delays the others' heartbeats)."""
        async def run() -> None:
            while True:
                await self.heartbeat(heartbeat(), timeout=interval_s * 3)
                await asyncio.sleep(interval_s)

        return asyncio.get_running_loop().create_task(run())

    async def metadata(self) -> dict[str, m.MetadataInfo | str]:
        """Every controller's own view (GET_METADATA_INFO), or why it did not answer."""
        async def one(address: str) -> m.MetadataInfo | str:
            try:
                resp = await self.call_at(address, m.GetMetadataInfo())
            except DLedgerError as e:
                return e.message
            return resp.metadata if resp.metadata is not None else resp.remark or f"code {resp.code}"

        values = await asyncio.gather(*(one(a) for a in self.addresses))
        return dict(zip(self.addresses, values, strict=True))

    # --- the requests of docs/controller.md ---------------------------------------------------

    async def get_next_broker_id(self, cluster: str, broker: str) -> m.Response:
        return await self.call(m.GetNextBrokerId(cluster, broker))

    async def apply_broker_id(self, cluster: str, broker: str, broker_id: int, check_code: str) -> m.Response:
        return await self.call(m.ApplyBrokerId(cluster, broker, broker_id, check_code))

    async def register_broker(self, cluster: str, broker: str, broker_id: int, address: str) -> m.Response:
        return await self.call(m.RegisterBroker(cluster, broker, broker_id, address))

    async def elect_master(self, broker: str, broker_id: int = m.NO_ID, *, cluster: str = "",
                           designate: bool = False) -> m.Response:
        """Broker-triggered (its own id), controller-triggered (NO_ID) or an admin's (designate)."""
        return await self.call(m.ElectMaster(cluster, broker, broker_id, designate, int(time.time() * 1000)))

    async def alter_sync_state_set(self, broker: str, master_id: int, master_epoch: int, new_set: Iterable[int],
                                   sync_state_set_epoch: int) -> m.Response:
        return await self.call(m.AlterSyncStateSet(broker, master_id, master_epoch, sorted(new_set),
                                                   sync_state_set_epoch))

    async def get_replica_info(self, broker: str) -> m.Response:
        return await self.call(m.GetReplicaInfo(broker))

    async def get_sync_state_data(self, brokers: Sequence[str]) -> m.Response:
        return await self.call(m.GetSyncStateData(list(brokers)))

    async def all_sync_state_data(self) -> m.Response:
        """Every broker set the controllers hold (ours: upstream asked NameServer for the names)."""
        return await self.call(m.GetSyncStateData(all_sets=True))

    async def get_controller_config(self, address: str) -> m.Response:
        """One controller's runtime config (each controller keeps its own: no Raft log)."""
        return await self.call_at(address, m.GetControllerConfig())

    async def update_controller_config(self, address: str, properties: str) -> m.Response:
        """`key=value` lines applied to one controller's runtime config (admin role)."""
        return await self.call_at(address, m.UpdateControllerConfig(properties))

    async def clean_broker_data(self, broker: str, ids: Sequence[int] = (), *, cluster: str = "",
                                clean_living_broker: bool = False) -> m.Response:
        return await self.call(m.CleanBrokerData(cluster, broker, ";".join(map(str, ids)), clean_living_broker))

