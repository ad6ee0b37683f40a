"""The notifier's config (:mod:`failslow.dashboards.notify`): receivers, routes, severity
thresholds and the retry policy, parsed from YAML or TOML. Secrets are never in the config:
it names environment variables (``url_env``, ``secret_env``, ``routing_key_env``), resolved
against a mapping that defaults to :func:`failslow.settings.environment`."""

from __future__ import annotations

import fnmatch
import random
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from failslow.dashboards.severity import SEVERITIES, Thresholds, rank_of, severity
from failslow.diagnosis import Anomaly
from failslow.settings import environment

TYPES = ("generic", "slack", "pagerduty", "alertmanager")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
_SECRET_WORDS = ("secret", "token", "password", "routing_key", "api_key")


class ConfigError(ValueError):
    """A notifier config that cannot be used (the message names the field)."""



@dataclass(frozen=True)
class Receiver:
    name: str
    type: str
    url_env: str | None = None
    url: str | None = None
    secret_env: str | None = None
    routing_key_env: str | None = None
    rate_per_minute: float = 60.0
    burst: int = 10
    timeout_s: float | None = None

    def resolve_url(self, env: Mapping[str, str]) -> str:
        if self.url_env:
            value = env.get(self.url_env, "")
            if not value:
                raise ConfigError(f"receiver {self.name}: ${self.url_env} is not set")
            return value
        if self.url:
            return self.url
        if self.type == "pagerduty":
            return PAGERDUTY_URL
        raise ConfigError(f"receiver {self.name}: no url or url_env")

    def secret(self, env: Mapping[str, str]) -> bytes | None:
        if not self.secret_env:
            return None
        value = env.get(self.secret_env, "")
        if not value:
            raise ConfigError(f"receiver {self.name}: ${self.secret_env} is not set")
        return value.encode()

    def routing_key(self, env: Mapping[str, str]) -> str:
        value = env.get(self.routing_key_env or "", "")
        if not value:
            raise ConfigError(f"receiver {self.name}: pagerduty needs routing_key_env naming "
                              "a set environment variable")
        return value


@dataclass(frozen=True)
class Match:
    job: str = "*"
    kind: str | None = None
    cause: str | None = None
    min_severity: str = "info"
    max_severity: str = "critical"  # e.g. ``info``: a digest or low-urgency channel
    stage: str | None = None

    def matches(self, job: str, a: Anomaly, sev: str) -> bool:
        return (fnmatch.fnmatchcase(job, self.job)
                and (self.kind is None or a.kind == self.kind)
                and (self.cause is None or a.cause == self.cause)
                and (self.stage is None or a.stage == self.stage)
                and rank_of(self.min_severity) <= rank_of(sev) <= rank_of(self.max_severity))


@dataclass(frozen=True)
class SeverityRule:
    """One ``severity_rules`` entry: anomalies that match get ``severity``, or at least
    ``at_least`` / at most ``at_most`` of what their cost says."""

    match: Match
    severity: str | None = None
    at_least: str | None = None
    at_most: str | None = None

    def apply(self, sev: str) -> str:
        if self.severity is not None:
            return self.severity
        if self.at_least is not None and rank_of(sev) < rank_of(self.at_least):
            sev = self.at_least
        if self.at_most is not None and rank_of(sev) > rank_of(self.at_most):
            sev = self.at_most
        return sev


#: Without ``severity_rules`` in the config: a hang is critical whatever it cost so far.
DEFAULT_SEVERITY_RULES = (SeverityRule(Match(kind="hang"), severity="critical"),)


@dataclass(frozen=True)
class Route:
    match: Match
    receivers: tuple[str, ...]
    continue_: bool = False


@dataclass(frozen=True)
class Retry:
    max_attempts: int = 10
    base_s: float = 1.0
    max_s: float = 300.0
    timeout_s: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base x 2^attempt)] (AWS architecture blog's
        "exponential backoff and jitter"), at least a tenth of the cap."""
        cap = min(self.max_s, self.base_s * (2.0 ** max(attempt - 1, 0)))
        return max(cap * 0.1, rng.uniform(0.0, cap))


@dataclass(frozen=True)
class Config:
    receivers: dict[str, Receiver]
    routes: tuple[Route, ...]
    thresholds: Thresholds = Thresholds()
    retry: Retry = Retry()
    state_file: Path = Path("notify-state.json")
    keep_resolved_s: float = 7 * 86400.0
    severity_rules: tuple[SeverityRule, ...] = DEFAULT_SEVERITY_RULES
    #: IANA zone of the local times in pages (None: the notifier machine's zone)
    timezone: str | None = None
    #: Grafana base URL for links (None: the ``grafana.url`` setting, $FAILSLOW_GRAFANA_URL)
    grafana_url: str | None = None

    def severity(self, job: str, a: Anomaly, cost_gpu_h: float) -> str:
        """The GPU-hour thresholds, then the first matching severity rule."""
        sev = severity(a.kind if a.kind != "hang" else "slow", cost_gpu_h, self.thresholds)
        for rule in self.severity_rules:
            if rule.match.matches(job, a, sev):
                return rule.apply(sev)
        return sev

    def route(self, job: str, a: Anomaly, sev: str) -> list[str]:
        out: list[str] = []
        for r in self.routes:
            if r.match.matches(job, a, sev):
                out.extend(x for x in r.receivers if x not in out)
                if not r.continue_:
                    break
        return out


def _check_no_literal_secrets(obj: Any, where: str) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = str(k).lower()
            if (any(w in key for w in _SECRET_WORDS) and not key.endswith("_env")
                    and v not in (None, "")):
                raise ConfigError(f"{where}.{k}: secrets come only from the environment; "
                                  f"name the variable with {k}_env")
            _check_no_literal_secrets(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_no_literal_secrets(v, f"{where}[{i}]")


def _get(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str,
         default: Any = None) -> Any:
    value = d.get(key, default)
    if value is not None and not isinstance(value, typ):
        raise ConfigError(f"{where}.{key}: expected {typ}, got {type(value).__name__}")
    return value


def config_from_dict(d: Mapping[str, Any], base_dir: Path | None = None,
                     env: Mapping[str, str] | None = None) -> Config:
    """Parse a config (see the module docstring)."""
    if not isinstance(d, Mapping):
        raise ConfigError("config: expected a mapping")
    _check_no_literal_secrets(dict(d), "config")
    env = environment() if env is None else env
    unknown = set(d) - {"receivers", "routes", "severity", "retry", "state_file",
                        "keep_resolved_s", "severity_rules", "timezone", "grafana_url"}
    if unknown:
        raise ConfigError(f"config: unknown key(s) {sorted(unknown)}")
    receivers: dict[str, Receiver] = {}
    for i, r in enumerate(_get(d, "receivers", list, "config", [])):
        where = f"receivers[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        extra = set(r) - set(Receiver.__dataclass_fields__)
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {sorted(extra)}")
        name = _get(r, "name", str, where)
        typ = _get(r, "type", str, where, "generic")
        if not name or typ not in TYPES:
            raise ConfigError(f"{where}: needs a name and a type in {TYPES}")
        if name in receivers:
            raise ConfigError(f"{where}: duplicate receiver name {name!r}")
        rec = Receiver(**{k: v for k, v in r.items()})
        if rec.rate_per_minute <= 0 or rec.burst < 1:
            raise ConfigError(f"{where}: rate_per_minute > 0 and burst >= 1")
        if typ == "slack" and rec.url:
            raise ConfigError(f"{where}: a Slack webhook URL is a secret: use url_env")
        if typ == "pagerduty" and not rec.routing_key_env:
            raise ConfigError(f"{where}: pagerduty needs routing_key_env")
        receivers[name] = rec
    routes = []
    for i, r in enumerate(_get(d, "routes", list, "config", [])):
        where = f"routes[{i}]"
        match = _match(r, where)
        names = tuple(_get(r, "receivers", list, where, []))
        for n in names:
            if n not in receivers:
                raise ConfigError(f"{where}: unknown receiver {n!r}")
        routes.append(Route(match, names, bool(r.get("continue", False))))
    retry = Retry(**(_get(d, "retry", dict, "config", {}) or {}))
    if retry.max_attempts < 1 or retry.base_s <= 0 or retry.timeout_s <= 0:
        raise ConfigError("config.retry: max_attempts >= 1, base_s > 0, timeout_s > 0")
    thresholds = Thresholds.from_dict(_get(d, "severity", dict, "config", {}) or {})
    rules: tuple[SeverityRule, ...] = DEFAULT_SEVERITY_RULES
    if d.get("severity_rules") is not None:
        rules = tuple(_severity_rule(r, f"severity_rules[{i}]") for i, r in
                      enumerate(_get(d, "severity_rules", list, "config", [])))
    tz = _get(d, "timezone", str, "config")
    if tz:
        from failslow.dashboards.notify_page import zone

        try:
            zone(tz)
        except ValueError as e:
            raise ConfigError(f"config.timezone: {e}") from None
    data_dir = Path(env.get("FAILSLOW_DATA_DIR", "") or (base_dir or Path.cwd()))
    state = Path(_get(d, "state_file", str, "config", "notify-state.json"))
    if not state.is_absolute():
        state = data_dir / state
    return Config(receivers, tuple(routes), thresholds, retry, state,
                  float(d.get("keep_resolved_s", 7 * 86400.0)), rules, tz or None,
                  _get(d, "grafana_url", str, "config"))


def _match(r: Any, where: str) -> Match:
    if not isinstance(r, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    m = _get(r, "match", dict, where, {}) or {}
    extra = set(m) - set(Match.__dataclass_fields__)
    if extra:
        raise ConfigError(f"{where}.match: unknown key(s) {sorted(extra)}")
    match = Match(**m)
    for key in ("min_severity", "max_severity"):
        if getattr(match, key) not in SEVERITIES:
            raise ConfigError(f"{where}.match.{key}: one of {SEVERITIES}")
    return match


def _severity_rule(r: Any, where: str) -> SeverityRule:
    match = _match(r, where)
    extra = set(r) - {"match", "severity", "at_least", "at_most"}
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {sorted(extra)}")
    rule = SeverityRule(match, r.get("severity"), r.get("at_least"), r.get("at_most"))
    given = [v for v in (rule.severity, rule.at_least, rule.at_most) if v is not None]
    if not given or any(v not in SEVERITIES for v in given):
        raise ConfigError(f"{where}: needs severity, at_least or at_most, each one of "
                          f"{SEVERITIES}")
    return rule


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    p = Path(path)
    text = p.read_text()
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: cannot parse: {e}") from None
    return config_from_dict(data or {}, None, env)
