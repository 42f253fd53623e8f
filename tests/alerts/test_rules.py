"""Rule loading, the shipped pack's conventions, its parameters and the template subset."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aivitals.alerts import AlertingRule, PackParams, Template, default_pack, load_rules
from aivitals.alerts._params import parse_duration
from aivitals.alerts._template import go_float
from aivitals.errors import ConfigError, RuleError

# --- loading and bad rule files ---------------------------------------------------------


def _one(rule: str) -> str:
    return "groups:\n  - name: g\n    rules:\n" + "\n".join(
        "      " + line for line in rule.strip().splitlines()
    )


@pytest.mark.parametrize(
    ("rule", "name", "problem"),
    [
        ("- alert: Bad\n  expr: sum(rate(x[5m])", "Bad", "invalid expression"),
        ("- alert: Bad\n  expr: ''", "Bad", "expr is missing"),
        ("- alert: Bad\n  expr: x[5m]", "Bad", "instant vector"),
        ("- alert: Bad\n  expr: x\n  for: 5 minutes", "Bad", "not a Prometheus duration"),
        ("- alert: Bad\n  expr: x\n  annotations: {a: '{{ if $value }}y{{ end }}'}", "Bad", "if"),
        ("- alert: Bad\n  expr: x\n  annotations: {a: '{{ query \"up\" }}'}", "Bad", "query"),
        ("- alert: Bad\n  expr: x\n  annotations: {a: '{{ $value'}", "Bad", "braces"),
        ("- alert: Bad\n  expr: x\n  labels: {sev: '{{ $foo }}'}", "Bad", "$foo"),
        ("- alert: Bad\n  expr: x\n  labels: {__x: y}", "Bad", "reserved"),
        ("- alert: Bad\n  expr: x\n  severity: P0", "Bad", "unknown field"),
        ("- record: 'bad name'\n  expr: x", "bad name", "metric name"),
        ("- record: r\n  expr: x\n  for: 1m", "r", "unknown field"),
        ("- record: r\n  alert: A\n  expr: x", "g/rule 0", "exactly one"),
    ],
)
def test_a_bad_rule_is_refused_at_load_naming_the_rule(rule: str, name: str, problem: str) -> None:
    with pytest.raises(RuleError) as err:
        load_rules(_one(rule))
    assert err.value.rule == name
    assert problem in err.value.problem


def test_bad_files_and_groups_are_refused() -> None:
    with pytest.raises(RuleError, match="not valid YAML"):
        load_rules("groups: [\n")
    with pytest.raises(RuleError, match="one key"):
        load_rules("rules: []\n")
    with pytest.raises(RuleError, match="more than once"):
        load_rules("groups:\n- name: a\n  rules: []\n- name: a\n  rules: []\n")
    with pytest.raises(RuleError, match="no name"):
        load_rules("groups:\n- rules: []\n")
    with pytest.raises(RuleError, match="cannot read"):
        load_rules(Path("/nonexistent/rules.yml"))
    assert load_rules("") == []


def test_rules_load_from_a_path(tmp_path: Path) -> None:
    path = default_pack().write(tmp_path)
    assert [g.name for g in load_rules(path)] == [g.name for g in load_rules(str(path))]


# --- the shipped pack ---------------------------------------------------------------------

DOMAIN_ALERTS = {
    "AIServiceEarlyWarning",  # the composite rule (section 4)
    "QueueBacklog",  # the six core indicators (section 5) ...
    "QueueWaitHigh",
    "GPUUtilizationHigh",
    "GPUUtilizationLow",
    "InferenceLatencyHigh",
    "HTTP504RateHigh",
    "WorkerPoolSaturated",
    "GPUMemoryHigh",  # GPU alerts
    "GPUSMStuck",
    "GPUXidError",
    "HostOOMKill",
    "KernelOOMKill",
    "DiskSaturated",
    "NetworkInterfaceErrors",
    "TCPRetransmitsHigh",
    "FdsNearLimit",
    "ProcessMemoryGrowth",
    "GPUProcessMemoryGrowth",
    "KVCacheHigh",
    "HTTP429RateHigh",
    "TargetDown",
    "CollectorDown",
    "ServiceMetricsAbsent",
    "GPUMetricsAbsent",
    "HostMetricsAbsent",
}
#: Alerts for the injectable faults that the domain's list does not name (chaos fault table).
FAULT_ALERTS = {
    "HostCPUSaturated",  # cpu_burn
    "DependencyDown",  # redis_down
    "CacheErrorsHigh",  # redis_down
    "CacheHitRatioDrop",  # cache_stampede
    "LatencyHighWorkersIdle",  # event_loop_blocked
    "InputRejectionsHigh",  # overlong_inputs, malformed_inputs
    "GPUOutOfMemoryErrors",  # gpu_oom
    "ModelReloaded",  # cold_start
    "ServiceNotReady",  # cold_start where /readyz is polled
    "TimedOutWorkNotAborted",  # timeouts_not_aborting
    "ProbeLatencyHigh",  # network_latency (the blackbox probe on the clients' path)
    "ProbeFailing",  # what the same probe sees when the path drops or the service errs
    "DiskWillFill",  # disk_fill: a log volume filling (the node_exporter mixin's rule)
    "DiskSpaceLow",  # disk_fill once it is full
}
#: Service-level alerts from the HTTP metrics alone: burn rates of the latency and error
#: budgets (services with an SLA series only) and the P99-against-baseline warning.
SLO_ALERTS = {
    "LatencySLOBurnFast",
    "LatencySLOBurnSlow",
    "LatencySLOBurnTicket",
    "ErrorSLOBurnFast",
    "ErrorSLOBurnSlow",
    "ErrorSLOBurnTicket",
    "HTTPLatencyAboveBaseline",
    "SLABucketMissing",
}


def _alerts() -> list[AlertingRule]:
    return [r for g in default_pack().groups for r in g.alerting_rules]


def test_the_pack_has_every_alert_of_the_domain() -> None:
    assert set(default_pack().alert_names) == DOMAIN_ALERTS | FAULT_ALERTS | SLO_ALERTS


def test_every_alert_has_severity_layer_summary_description_and_runbook() -> None:
    for rule in _alerts():
        labels = {k: t.source for k, t in rule.labels.items()}
        assert labels["severity"] in {"P0", "P1", "P2"}, rule.alert
        assert labels["layer"] in {"model", "service", "infrastructure", "business"}, rule.alert
        assert {"summary", "description", "runbook"} <= set(rule.annotations), rule.alert


def test_descriptions_show_live_values_where_there_is_one() -> None:
    absent = {"ServiceMetricsAbsent", "GPUMetricsAbsent", "HostMetricsAbsent", "GPUSMStuck"}
    for rule in _alerts():
        text = rule.annotations["summary"].source + rule.annotations["description"].source
        if rule.alert not in absent:
            assert "{{ $value" in text or "{{ $labels" in text, rule.alert


def test_the_core_levels_and_durations_follow_the_domain_table() -> None:
    rules = {r.alert: r for r in _alerts()}
    expected = {
        "QueueBacklog": ("P0", 60),
        "QueueWaitHigh": ("P0", 30),
        "GPUUtilizationHigh": ("P1", 300),
        "GPUUtilizationLow": ("P1", 300),
        "InferenceLatencyHigh": ("P1", 120),
        "HTTP504RateHigh": ("P0", 30),
        "WorkerPoolSaturated": ("P0", 30),
        "GPUXidError": ("P0", 0),
    }
    for name, (severity, for_) in expected.items():
        assert rules[name].labels["severity"].source == severity, name
        assert rules[name].for_ == for_, name


def test_every_range_window_spans_at_least_four_scrapes() -> None:
    params = PackParams()
    scrape = parse_duration(params.scrape_interval)
    for group in default_pack().groups:
        for rule in group.rules:
            for window in re.findall(r"\[(\d+[smhdw])\]", rule.expr):
                assert parse_duration(window) >= 4 * scrape, (rule.name, window)


def test_parameters_are_rendered_into_the_expressions() -> None:
    pack = default_pack(sla_seconds=0.5, queue_limit=64, latency_good_seconds=2.0)
    rules = {r.name: r for g in pack.groups for r in g.rules}
    assert "> 2 * 0.5" in rules["InferenceLatencyHigh"].expr
    assert rules["QueueBacklog"].expr.strip() == "queue_length > 64"
    assert 'le="2.0"' in rules["job:http_fast_share:rate3m"].expr
    assert "[[" not in pack.text


def test_slo_parameters_are_rendered_into_the_burn_rate_alerts() -> None:
    pack = default_pack(slo_error_objective=0.99, slo_fast_burn=10, slo_fast_window="2h")
    rules = {r.name: r for g in pack.groups for r in g.rules}
    fast = rules["ErrorSLOBurnFast"].expr
    # budget 1 %, burned 10x: 10 % over both windows; the recording rules follow the window
    assert "job:slo_http_5xx:ratio_rate2h > 0.1\n" in fast
    assert "job:slo_http_5xx:ratio_rate5m > 0.1" in fast
    assert "[2h]" in rules["job:slo_http_5xx:ratio_rate2h"].expr
    description = rules["ErrorSLOBurnFast"].annotations["description"].source
    # 10x over 2h spends 10 * 2h / 30d of the budget
    assert "(1% of requests) burns 10x" in description and "2.78% of a 30-day" in description
    assert "job_le:slo_http_over_sla:ratio_rate2h > 0.1\n" in rules["LatencySLOBurnFast"].expr


def test_every_slo_series_is_gated_by_an_sla_series() -> None:
    # Without aivitals_service_sla_seconds nothing of the burn-rate alerts is recorded: a
    # service (the demo among them) that configures no SLA must never page on them.
    group = next(g for g in default_pack().groups if g.name == "aivitals-slo")
    for rule in group.recording_rules:
        selects = rule.expr.count("rate(http_request_duration_seconds_")
        gated = rule.expr.count("aivitals_service_sla_seconds")
        # raw series only beside the gate; everything else reads the gated recordings
        assert selects == gated, rule.name
        if not selects:
            assert re.findall(r"\b(?:job|job_le):slo_http_\w+:\w+", rule.expr), rule.name
            assert "http_request_duration_seconds" not in rule.expr, rule.name
    paging = {r.alert for r in group.alerting_rules if r.labels["severity"].source in ("P0", "P1")}
    assert paging == {
        "LatencySLOBurnFast",
        "LatencySLOBurnSlow",
        "ErrorSLOBurnFast",
        "ErrorSLOBurnSlow",
    }
    for rule in group.alerting_rules:
        if rule.alert in paging:
            assert "slo_http_" in rule.expr and "http_request" not in rule.expr, rule.alert


def test_fault_alert_parameters_are_rendered_into_the_expressions() -> None:
    pack = default_pack(
        cpu_busy_ratio=0.8,
        cache_hit_drop=0.75,
        outside_model_seconds=0.25,
        input_rejection_ratio=0.1,
        unaborted_timeout_ratio=0.3,
        disk_fill_free_ratio=0.2,
        disk_fill_window="1h",
        disk_fill_horizon="4h",
        disk_free_ratio=0.03,
    )
    rules = {r.name: r for g in pack.groups for r in g.rules}
    fill = rules["DiskWillFill"].expr
    assert "host_filesystem_size_bytes < 0.2" in fill
    assert "predict_linear(host_filesystem_available_bytes[1h], 14400) < 0" in fill
    assert "host_filesystem_size_bytes < 0.03" in rules["DiskSpaceLow"].expr
    assert "within 4h" in rules["DiskWillFill"].annotations["summary"].source
    assert rules["HostCPUSaturated"].expr.rstrip().endswith("> 0.8")
    assert "< 0.25 * job_cache:cache_hit_ratio:baseline" in rules["CacheHitRatioDrop"].expr
    assert ") > 0.25\n" in rules["LatencyHighWorkersIdle"].expr
    assert rules["InputRejectionsHigh"].expr.rstrip().endswith("> 0.1")
    assert rules["TimedOutWorkNotAborted"].expr.rstrip().endswith("> 0.3")
    assert (
        "less than 0.25x its usual (median) level"
        in rules["CacheHitRatioDrop"].annotations["description"].source
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"bogus": 1}, "unknown rule pack parameter 'bogus'"),
        ({"gpu_memory_ratio": 1.5}, "gpu_memory_ratio=1.5 is a ratio"),
        ({"queue_limit": -1}, "queue_limit=-1"),
        ({"sla_seconds": "fast"}, "sla_seconds='fast' must be a number"),
        ({"sla_seconds": float("nan")}, "finite"),
        ({"rate_window": "5 min"}, "rate_window='5 min' is not a Prometheus duration"),
        ({"scrape_interval": "30s", "short_window": "1m"}, "fewer than 4 scrapes"),
        ({"latency_good_seconds": 1.2}, "latency_good_seconds=1.2 must be a bucket bound"),
        ({"cache_hit_drop": 1.5}, "cache_hit_drop=1.5 is a ratio"),
        ({"cpu_busy_ratio": 2}, "cpu_busy_ratio=2 is a ratio"),
        ({"outside_model_seconds": -0.5}, "outside_model_seconds=-0.5"),
        ({"worker_idle_ratio": "half"}, "worker_idle_ratio='half' must be a number"),
        ({"disk_fill_free_ratio": 40}, "disk_fill_free_ratio=40 is a ratio"),
        ({"disk_fill_horizon": "1 day"}, "disk_fill_horizon='1 day' is not a Prometheus"),
        ({"disk_fill_window": "30s"}, "disk_fill_window='30s' spans fewer than 4 scrapes"),
        ({"slo_latency_objective": 1.0}, "leaves no error budget to burn"),
        ({"slo_error_objective": 0}, "slo_error_objective=0 must be within 0..1"),
        ({"slo_fast_burn": 0}, "slo_fast_burn=0 must be > 0"),
        ({"slo_slow_short_window": "7h"}, "slo_slow_short_window=7h must be shorter than"),
        ({"slo_slow_window": "1h"}, "the SLO windows must all differ"),
        ({"slo_ticket_window": "3h"}, "slo_slow_window=6h must be shorter than"),
        ({"slo_slow_short_window": "1m"}, "slo_fast_short_window=5m must be the shortest"),
        # a hold no longer than the short window ends before the gap it should bridge
        ({"unseen_hold_window": "1m"}, "unseen_hold_window='1m' must be longer than short_window"),
    ],
)
def test_bad_parameters_are_refused_naming_key_and_value(params: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as err:
        default_pack(**params)
    assert message in str(err.value)


# --- the template subset, checked against what Prometheus 2.42 rendered -----------------

# (value, $value, humanize, humanize1024, humanizeDuration, humanizePercentage, printf %.2f)
# as promtool rendered them for the same values.
PROMETHEUS_RENDERED = [
    (1e6, "1e+06", "1M", "976.6ki", "11d 13h 46m 40s", "1e+08%", "1000000.00"),
    (100000.0, "100000", "100k", "97.66ki", "1d 3h 46m 40s", "1e+07%", "100000.00"),
    (90061.0, "90061", "90.06k", "87.95ki", "1d 1h 1m 1s", "9.006e+06%", "90061.00"),
    (1234567.0, "1.234567e+06", "1.235M", "1.177Mi", "14d 6h 56m 7s", "1.235e+08%", "1234567.00"),
    (1.234e-05, "1.234e-05", "12.34u", "1.234e-05", "12.34us", "0.001234%", "0.00"),
    (123456.7, "123456.7", "123.5k", "120.6ki", "1d 10h 17m 36s", "1.235e+07%", "123456.70"),
    (0.0, "0", "0", "0", "0s", "0%", "0.00"),
    (-3.5, "-3.5", "-3.5", "-3.5", "-3.5s", "-350%", "-3.50"),
    (0.5, "0.5", "500m", "0.5", "500ms", "50%", "0.50"),
    (1e21, "1e+21", "1Z", "867.4Ei", "-106751991167300d -15h -30m -8s", "1e+23%", None),
]


@pytest.mark.parametrize("row", PROMETHEUS_RENDERED)
def test_templates_render_numbers_exactly_as_prometheus(row: tuple) -> None:  # type: ignore[type-arg]
    value, plain, h, h1024, hdur, hpct, pf = row
    render = Template.parse(
        "{{ $value }}|{{ $value | humanize }}|{{ humanize1024 $value }}|"
        "{{ $value | humanizeDuration }}|{{ .Value | humanizePercentage }}"
    ).render(value=value, labels={})
    assert render == f"{plain}|{h}|{h1024}|{hdur}|{hpct}"
    if pf is not None:
        assert Template.parse('{{ printf "%.2f" $value }}').render(value=value, labels={}) == pf


def test_templates_labels_pipes_trim_and_errors() -> None:
    t = Template.parse('{{- $labels.gpu -}} : {{ $labels.missing }}|{{ "a\\"b" }}|{{/* c */}}x')
    assert t.render(value=1, labels={"gpu": "0"}) == '0: |a"b|x'
    assert Template.parse("{{ $labels.job | toUpper }}").render(value=1, labels={"job": "a"}) == "A"
    bad = Template.parse("{{ $labels.job | humanize }}")
    assert bad.render(value=1, labels={"job": "svc"}).startswith("<error expanding template")
    assert Template.parse("{{ $externalURL }}").render(value=1, labels={}, external_url="u") == "u"
    assert go_float(float("nan")) == "NaN" and go_float(float("-inf")) == "-Inf"
    assert Template.parse("plain").is_static


def test_the_public_surface_is_deliberate() -> None:
    import aivitals.alerts as alerts

    names = list(alerts.__all__)
    assert names == sorted(names, key=lambda n: (not n[0].isupper(), n))
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(alerts, name), name
