"""Prometheus metrics of a member (`metrics_port`, path /metrics).

State (term, role, indexes, lag, pending) is read from the nodes at scrape
time by a collector, so the hot path pays only for the few histograms.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dledger.address import format_address
from dledger.core.messages import Role

if TYPE_CHECKING:
    from dledger.core.node import Node

log = logging.getLogger(__name__)

_LAT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# lateness of the loop-stall monitor's callback: a few ms is normal under load; past the
# election timeout's order (hundreds of ms) followers may already have given up on a leader
_STALL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)

# label values of dledger_requests_total (see docs/metrics.md)
KIND_MEMBER = "member"  # votes, heartbeats, pushes, snapshot installs, read indexes, hand-overs
KIND_CLIENT = "client"  # everything else
# a group this process does not host (or that a malformed request did not name): "?" is no
# valid group name, and one value for all keeps a flood of made-up names from making series
OTHER_GROUP = "?"
UNKNOWN_REQUEST = "unknown"  # a request code this member does not know (bounded like the group)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("group", "member")
        self.append_latency = Histogram("dledger_append_latency_seconds", "Append request latency, receipt to commit",
                                        labels, buckets=_LAT_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("dledger_append_batch_entries", "Entries per append request", labels,
                                    buckets=_BATCH_BUCKETS, registry=self.registry)
        self.bytes_appended = Counter("dledger_appended_bytes", "Body bytes appended (leader)", labels,
                                      registry=self.registry)
        self.fsync_latency = Histogram("dledger_fsync_seconds", "Duration of one flush (fsync of new data)",
                                       labels, buckets=_LAT_BUCKETS, registry=self.registry)
        self.entries_appended = Counter("dledger_appended_entries", "Entries appended by clients (leader)", labels,
                                        registry=self.registry)
        # kind: "member" (Raft traffic between members) or "client"; refusals before a group is
        # reached count too, under group "?" when the group is not one this process hosts
        self.requests = Counter("dledger_requests", "Requests answered, by kind (client or member), request and "
                                "response code, refusals included", (*labels, "kind", "request", "code"),
                                registry=self.registry)
        # one event loop per process: every group it hosts is labelled with the same samples
        self.loop_stall = Histogram("dledger_loop_stall_seconds", "How late a callback due every 50 ms ran on "
                                    "the member's event loop (the loop was busy, or the process not scheduled)",
                                    labels, buckets=_STALL_BUCKETS, registry=self.registry)
        self.loop_stall_max = Gauge("dledger_loop_stall_max_seconds", "The worst such lateness since the "
                                    "process started", labels, registry=self.registry)
        self.nodes: list[Node] = []
        self.registry.register(_StateCollector(self.nodes))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on %s/metrics", format_address(host, port))


class _StateCollector(Collector):
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lab = ["group", "member"]
        fams = {
            "term": GaugeMetricFamily("dledger_term", "Current term", labels=lab),
            "role": GaugeMetricFamily("dledger_role", "0 follower, 1 candidate, 2 leader", labels=lab),
            "state": GaugeMetricFamily("dledger_member_state", "1 for this member's role (label state)",
                                       labels=[*lab, "state"]),

            "is_leader": GaugeMetricFamily("dledger_is_leader", "1 when this member leads", labels=lab),
            "end": GaugeMetricFamily("dledger_ledger_end_index", "Last index stored here", labels=lab),
            "commit": GaugeMetricFamily("dledger_committed_index", "Commit index known here", labels=lab),
            "durable": GaugeMetricFamily("dledger_durable_index", "Last index fsynced here", labels=lab),
            "pending": GaugeMetricFamily("dledger_pending_requests", "Appends waiting for commit", labels=lab),
            "writable": GaugeMetricFamily("dledger_store_writable",
                                          "1 when the store takes writes, 0 when it failed or the disk is full "
                                          "(the member then neither leads nor campaigns)", labels=lab),
            "full": GaugeMetricFamily("dledger_store_full",
                                      "1 while client appends are refused for want of disk space", labels=lab),
            "held": GaugeMetricFamily("dledger_retention_held",
                                      "1 while a lagging follower's needs keep retention from freeing space "
                                      "under disk pressure", labels=lab),
            "corrupt": GaugeMetricFamily("dledger_store_corrupt",
                                         "1 while this member holds a record that fails verification (it neither "
                                         "leads nor campaigns until the leader's copy repaired it)", labels=lab),
            "corrupt_index": GaugeMetricFamily("dledger_store_corrupt_index",
                                               "First record known corrupt here (-1: none)", labels=lab),
            "insecure": GaugeMetricFamily("dledger_insecure",
                                          "1 when this member runs --insecure (no TLS, no token, every host "
                                          "served: no request is authenticated)", labels=lab),
        }
        behind = GaugeMetricFamily("dledger_follower_lag_entries", "Entries this follower lacks of what its leader "
                                   "last said was committed (0 on the leader)", labels=lab)
        lag = GaugeMetricFamily("dledger_replication_lag_entries", "Leader end minus follower match",
                                labels=[*lab, "follower"])
        stranded = GaugeMetricFamily("dledger_follower_needs_snapshot",
                                     "1 while a follower needs entries before the leader's log begin: it gets a "
                                     "snapshot (leader's view)",
                                     labels=[*lab, "follower"])
        elections = CounterMetricFamily("dledger_elections", "Elections this member started", labels=lab)
        leader_changes = CounterMetricFamily("dledger_leader_changes", "Leaders this member came to know", labels=lab)
        found = CounterMetricFamily("dledger_corrupt_records_found",
                                    "Times this member found a record failing verification (reads, scrub, pushes)",
                                    labels=lab)
        repaired = CounterMetricFamily("dledger_records_repaired",
                                       "Records of this member rewritten from the leader's copy", labels=lab)
        repairing = GaugeMetricFamily("dledger_follower_corrupt",
                                      "1 while a follower reports a corrupt record the leader is repairing "
                                      "(leader's view)", labels=[*lab, "follower"])
        installed = CounterMetricFamily("dledger_snapshots_installed",
                                        "Snapshots this member installed from a leader (InstallSnapshot)", labels=lab)
        install_in = CounterMetricFamily("dledger_snapshot_install_received_bytes",
                                         "Snapshot bytes this member received from leaders", labels=lab)
        sent = CounterMetricFamily("dledger_snapshots_sent",
                                   "Snapshots followers installed from this member as leader", labels=lab)
        install_out = CounterMetricFamily("dledger_snapshot_install_sent_bytes",
                                          "Snapshot bytes this member sent to followers", labels=lab)
        read_entries = CounterMetricFamily("dledger_read_entries",
                                           "Entries this member sent in answers to clients' GET and READ", labels=lab)
        read_bytes = CounterMetricFamily("dledger_read_body_bytes",
                                         "Body bytes in those answers (a READ without bodies sends none)", labels=lab)
        installing = GaugeMetricFamily("dledger_snapshot_installing",
                                       "1 while this member receives a snapshot from the leader", labels=lab)
        for n in self.nodes:
            st = n.status()
            v = [st.group, st.self_id]
            fams["term"].add_metric(v, st.term)
            fams["role"].add_metric(v, int(st.role))
            for role in Role:
                fams["state"].add_metric([*v, role.name.lower()], 1 if st.role == role else 0)
            leader_changes.add_metric(v, st.leader_changes)
            fams["is_leader"].add_metric(v, 1 if st.is_leader else 0)
            fams["end"].add_metric(v, st.end_index)
            fams["commit"].add_metric(v, st.committed_index)
            fams["durable"].add_metric(v, st.durable_index)
            fams["pending"].add_metric(v, st.pending_appends)
            fams["writable"].add_metric(v, 0 if st.store_error else 1)
            fams["held"].add_metric(v, 1 if st.retention_held_by else 0)
            fams["full"].add_metric(v, 1 if st.full else 0)
            fams["corrupt"].add_metric(v, 1 if st.corrupt_index >= 0 else 0)
            fams["corrupt_index"].add_metric(v, st.corrupt_index)
            fams["insecure"].add_metric(v, 1 if st.security_mode == "insecure" else 0)
            elections.add_metric(v, st.elections)
            found.add_metric(v, st.corruptions_found)
            repaired.add_metric(v, st.records_repaired)
            installed.add_metric(v, st.snapshots_installed)
            install_in.add_metric(v, st.install_bytes_received)
            sent.add_metric(v, st.snapshots_sent)
            install_out.add_metric(v, st.install_bytes_sent)
            installing.add_metric(v, 1 if st.installing else 0)
            read_entries.add_metric(v, st.entries_read)
            behind.add_metric(v, 0 if st.is_leader else max(0, st.leader_committed - st.end_index))
            read_bytes.add_metric(v, st.read_body_bytes)
            for f in st.followers:
                lag.add_metric([*v, f.peer], st.end_index - f.match_index)
                stranded.add_metric([*v, f.peer], 1 if f.needs_snapshot else 0)
                repairing.add_metric([*v, f.peer], 1 if f.repair_index >= 0 else 0)
        yield from fams.values()
        yield lag
        yield behind
        yield stranded
        yield repairing
        yield elections
        yield leader_changes
        yield found
        yield repaired
        yield installed
        yield install_in
        yield sent
        yield install_out
        yield installing
        yield read_entries
        yield read_bytes
