"""The optional Prometheus endpoint: GPU gauges under dcgm-exporter's names, and gpuwarden's own.

Each ``Metrics`` owns a private ``CollectorRegistry``; the process-wide default registry is never
touched, so two instances (or two tests) never see each other's values.

GPU gauges carry dcgm-exporter's metric names and labels, so dashboards written for it work
unchanged. They can be switched off (``gpu_gauges=False``) where dcgm-exporter already runs. A
value the device cannot tell is not exported at all (never as ``0``). A lost GPU exports no
dcgm gauge but ``DCGM_FI_DEV_XID_ERRORS``; ``gpuwarden_gpu_lost`` (always exported, 1 for a
lost GPU, 0 otherwise) says so. ``DCGM_FI_DEV_XID_ERRORS`` is the last XID seen on the GPU
since gpuwarden started, kept when the GPU is then lost (XID 79: it fell off the bus); a GPU
with no XID seen yet has no sample. ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the
driver loaded) keeps dcgm-exporter's name and is untyped: prometheus_client would rename a
counter to ``…_total``.

gpuwarden's own series all carry a ``Hostname`` label (the host the daemon reports as, like
the GPU gauges), so a dashboard over many nodes can filter them by host.

Thread safety: the run loop calls ``observe_*`` from its thread while the HTTP server thread
scrapes; values read at scrape time are replaced whole under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from gpuwarden.metrics_http import MetricsServer
from gpuwarden.model import EventKind, GpuState, Snapshot

DEFAULT_PORT: Final = 9400
DEFAULT_HOST: Final = "127.0.0.1"
STEP_RESULTS: Final = frozenset({"ok", "failed", "refused", "dry_run"})
# Seconds: a healthy tick takes about a millisecond; anything past a few seconds is a stall.
TICK_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DCGM_LABELS: Final = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id")
# (name, help); dcgm-exporter exports all of them as gauges.
DCGM_GAUGES: Final = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
)
ENERGY: Final = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "Total energy consumption since boot (in mJ).",
)


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9400"``, ``":9400"`` or ``"9400"`` (127.0.0.1), ``"[::1]:9400"``,
    ``"localhost:0"`` (any free port) -> (host, port).

    Raises ``ValueError`` saying what is wrong."""
    text = listen.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    elif host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(
                f"bad listen address {listen!r}: expected [IPv6]:port, e.g. [::1]:9400"
            )
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(
            f"bad listen address {listen!r}: put an IPv6 address in brackets, [::1]:9400"
        )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"bad listen address {listen!r}: the port must be 0..65535")
    return host or DEFAULT_HOST, int(port_text)


def _labels(gpu: GpuState, host: str) -> list[str]:
    return [str(gpu.index), gpu.uuid or "", gpu.device, gpu.name or "", host, gpu.pci_bus_id or ""]


@dataclass(frozen=True)
class _Latest:
    """What the collectors read at scrape time; replaced whole each tick."""

    snapshot: Snapshot | None = None
    last_xid: Mapping[int, int] | None = None
    rule_states: Mapping[tuple[str, str], int] | None = None
    open_incidents: int = 0
    outbox: Mapping[str, int] | None = None
    delivery_failures: int = 0


class _GpuCollector(Collector):
    """dcgm-exporter's gauges from the latest snapshot."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        latest = self._metrics.latest()
        families: dict[str, GaugeMetricFamily | UnknownMetricFamily] = {
            name: GaugeMetricFamily(name, text, labels=DCGM_LABELS) for name, text in DCGM_GAUGES
        }
        families[ENERGY[0]] = UnknownMetricFamily(*ENERGY, labels=DCGM_LABELS)
        snapshot = latest.snapshot
        if snapshot is not None:
            last_xid = latest.last_xid or {}
            for gpu in snapshot.gpus:
                labels = _labels(gpu, snapshot.host)
                xid = last_xid.get(gpu.index)
                if gpu.lost:  # nothing else can be read; what it said last still counts
                    if xid is not None:
                        families["DCGM_FI_DEV_XID_ERRORS"].add_metric(labels, float(xid))
                    continue
                values = {
                    "DCGM_FI_DEV_GPU_UTIL": gpu.utilization_pct,
                    "DCGM_FI_DEV_FB_USED": gpu.memory.used_mib,
                    "DCGM_FI_DEV_FB_FREE": gpu.memory.free_mib,
                    "DCGM_FI_DEV_GPU_TEMP": gpu.temperature_c,
                    "DCGM_FI_DEV_POWER_USAGE": gpu.power_w,
                    "DCGM_FI_DEV_XID_ERRORS": xid,
                    "DCGM_FI_DEV_SM_CLOCK": gpu.sm_clock_mhz,
                    "DCGM_FI_DEV_MEM_CLOCK": gpu.memory_clock_mhz,
                    ENERGY[0]: gpu.energy_mj,
                }
                for name, value in values.items():
                    if value is not None:
                        families[name].add_metric(labels, float(value))
        yield from families.values()


class _WithHostname(Collector):
    """gpuwarden's own series, each with a ``Hostname`` label (the GPU gauges have theirs)."""

    def __init__(self, own: CollectorRegistry, metrics: Metrics) -> None:
        self._own = own
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        host = self._metrics.hostname()
        for family in self._own.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = {"Hostname": host, **sample.labels}
                labelled.add_sample(
                    sample.name, labels, sample.value, sample.timestamp, sample.exemplar
                )
            yield labelled


class _StateCollector(Collector):
    """gpuwarden's values that the run loop sets whole each tick (not accumulated here)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        latest = self._metrics.latest()
        lost = GaugeMetricFamily(
            "gpuwarden_gpu_lost",
            "1 when the GPU could not be read at all (it fell off the bus), else 0.",
            labels=DCGM_LABELS,
        )
        if latest.snapshot is not None:
            for gpu in latest.snapshot.gpus:
                lost.add_metric(_labels(gpu, latest.snapshot.host), 1.0 if gpu.lost else 0.0)
        yield lost
        states = GaugeMetricFamily(
            "gpuwarden_rule_scopes",
            "Scopes (GPUs, processes) a rule is in the given state for.",
            labels=("rule", "state"),
        )
        for (rule, state), count in sorted((latest.rule_states or {}).items()):
            states.add_metric([rule, state], float(count))
        yield states
        yield GaugeMetricFamily(
            "gpuwarden_open_incidents", "Incidents open now.", value=latest.open_incidents
        )
        outbox = GaugeMetricFamily(
            "gpuwarden_outbox_messages",
            "Notification outbox messages by status.",
            labels=("status",),
        )
        for status, count in sorted((latest.outbox or {}).items()):
            outbox.add_metric([status], float(count))
        yield outbox
        yield CounterMetricFamily(
            "gpuwarden_notification_delivery_failures",
            "Notification delivery attempts that failed.",
            value=latest.delivery_failures,
        )


class Metrics:
    """Everything gpuwarden exports to Prometheus, on a registry of its own."""

    def __init__(self, *, gpu_gauges: bool = True, host: str | None = None) -> None:
        self.registry = CollectorRegistry()  # what is served
        self.host = host  # else the host of the latest snapshot
        self._lock = threading.Lock()
        self._latest = _Latest()
        self._last_xid: dict[int, int] = {}
        self._server: MetricsServer | None = None
        if gpu_gauges:
            self.registry.register(_GpuCollector(self))
        reg = CollectorRegistry()  # gpuwarden's own series, served with a Hostname label
        self.registry.register(_WithHostname(reg, self))
        reg.register(_StateCollector(self))
        self.steps = Counter(
            "gpuwarden_steps",
            "Ladder steps by action kind and result.",
            ("kind", "result"),
            registry=reg,
        )
        self.tick_seconds = Histogram(
            "gpuwarden_tick_duration_seconds",
            "Time one tick took: read the source, evaluate rules, dispatch steps.",
            buckets=TICK_BUCKETS,
            registry=reg,
        )
        self.last_tick = Gauge(
            "gpuwarden_last_tick_timestamp_seconds",
            "Unix time of the snapshot the last tick read.",
            registry=reg,
        )
        self.reloads = Counter(
            "gpuwarden_reloads", "Config and playbook reloads by result.", ("result",), registry=reg
        )
        for result in ("ok", "failed"):
            self.reloads.labels(result)
        self.last_reload = Gauge(
            "gpuwarden_last_reload_timestamp_seconds",
            "Unix time of the last reload attempt.",
            registry=reg,
        )
        self.last_reload_ok = Gauge(
            "gpuwarden_last_reload_successful",
            "1 when the last reload was applied, 0 when it was refused (1 before any: the "
            "config and playbooks the daemon started with loaded).",
            registry=reg,
        )
        self.last_reload_ok.set(1)
        self.incidents = Counter(
            "gpuwarden_incidents",
            "Incidents opened (rules that fired), by rule and severity.",
            ("rule", "severity"),
            registry=reg,
        )
        self.shadow = Gauge(
            "gpuwarden_shadow_mode",
            "1 while the daemon acts on nothing (mode: shadow, dry_run or --dry-run), else 0.",
            registry=reg,
        )
        self.breaker = Gauge(
            "gpuwarden_circuit_breaker_tripped",
            "1 while the circuit breaker halts destructive steps.",
            registry=reg,
        )
        self.cloud_instances = Gauge(
            "gpuwarden_cloud_instances", "Cloud instances gpuwarden started and runs.", registry=reg
        )
        self.cloud_spend = Gauge(
            "gpuwarden_cloud_spend_dollars",
            "Estimated spend on cloud instances gpuwarden started (USD).",
            registry=reg,
        )

    def latest(self) -> _Latest:
        with self._lock:
            return self._latest

    def hostname(self) -> str:
        """The ``Hostname`` label of gpuwarden's own series."""
        if self.host:
            return self.host
        snapshot = self.latest().snapshot
        return snapshot.host if snapshot is not None else ""

    # -- what the run loop calls --------------------------------------------------------------

    def observe_tick(
        self,
        snapshot: Snapshot,
        seconds: float,
        rule_states: Mapping[tuple[str, str], int],
        open_incidents: int,
    ) -> None:
        """After each tick: the snapshot it read, how long it took, rule states, open incidents."""
        for event in snapshot.events:
            if event.kind == EventKind.XID and event.gpu is not None and event.xid is not None:
                self._last_xid[event.gpu] = event.xid
        self.tick_seconds.observe(seconds)
        self.last_tick.set(snapshot.time)
        with self._lock:
            self._latest = _Latest(
                snapshot=snapshot,
                last_xid=dict(self._last_xid),
                rule_states=dict(rule_states),
                open_incidents=open_incidents,
                outbox=self._latest.outbox,
                delivery_failures=self._latest.delivery_failures,
            )

    def observe_step(self, kind: str, result: str) -> None:
        """A step finished: ``result`` is ok, failed, refused or dry_run."""
        if result not in STEP_RESULTS:
            raise ValueError(f"step result {result!r}: expected one of {sorted(STEP_RESULTS)}")
        self.steps.labels(kind, result).inc()

    def observe_outbox(self, counts: Mapping[str, int], failures_total: int) -> None:
        """The outbox's messages by status, and delivery failures since the daemon started."""
        with self._lock:
            old = self._latest
            self._latest = _Latest(
                snapshot=old.snapshot,
                last_xid=old.last_xid,
                rule_states=old.rule_states,
                open_incidents=old.open_incidents,
                outbox=dict(counts),
                delivery_failures=failures_total,
            )

    def observe_reload(self, ok: bool, when: float) -> None:
        self.reloads.labels("ok" if ok else "failed").inc()
        self.last_reload.set(when)
        self.last_reload_ok.set(1 if ok else 0)

    def observe_rules(self, rules: Iterable[tuple[str, str]]) -> None:
        """The loaded rules, (name, severity): each has an incident counter from 0, so that
        its first incident is an increase a dashboard annotation sees."""
        for rule, severity in rules:
            self.incidents.labels(rule, severity)

    def observe_incident(self, rule: str, severity: str) -> None:
        """A rule fired: an incident opened."""
        self.incidents.labels(rule, severity).inc()

    def observe_mode(self, shadow: bool) -> None:
        self.shadow.set(1 if shadow else 0)

    def observe_breaker(self, tripped: bool) -> None:
        self.breaker.set(1 if tripped else 0)

    def observe_cloud(self, instances: int, spend_usd: float) -> None:
        """Live instances gpuwarden owns, and the estimated spend of all it launched."""
        self.cloud_instances.set(instances)
        self.cloud_spend.set(spend_usd)

    # -- the endpoint -------------------------------------------------------------------------

    def serve(self, listen: str) -> MetricsServer:
        """Serve ``/metrics`` on ``listen`` (see ``parse_listen``) from one daemon thread,
        with bounded connections and timeouts (``metrics_http``)."""
        if self._server is not None:
            raise RuntimeError("metrics are already served")
        host, port = parse_listen(listen)
        self._server = MetricsServer(self.registry, host, port)
        return self._server

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) actually bound, or ``None`` when not serving."""
        return self._server.address if self._server is not None else None

    def close(self) -> None:
        """Stop serving; safe to call twice or when never served."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
