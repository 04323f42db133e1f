"""The Prometheus endpoint, scraped over real HTTP from a server on a free local port, and the
server's bounds: connections, timeouts, request size."""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuwarden.metrics import DCGM_GAUGES, ENERGY, TICK_BUCKETS, Metrics, parse_listen
from gpuwarden.metrics_http import MetricsServer
from gpuwarden.model import Event, EventKind, GpuState, Memory, Snapshot

DASHBOARD = Path(__file__).resolve().parent.parent / "config" / "grafana-dashboard.json"
HOST = "node-7"


def two_gpus(*, lost_second: bool = False, events: tuple[Event, ...] = ()) -> Snapshot:
    hot = GpuState(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-aaaa",
        pci_bus_id="00000000:3B:00.0",
        memory=Memory(total_mib=81559, used_mib=70000, free_mib=11559),
        utilization_pct=97,
        temperature_c=81,
        power_w=612.5,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        energy_mj=86_400_000_000,
    )
    if lost_second:
        second = GpuState(index=1, uuid="GPU-bbbb", lost=True, error="GPU is lost")
    else:
        # A device that cannot report its temperature: no temperature sample, never 0.
        second = GpuState(
            index=1,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-bbbb",
            pci_bus_id="00000000:5E:00.0",
            memory=Memory(total_mib=81559, used_mib=0, free_mib=81559),
            utilization_pct=0,
            temperature_c=None,
            power_w=70.0,
        )
    return Snapshot(host=HOST, time=1_700_000_000.0, gpus=(hot, second), events=events)


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    m.serve("127.0.0.1:0")
    yield m
    m.close()


def scrape(m: Metrics) -> list[Sample]:
    address = m.address
    assert address is not None
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of ``name`` by their labels, less ``Hostname`` (every gpuwarden series
    carries it: the host of the latest snapshot, or none before the first tick)."""
    found = {}
    for s in samples:
        if s.name == name:
            labels = dict(s.labels)
            assert labels.pop("Hostname") in (HOST, ""), s
            found[tuple(sorted(labels.items()))] = s.value
    return found


def by_gpu(samples: list[Sample], name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples if s.name == name}


def test_gpu_gauges_use_dcgm_names_and_labels(metrics: Metrics) -> None:
    metrics.observe_tick(two_gpus(), 0.002, {}, 0)
    samples = scrape(metrics)

    used = [s for s in samples if s.name == "DCGM_FI_DEV_FB_USED"]
    assert {s.labels["gpu"]: s.labels for s in used}["0"] == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": HOST,
        "pci_bus_id": "00000000:3B:00.0",
    }
    assert by_gpu(samples, "DCGM_FI_DEV_FB_USED") == {"0": 70000.0, "1": 0.0}
    assert by_gpu(samples, "DCGM_FI_DEV_FB_FREE") == {"0": 11559.0, "1": 81559.0}
    assert by_gpu(samples, "DCGM_FI_DEV_GPU_UTIL") == {"0": 97.0, "1": 0.0}
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE") == {"0": 612.5, "1": 70.0}
    # GPU 1 cannot tell its temperature: it has no sample at all.
    assert by_gpu(samples, "DCGM_FI_DEV_GPU_TEMP") == {"0": 81.0}
    # No XID seen yet: no sample, rather than a made-up 0.
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {}


def test_xid_gauge_keeps_the_last_xid_per_gpu(metrics: Metrics) -> None:
    xid79 = Event(EventKind.XID, 1_700_000_000.0, gpu=1, xid=79)
    metrics.observe_tick(two_gpus(events=(xid79,)), 0.002, {}, 0)
    metrics.observe_tick(two_gpus(), 0.002, {}, 0)  # the next tick has no event: still 79
    assert by_gpu(scrape(metrics), "DCGM_FI_DEV_XID_ERRORS") == {"1": 79.0}
    xid48 = Event(EventKind.XID, 1_700_000_001.0, gpu=1, xid=48)
    metrics.observe_tick(two_gpus(events=(xid48,)), 0.002, {}, 0)
    assert by_gpu(scrape(metrics), "DCGM_FI_DEV_XID_ERRORS") == {"1": 48.0}


def test_gpu_gauges_off_exports_no_dcgm_names() -> None:
    m = Metrics(gpu_gauges=False)
    m.serve("127.0.0.1:0")
    try:
        m.observe_tick(two_gpus(), 0.002, {("gpu-hot", "firing"): 1}, 1)
        samples = scrape(m)
    finally:
        m.close()
    assert not [s for s in samples if s.name.startswith("DCGM_")]
    assert values(samples, "gpuwarden_open_incidents") == {(): 1.0}
    assert by_gpu(samples, "gpuwarden_gpu_lost") == {"0": 0.0, "1": 0.0}


def test_lost_gpu_has_no_dcgm_gauges_and_is_flagged(metrics: Metrics) -> None:
    metrics.observe_tick(two_gpus(lost_second=True), 0.002, {}, 0)
    samples = scrape(metrics)
    for name, _help in DCGM_GAUGES:
        assert "1" not in by_gpu(samples, name), name
    assert by_gpu(samples, "DCGM_FI_DEV_FB_USED") == {"0": 70000.0}
    assert by_gpu(samples, "gpuwarden_gpu_lost") == {"0": 0.0, "1": 1.0}
    lost = next(s for s in samples if s.name == "gpuwarden_gpu_lost" and s.labels["gpu"] == "1")
    assert lost.labels["UUID"] == "GPU-bbbb"
    assert lost.labels["device"] == "nvidia1"


def test_own_metrics_after_observe_calls(metrics: Metrics) -> None:
    states = {("gpu-hot", "pending"): 2, ("gpu-hot", "firing"): 1, ("xid-79", "firing"): 1}
    metrics.observe_tick(two_gpus(), 0.004, states, 2)
    metrics.observe_step("kill", "ok")
    metrics.observe_step("kill", "ok")
    metrics.observe_step("kill", "refused")
    metrics.observe_step("notify", "dry_run")
    metrics.observe_outbox({"pending": 3, "sent": 10, "failed": 1}, failures_total=4)
    metrics.observe_reload(True, 1_700_000_100.0)
    metrics.observe_reload(False, 1_700_000_200.0)
    metrics.observe_breaker(True)
    samples = scrape(metrics)

    assert values(samples, "gpuwarden_rule_scopes") == {
        (("rule", "gpu-hot"), ("state", "pending")): 2.0,
        (("rule", "gpu-hot"), ("state", "firing")): 1.0,
        (("rule", "xid-79"), ("state", "firing")): 1.0,
    }
    assert values(samples, "gpuwarden_open_incidents") == {(): 2.0}
    assert values(samples, "gpuwarden_steps_total") == {
        (("kind", "kill"), ("result", "ok")): 2.0,
        (("kind", "kill"), ("result", "refused")): 1.0,
        (("kind", "notify"), ("result", "dry_run")): 1.0,
    }
    assert values(samples, "gpuwarden_outbox_messages") == {
        (("status", "failed"),): 1.0,
        (("status", "pending"),): 3.0,
        (("status", "sent"),): 10.0,
    }
    assert values(samples, "gpuwarden_notification_delivery_failures_total") == {(): 4.0}
    assert values(samples, "gpuwarden_reloads_total") == {
        (("result", "ok"),): 1.0,
        (("result", "failed"),): 1.0,
    }
    assert values(samples, "gpuwarden_last_reload_timestamp_seconds") == {(): 1_700_000_200.0}
    assert values(samples, "gpuwarden_last_reload_successful") == {(): 0.0}
    assert values(samples, "gpuwarden_circuit_breaker_tripped") == {(): 1.0}
    assert values(samples, "gpuwarden_last_tick_timestamp_seconds") == {(): 1_700_000_000.0}
    assert values(samples, "gpuwarden_cloud_instances") == {(): 0.0}
    assert values(samples, "gpuwarden_cloud_spend_dollars") == {(): 0.0}

    metrics.observe_breaker(False)
    metrics.observe_tick(two_gpus(), 0.004, {("gpu-hot", "firing"): 1}, 1)
    samples = scrape(metrics)
    assert values(samples, "gpuwarden_circuit_breaker_tripped") == {(): 0.0}
    # States are the latest tick's, not accumulated: a cleared pending scope disappears.
    assert values(samples, "gpuwarden_rule_scopes") == {
        (("rule", "gpu-hot"), ("state", "firing")): 1.0
    }


def test_step_result_outside_the_fixed_set_is_refused() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="expected one of"):
        m.observe_step("kill", "exploded")


def test_tick_duration_histogram_buckets(metrics: Metrics) -> None:
    for seconds in (0.0005, 0.003, 0.003, 0.2, 7.0):
        metrics.observe_tick(two_gpus(), seconds, {}, 0)
    samples = scrape(metrics)
    buckets = {
        s.labels["le"]: s.value
        for s in samples
        if s.name == "gpuwarden_tick_duration_seconds_bucket"
    }
    assert [float(le) for le in buckets if le != "+Inf"] == list(TICK_BUCKETS)
    assert TICK_BUCKETS[0] == 0.001
    assert TICK_BUCKETS[-1] == 5.0
    assert buckets["0.001"] == 1.0
    assert buckets["0.005"] == 3.0
    assert buckets["0.25"] == 4.0
    assert buckets["5.0"] == 4.0
    assert buckets["+Inf"] == 5.0
    assert values(samples, "gpuwarden_tick_duration_seconds_count") == {(): 5.0}
    assert values(samples, "gpuwarden_tick_duration_seconds_sum")[()] == pytest.approx(7.2065)


def test_two_instances_share_no_state() -> None:
    first, second = Metrics(), Metrics()
    first.serve("127.0.0.1:0")
    second.serve("127.0.0.1:0")
    try:
        first.observe_tick(two_gpus(), 0.002, {("gpu-hot", "firing"): 1}, 1)
        first.observe_step("kill", "ok")
        first.observe_breaker(True)
        assert first.address != second.address
        other = scrape(second)
    finally:
        first.close()
        second.close()
    assert not [s for s in other if s.name.startswith("DCGM_")]
    assert values(other, "gpuwarden_steps_total") == {}
    assert values(other, "gpuwarden_open_incidents") == {(): 0.0}
    assert values(other, "gpuwarden_circuit_breaker_tripped") == {(): 0.0}
    assert values(other, "gpuwarden_rule_scopes") == {}


def test_close_stops_serving_and_is_idempotent() -> None:
    m = Metrics()
    m.serve("127.0.0.1:0")
    address = m.address
    assert address is not None
    with pytest.raises(RuntimeError, match="already served"):
        m.serve("127.0.0.1:0")
    m.close()
    m.close()
    assert m.address is None
    with pytest.raises(OSError):  # noqa: PT011 - the refusal's errno varies
        urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=2)


def test_ipv6_loopback_is_served() -> None:
    m = Metrics()
    try:
        m.serve("[::1]:0")
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        address = m.address
        assert address is not None
        assert address[0] == "::1"
        with urllib.request.urlopen(f"http://[::1]:{address[1]}/metrics", timeout=5) as r:
            assert b"gpuwarden_open_incidents" in r.read()
    finally:
        m.close()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        (":9400", ("127.0.0.1", 9400)),
        ("9400", ("127.0.0.1", 9400)),
        ("[::1]:9400", ("::1", 9400)),
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("localhost:0", ("localhost", 0)),
        ("[::]:65535", ("::", 65535)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("127.0.0.1", "port must be"),
        ("127.0.0.1:http", "port must be"),
        (":65536", "port must be"),
        (":-1", "port must be"),
        ("::1:9400", "brackets"),
        ("[::1:9400", "IPv6"),
        ("[::1]", "IPv6"),
        ("[]:9400", "IPv6"),
        ("", "port must be"),
    ],
)
def test_parse_listen_rejects(listen: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen(listen)


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    m = Metrics()
    m.serve("127.0.0.1:0")
    try:
        xid = Event(EventKind.XID, 1_700_000_000.0, gpu=0, xid=79)
        m.observe_rules([("gpu-hot", "critical")])
        m.observe_tick(two_gpus(events=(xid,)), 0.002, {("gpu-hot", "firing"): 1}, 1)
        m.observe_step("kill", "ok")
        m.observe_outbox({"pending": 1}, 0)
        m.observe_reload(True, 1.0)
        samples = scrape(m)
        exported = {s.name for s in samples}
    finally:
        m.close()

    annotations = dashboard["annotations"]["list"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    own = [e for e in exprs + [a["expr"] for a in annotations] if "gpuwarden_" in e]
    # gpuwarden's own series are filtered by the host variable, as the GPU gauges are
    assert own
    assert all('Hostname=~"$host"' in e for e in own), [e for e in own if "$host" not in e]
    assert all(s.labels.get("Hostname") == HOST for s in samples if s.name.startswith("gpuwarden_"))
    exprs += [a["expr"] for a in annotations]
    exprs.append(variables["host"]["definition"])
    queried = {
        name for expr in exprs for name in re.findall(r"\b(?:DCGM_FI_\w+|gpuwarden_\w+)", expr)
    }
    assert queried - exported == set()
    wanted = {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "gpuwarden_open_incidents",
        "gpuwarden_steps_total",
        "gpuwarden_tick_duration_seconds_bucket",
        "gpuwarden_outbox_messages",
        "gpuwarden_circuit_breaker_tripped",
    }
    assert wanted <= queried
    assert any("histogram_quantile(0.99" in e for e in exprs)
    panels = {p["title"]: p for p in dashboard["panels"]}
    # DCGM_FI_DEV_FB_USED is MiB: Grafana's "mbytes" (MiB), not "decmbytes" (MB)
    assert panels["GPU memory used"]["fieldConfig"]["defaults"]["unit"] == "mbytes"
    assert "gpuwarden_cloud_spend_dollars" in panels["Cloud spend"]["targets"][0]["expr"]
    assert panels["Cloud spend"]["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
    (incidents,) = annotations  # incident annotations come from a metric
    assert "gpuwarden_incidents_total" in incidents["expr"]
    assert incidents["datasource"]["uid"] == "${datasource}"
    assert {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", ENERGY[0]} <= queried
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"


# -- the server: one thread, bounded connections, timeouts -------------------------------------


def raw(address: tuple[str, int], request: bytes) -> bytes:
    """One HTTP exchange over a plain socket: everything the server sends until it closes."""
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def closed_by_server(s: socket.socket) -> bool:
    """Blocks until the server closes ``s`` (the socket's own timeout bounds the wait)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_beyond_the_bound_make_room_for_a_scrape() -> None:
    registry = Metrics(host="node-1").registry
    server = MetricsServer(registry, "127.0.0.1", 0, max_connections=8, read_timeout=60)
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(40)]
    try:
        threads = threading.active_count()
        answer = raw(server.address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b'gpuwarden_open_incidents{Hostname="node-1"} 0.0' in answer
        assert server.connections <= 8
        assert server.refused >= 40 - 8 + 1  # the oldest idle ones were closed
        assert closed_by_server(idle[0])  # the oldest went first
        assert threading.active_count() == threads  # no thread per connection
    finally:
        for s in idle:
            s.close()
        server.close()
        server.close()


def test_a_client_that_never_finishes_its_request_is_closed() -> None:
    server = MetricsServer(Metrics().registry, "127.0.0.1", 0, read_timeout=0.2)
    try:
        with socket.create_connection(server.address, timeout=30) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost:")  # and never the rest
            assert closed_by_server(slow)
        with socket.create_connection(server.address, timeout=30) as big:
            big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000)
            assert closed_by_server(big)
    finally:
        server.close()


def test_methods_formats_and_compression() -> None:
    server = MetricsServer(Metrics().registry, "127.0.0.1", 0)
    try:
        head = raw(server.address, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        status, _, rest = head.partition(b"\r\n")
        assert status == b"HTTP/1.1 200 OK"
        assert rest.endswith(b"\r\n\r\n")  # headers only
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
        assert length > 0
        post = raw(server.address, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
        openmetrics = raw(
            server.address,
            b"GET / HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
        )
        assert b"Content-Type: application/openmetrics-text" in openmetrics
        assert openmetrics.endswith(b"# EOF\n")
        zipped = raw(server.address, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
        _headers, _, body = zipped.partition(b"\r\n\r\n")
        assert b"Content-Encoding: gzip" in zipped
        assert b"gpuwarden_open_incidents" in gzip.decompress(body)
    finally:
        server.close()


def test_clocks_and_energy_under_dcgm_names(metrics: Metrics) -> None:
    metrics.observe_tick(two_gpus(), 0.002, {}, 0)
    samples = scrape(metrics)
    assert by_gpu(samples, "DCGM_FI_DEV_SM_CLOCK") == {"0": 1980.0}  # GPU 1 cannot tell
    assert by_gpu(samples, "DCGM_FI_DEV_MEM_CLOCK") == {"0": 2619.0}
    assert by_gpu(samples, ENERGY[0]) == {"0": 86_400_000_000.0}  # the name, not ..._total


def test_a_lost_gpu_keeps_its_last_xid(metrics: Metrics) -> None:
    # XID 79 is the GPU falling off the bus: the one XID to keep showing once it is lost.
    xid79 = Event(EventKind.XID, 1_700_000_000.0, gpu=1, xid=79)
    metrics.observe_tick(two_gpus(events=(xid79,)), 0.002, {}, 0)
    metrics.observe_tick(two_gpus(lost_second=True), 0.002, {}, 0)
    samples = scrape(metrics)
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"1": 79.0}
    assert by_gpu(samples, "gpuwarden_gpu_lost") == {"0": 0.0, "1": 1.0}
    assert "1" not in by_gpu(samples, "DCGM_FI_DEV_FB_USED")


def test_before_any_reload_the_last_reload_is_not_a_failure(metrics: Metrics) -> None:
    samples = scrape(metrics)
    assert values(samples, "gpuwarden_last_reload_successful") == {(): 1.0}
    assert values(samples, "gpuwarden_reloads_total") == {
        (("result", "ok"),): 0.0,
        (("result", "failed"),): 0.0,
    }


def test_own_series_carry_the_host_and_incidents_count_from_zero() -> None:
    m = Metrics(host="gpu-node-07")
    m.serve("127.0.0.1:0")
    try:
        m.observe_rules([("gpu-memory-pressure", "critical"), ("idle", "info")])
        m.observe_mode(True)
        before = scrape(m)
        m.observe_incident("gpu-memory-pressure", "critical")
        after = scrape(m)
    finally:
        m.close()
    own = [s for s in before if s.name.startswith("gpuwarden_")]
    assert own
    assert {s.labels["Hostname"] for s in own} == {"gpu-node-07"}
    counts = {s.labels["rule"]: s.value for s in before if s.name == "gpuwarden_incidents_total"}
    assert counts == {"gpu-memory-pressure": 0.0, "idle": 0.0}
    assert {s.labels["rule"]: s.value for s in after if s.name == "gpuwarden_incidents_total"} == {
        "gpu-memory-pressure": 1.0,
        "idle": 0.0,
    }
    assert [s.value for s in before if s.name == "gpuwarden_shadow_mode"] == [1.0]
