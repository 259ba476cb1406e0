"""What a controller request does to the state (upstream's ReplicasInfoManager), as a pure function.

`process(state, command)` validates the request in upstream's exact order (first failure
wins) against the state *as of the command's place in the log*, and returns the answer and
the events to apply. It runs inside the state machine's apply, on every controller,
so two requests can never both be validated against the same state (upstream
validated on the leader before logging, and two alters with the same epoch could both pass).
Liveness is the leader's, written into the command: apply stays deterministic.

Deliberate differences from upstream (docs/controller.md):
- a first election (master epoch 0) names a registered replica only (upstream took any id);
  an admin's named replica must also be alive;
- a controller-triggered election that finds no candidate bumps the master epoch once per
  failure, not once per retry (the set already without a master is left as it is);
- a master that registers again (it restarted) loses its role; the next election (not an
  admin's) waits until every live candidate reported after the restart (LiveInfo.view), so
  it ranks what each holds now (upstream kept the master, whose lost tail slaves then cut);
- an id is bound to the certificate name that applied for it (`Command.principal`); a
  registration, a broker's election or an alter from another certificate is refused 430
  (UNAUTHENTICATED) before anything else; an id applied for without a certificate is bound
  at its first registration with one.
"""

from __future__ import annotations

from collections.abc import Callable

from dledger.codes import ControllerResponseCode as RC
from dledger.codes import ResponseCode
from dledger.controller import messages as m
from dledger.controller.elect_policy import LiveInfo, elect, unreported
from dledger.controller.state import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    BindPrincipalEvent,
    BrokerSet,
    CleanBrokerDataEvent,
    ControllerState,
    ElectMasterEvent,
    Event,
    MasterRestartedEvent,
    UpdateBrokerAddressEvent,
)

Outcome = tuple[m.Response, list[Event]]
MAX_BROKER_SETS = 10_000  # any client may apply for ids: the state (and every snapshot) stays bounded


def process(state: ControllerState, cmd: m.Command) -> Outcome:
    """The answer to `cmd.request` and the events it makes (none for a read or a refusal)."""
    req = cmd.request
    alive = cmd.alive.get(getattr(req, "broker_name", ""), {})
    if isinstance(req, m.ApplyBrokerId):
        return _apply_broker_id(state, req, cmd.principal)
    refusal = binding_refusal(state, req, cmd.principal)
    if refusal is not None:
        return _refuse(ResponseCode.UNAUTHENTICATED, refusal)
    if isinstance(req, m.RegisterBroker):
        return _register_broker(state, req, alive, cmd.principal)
    if isinstance(req, m.ElectMaster):
        return _elect_master(state, req, alive, cmd.unclean)
    if isinstance(req, m.AlterSyncStateSet):
        return _alter_sync_state_set(state, req, alive)
    if isinstance(req, m.CleanBrokerData):
        return _clean_broker_data(state, req, alive)
    if isinstance(req, m.GetNextBrokerId):
        return m.Response(cluster_name=req.cluster_name, broker_name=req.broker_name,
                          next_broker_id=state.next_broker_id(req.broker_name)), []
    if isinstance(req, m.GetReplicaInfo):
        return _get_replica_info(state, req), []
    return _get_sync_state_data(state, req, cmd.alive), []


def _refuse(code: RC | ResponseCode, remark: str) -> Outcome:
    return m.Response(int(code), remark), []


def binding_refusal(state: ControllerState, req: m.AnyRequest, principal: str) -> str | None:
    """Why a replica's request does not come from the certificate bound to the id it acts for
    (None: it does, or nothing is bound, or it carries no certificate). The id: the registering
    one, a broker's election's own, an alter's current master (only the master alters)."""
    if not principal:
        return None
    s = state.get(getattr(req, "broker_name", ""))
    if s is None:
        return None
    broker_id: int | None
    if isinstance(req, m.RegisterBroker):
        broker_id, what = req.broker_id, "register"
    elif isinstance(req, m.ElectMaster) and req.broker_id != m.NO_ID and not req.designate_elect:
        broker_id, what = req.broker_id, "ask for an election as"
    elif isinstance(req, m.AlterSyncStateSet):
        broker_id, what = s.master_id, "alter the SyncStateSet as the master,"
    else:
        return None
    bound = s.principal_of(broker_id)
    if not bound or bound == principal:
        return None
    return f"certificate CN={principal} may not {what} broker {broker_id} of {s.name}: it is bound to CN={bound}"


def _apply_broker_id(state: ControllerState, req: m.ApplyBrokerId, principal: str) -> Outcome:
    s = state.get(req.broker_name)
    event = ApplyBrokerIdEvent(req.cluster_name, req.broker_name, req.register_check_code.split(";")[0],
                               req.applied_broker_id, req.register_check_code, principal)
    ok = m.Response(cluster_name=req.cluster_name, broker_name=req.broker_name)
    if s is None:
        if len(state.sets) >= MAX_BROKER_SETS:
            return _refuse(RC.CONTROLLER_BROKER_ID_INVALID, f"the controller holds {MAX_BROKER_SETS} broker sets: "
                           "clean one before adding another")
        if req.applied_broker_id == 1:
            return ok, [event]
        return _refuse(RC.CONTROLLER_BROKER_ID_INVALID,
                       f"Broker-set {req.broker_name} hasn't been registered in controller, but broker try to "
                       f"apply brokerId: {req.applied_broker_id}")
    known = s.replicas.get(req.applied_broker_id)
    if known is None and len(s.replicas) >= m.MAX_SET:
        return _refuse(RC.CONTROLLER_BROKER_ID_INVALID, f"broker set {req.broker_name} has {m.MAX_SET} replicas")
    if known is not None and known.principal and principal and known.principal != principal:
        return _refuse(ResponseCode.UNAUTHENTICATED, f"broker {req.applied_broker_id} of {req.broker_name} is bound "
                       f"to CN={known.principal}, not CN={principal}")
    if known is None or known.check_code == req.register_check_code:  # a retry after a lost answer
        return ok, [event]
    return _refuse(RC.CONTROLLER_BROKER_ID_INVALID,
                   f"Fail to apply brokerId: {req.applied_broker_id} in broker-set: {req.broker_name}")


def _register_broker(state: ControllerState, req: m.RegisterBroker, alive: dict[int, LiveInfo],
                     principal: str) -> Outcome:
    s = state.get(req.broker_name)
    if s is None or req.broker_id not in s.replicas:
        return _refuse(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"BrokerId: {req.broker_id} hasn't been registered in broker-set: {req.broker_name}")
    events: list[Event] = []
    principals = s.principals
    if principal and not s.principal_of(req.broker_id):  # registered before bindings: bound now
        events.append(BindPrincipalEvent(req.broker_name, req.broker_id, principal))
        principals[req.broker_id] = principal
    resp = m.Response(cluster_name=req.cluster_name, broker_name=req.broker_name,
                      sync_state_set=sorted(s.sync_state_set), sync_state_set_epoch=s.sync_state_set_epoch,
                      principals=principals)
    resp.master_epoch = s.master_epoch  # (ours: also without a master; the broker's heartbeats report it)
    if req.broker_id == s.master_id:
        # the master restarted: no master until an election ranks the SyncStateSet by facts
        # reported after the restart (MasterRestartedEvent; a slave may hold more than it kept)
        events.append(MasterRestartedEvent(req.broker_name))
        resp.master_epoch = s.master_epoch + 1
    elif s.master_id is not None and s.master_id in alive:  # #5631: a dead master is not named
        resp.master_broker_id, resp.master_address = s.master_id, s.master_address
    if s.replicas[req.broker_id].address != req.broker_address:
        if resp.master_broker_id == req.broker_id:
            resp.master_address = req.broker_address
        events.append(UpdateBrokerAddressEvent(req.cluster_name, req.broker_name, req.broker_id, req.broker_address))
    return resp, events


def _elect_master(state: ControllerState, req: m.ElectMaster, alive: dict[int, LiveInfo], unclean: bool) -> Outcome:
    s = state.get(req.broker_name)
    if s is None:
        return _refuse(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"Broker {req.broker_name} hasn't been registered")
    by_controller = req.broker_id == m.NO_ID
    new: int | None = None
    if s.first_election and not by_controller:
        if req.broker_id not in s.replicas or (req.designate_elect and req.broker_id not in alive):
            return _refuse(RC.CONTROLLER_ELECT_MASTER_FAILED,
                           f"Broker {req.broker_id} of {req.broker_name} is not a live registered replica")
        new = req.broker_id
    else:
        if s.fresh_epoch and s.master_id is None and not req.designate_elect:
            stale = unreported(_pool(s, alive, unclean), alive, s.fresh_epoch)
            if stale:  # no event: nothing is decided until they report
                return _refuse(RC.CONTROLLER_ELECT_MASTER_FAILED,
                               f"broker set {req.broker_name}: the master restarted (epoch {s.fresh_epoch}); waiting "
                               f"for replicas {stale} to report their logs since")
        new = elect(s.sync_state_set, set(s.replicas) if unclean else None, s.master_id,
                    req.broker_id if req.designate_elect else None, alive.__contains__, alive.get)
    if new is not None and new == s.master_id:
        return _master_answer(RC.CONTROLLER_MASTER_STILL_EXIST, s, s.master_id, s.master_epoch,
                              s.sync_state_set_epoch, s.sync_state_set, "The old master is still alive"), []
    if new is not None:
        return _master_answer(RC.SUCCESS, s, new, s.master_epoch + 1, s.sync_state_set_epoch + 1, {new}, ""), [
            ElectMasterEvent(req.broker_name, True, new)]
    if not by_controller:
        return _refuse(RC.CONTROLLER_ELECT_MASTER_FAILED,
                       f"Failed to elect a new master for broker-set {req.broker_name}")
    events: list[Event] = [] if s.master_id is None else [ElectMasterEvent(req.broker_name, False)]
    return _refuse(RC.CONTROLLER_MASTER_NOT_AVAILABLE,
                   f"Failed to elect a new master for broker-set {req.broker_name}: no live candidate")[0], events


def _pool(s: BrokerSet, alive: dict[int, LiveInfo], unclean: bool) -> list[int]:
    """The live replicas the policy would choose from (the SyncStateSet's, else with unclean
    election any), as `elect` draws them."""
    pool = [i for i in s.sync_state_set if i in alive]
    return pool or ([i for i in s.replicas if i in alive] if unclean else [])


def _master_answer(code: RC, s: BrokerSet, master: int | None, epoch: int, sss_epoch: int, sss: set[int],
                   remark: str) -> m.Response:
    address = s.replicas[master].address if master is not None and master in s.replicas else None
    return m.Response(int(code), remark, cluster_name=s.cluster, broker_name=s.name, master_broker_id=master,
                      master_address=address, master_epoch=epoch, sync_state_set_epoch=sss_epoch,
                      sync_state_set=sorted(sss), broker_addrs={i: r.address for i, r in sorted(s.replicas.items())},
                      principals=s.principals)


def _alter_sync_state_set(state: ControllerState, req: m.AlterSyncStateSet, alive: dict[int, LiveInfo]) -> Outcome:
    s = state.get(req.broker_name)
    new = set(req.sync_state_set)
    if s is None:
        return _refuse(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "Broker metadata is not existed")
    if new == s.sync_state_set:
        return _refuse(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                       "The newSyncStateSet is equal with origin syncStateSet, no needed to update syncStateSet")
    if s.master_id is None or s.master_id != req.master_broker_id:
        return _refuse(RC.CONTROLLER_INVALID_MASTER,
                       f"Rejecting alter syncStateSet request because the current leader is: {s.master_id}, "
                       f"not {req.master_broker_id}")
    if req.master_epoch != s.master_epoch:
        return _refuse(RC.CONTROLLER_FENCED_MASTER_EPOCH,
                       f"Rejecting alter syncStateSet request because the current master epoch is: {s.master_epoch}, "
                       f"not {req.master_epoch}")
    if req.sync_state_set_epoch != s.sync_state_set_epoch:
        return _refuse(RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                       f"Rejecting alter syncStateSet request because the current syncStateSet epoch is: "
                       f"{s.sync_state_set_epoch}, not {req.sync_state_set_epoch}")
    for i in req.sync_state_set:
        if i not in s.replicas:
            return _refuse(RC.CONTROLLER_INVALID_REPLICAS,
                           f"Rejecting alter syncStateSet request because the replicas {i} don't exist")
        if i not in alive:
            return _refuse(RC.CONTROLLER_BROKER_NOT_ALIVE,
                           f"Rejecting alter syncStateSet request because the replicas {i} don't alive")
    if s.master_id not in new:
        return _refuse(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                       f"Rejecting alter syncStateSet request because the newSyncStateSet don't contains "
                       f"origin leader {s.master_id}")
    epoch = s.sync_state_set_epoch + 1
    return m.Response(broker_name=s.name, new_sync_state_set_epoch=epoch, sync_state_set=sorted(new),
                      sync_state_set_epoch=epoch), [AlterSyncStateSetEvent(s.name, frozenset(new))]


def _clean_broker_data(state: ControllerState, req: m.CleanBrokerData, alive: dict[int, LiveInfo]) -> Outcome:
    s = state.get(req.broker_name)
    text = req.broker_controller_ids_to_clean.strip()
    ids: frozenset[int] | None = None
    if text:
        try:
            ids = frozenset(int(p) for p in text.split(";") if p.strip())
        except ValueError:
            return _refuse(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                           f"Please set the option <brokerControllerIdsToClean> according to the format: {text}")
    if not req.clean_living_broker:
        if ids is None and s is not None and s.master_id is not None:
            return _refuse(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                           f"Broker {req.broker_name} is still alive, clean up failure")
        for i in sorted(ids or ()):
            if i in alive:
                return _refuse(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                               f"Broker {req.broker_name}, {i} is still alive, clean up failure")
    if s is None:
        return _refuse(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                       f"Broker {req.broker_name} is not existed,clean broker data failure.")
    return m.Response(), [CleanBrokerDataEvent(req.broker_name, ids)]


def _get_replica_info(state: ControllerState, req: m.GetReplicaInfo) -> m.Response:
    s = state.get(req.broker_name)
    if s is None:
        return m.Response(int(RC.CONTROLLER_BROKER_METADATA_NOT_EXIST),
                          f"Broker metadata is not existed: {req.broker_name}")
    return m.Response(broker_name=s.name, cluster_name=s.cluster, master_broker_id=s.master_id,
                      master_address=s.master_address, master_epoch=s.master_epoch,
                      sync_state_set=sorted(s.sync_state_set), sync_state_set_epoch=s.sync_state_set_epoch,
                      principals=s.principals)


def _get_sync_state_data(state: ControllerState, req: m.GetSyncStateData,
                         alive: dict[str, dict[int, LiveInfo]]) -> m.Response:
    if not req.broker_names and not req.all_sets:
        return m.Response(int(RC.SYSTEM_ERROR), "no broker name given")
    out: dict[str, m.ReplicasInfo] = {}
    for name in sorted(state.sets) if req.all_sets else req.broker_names:
        s = state.get(name)
        if s is not None:
            out[name] = replicas_info(s, alive.get(name, {}).__contains__)
    return m.Response(replicas_info=out)


def replicas_info(s: BrokerSet, is_alive: Callable[[int], bool]) -> m.ReplicasInfo:
    """A broker set as `mqadmin getSyncStateSet` shows it: who is in sync, who is not, who lives."""
    def ident(i: int) -> m.ReplicaIdentity:
        return m.ReplicaIdentity(s.name, i, s.replicas[i].address, is_alive(i))

    ids = sorted(s.replicas)
    return m.ReplicasInfo(s.master_id, s.master_address, s.master_epoch, s.sync_state_set_epoch,
                          [ident(i) for i in ids if i in s.sync_state_set],
                          [ident(i) for i in ids if i not in s.sync_state_set])
