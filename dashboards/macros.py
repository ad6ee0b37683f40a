"""How Grafana turns a panel's SQL into what ClickHouse runs, so that every dashboard query
can be executed and checked outside Grafana (tests, ``failslow dashboards check``).

A query of the ``grafana-clickhouse-datasource`` plugin goes through three steps, reproduced
here in the same order and with the same quirks:

1. in the browser, the plugin's ``applyConditionalAll``: ``$__conditionalAll(cond, $var)``
   becomes ``1=1`` when ``$var`` is *All* (or empty), else ``cond``; the arguments are found
   by bracket counting from the last occurrence backwards;
2. in the browser, Grafana's template service replaces ``$var``, ``${var}``,
   ``${var:format}`` and ``[[var]]`` (plus the built-ins ``$__from``, ``$__to``,
   ``$__interval``, ``$__interval_ms``, ``$__range_s``, ``$__range_ms``); without an explicit
   format the plugin formats a multi-value as ``'a','b'`` and a single value as is (no
   quotes, no escaping);
3. on the server, the plugin's macros (``$__timeFilter(col)``, ``$__timeFilter_ms``,
   ``$__fromTime``, ``$__toTime``, ``$__fromTime_ms``, ``$__toTime_ms``,
   ``$__dateFilter``, ``$__dateTimeFilter``/``$__dt``, ``$__timeInterval(col)``,
   ``$__timeInterval_ms``, ``$__interval_s``) and the SQL plugin SDK's defaults
   (``$__timeFrom(col)``, ``$__timeTo(col)``, ``$__timeGroup``, ``$__table``,
   ``$__column``). The SDK finds a macro's argument list by scanning forward from the macro
   name to the first bracket: a macro written without arguments and followed by ``(``
   further on (``$__toTime AND (a OR b)``) swallows that bracketed text and the condition is
   silently lost. :func:`expand` raises :class:`MacroError` on that (``strict=True``), which
   is why the dashboards never write an argument-less macro before an opening bracket.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

ALL = "$__all"


class MacroError(ValueError):
    """A macro that the plugin would expand wrongly or reject."""


@dataclass(frozen=True)
class Variable:
    """The current state of one dashboard template variable.

    ``current`` is the selected value (a tuple for several values, :data:`ALL` for *All*);
    ``options`` the values the variable offers (what *All* expands to)."""

    current: str | tuple[str, ...]
    options: tuple[str, ...] = ()
    multi: bool = False

    def value(self) -> str | list[str]:
        """The value Grafana interpolates: a list for multi-value variables and *All*."""
        if self.current == ALL:
            return list(self.options)
        if isinstance(self.current, tuple):
            return list(self.current)
        return [self.current] if self.multi else self.current

    @property
    def is_all(self) -> bool:
        return self.current == ALL or self.current == "" or self.current == ()


@dataclass(frozen=True)
class QueryContext:
    """The time range (epoch milliseconds, as Grafana sends it) and interval of one query."""

    from_ms: int
    to_ms: int
    interval_ms: int = 1000
    variables: Mapping[str, Variable] = field(default_factory=dict)

    @classmethod
    def around_ns(cls, t0_ns: int, t1_ns: int, interval_ms: int = 1000,
                  variables: Mapping[str, Variable] | None = None,
                  pad_s: float = 1.0) -> QueryContext:
        """A range that covers ``[t0_ns, t1_ns]`` with ``pad_s`` either side."""
        return cls(int(t0_ns // 1_000_000 - pad_s * 1000), int(t1_ns // 1_000_000 + pad_s * 1000),
                   interval_ms, dict(variables or {}))


# ---------------------------------------------------------------------------------------------
# step 1: $__conditionalAll (the plugin's frontend)


def _macro_args(query: str, open_index: int) -> list[str]:
    """The plugin's ``getMacroArgs``: arguments of the bracket opening at ``open_index``,
    split at top-level commas; ``[]`` when the bracket never closes."""
    args: list[str] = []
    depth = 0
    last = 1
    sub = query[open_index:]
    for m in re.finditer(r"[(),]", sub):
        tok = m.group(0)
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        if tok == "," and depth == 1:
            args.append(sub[last:m.end() - 1])
            last = m.end()
        if depth == 0:
            args.append(sub[last:m.end() - 1])
            return args
    return []


_VAR_IN_ARG = re.compile(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+")


def apply_conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    """``$__conditionalAll(condition, $var)`` -> ``1=1`` when ``$var`` is All or empty."""
    macro = "$__conditionalAll("
    index = sql.rfind(macro)
    while index != -1:
        params = _macro_args(sql, index + len(macro) - 1)
        if len(params) != 2:
            return sql
        phrase = params[0]
        m = _VAR_IN_ARG.search(params[1].strip())
        if m:
            var = variables.get(m.group(0))
            if var is not None and var.is_all:
                phrase = "1=1"
        sql = sql.replace(f"{macro}{params[0]},{params[1]})", phrase, 1)
        index = sql.rfind(macro)
    return sql


# ---------------------------------------------------------------------------------------------
# step 2: Grafana's template service

_TEMPLATE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def _plugin_format(value: str | list[str]) -> str:
    """The ClickHouse plugin's default formatter."""
    if isinstance(value, list):
        return "'" + "','".join(value) + "'"
    return value


def _as_list(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


_FORMATS: dict[str, Callable[[str | list[str]], str]] = {
    "csv": lambda v: ",".join(_as_list(v)),
    "raw": lambda v: ",".join(_as_list(v)),
    "text": lambda v: " + ".join(_as_list(v)),
    "pipe": lambda v: "|".join(_as_list(v)),
    "singlequote": lambda v: ",".join("'" + x.replace("'", "\\'") + "'" for x in _as_list(v)),
    "doublequote": lambda v: ",".join('"' + x.replace('"', '\\"') + '"' for x in _as_list(v)),
    "sqlstring": lambda v: ",".join("'" + x.replace("'", "''") + "'" for x in _as_list(v)),
}


def _builtins(ctx: QueryContext) -> dict[str, str]:
    if ctx.interval_ms % 1000 == 0:
        interval = f"{ctx.interval_ms // 1000}s"
    else:
        interval = f"{ctx.interval_ms}ms"
    return {
        "__from": str(ctx.from_ms), "__to": str(ctx.to_ms),
        "__interval": interval, "__interval_ms": str(ctx.interval_ms),
        "__range_ms": str(ctx.to_ms - ctx.from_ms),
        "__range_s": str(round((ctx.to_ms - ctx.from_ms) / 1000)),
    }


def replace_variables(sql: str, ctx: QueryContext) -> str:
    """Grafana's ``templateSrv.replace`` with the plugin's formatter; unknown names (the
    server-side macros) are left alone."""
    builtins = _builtins(ctx)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in builtins:
            return builtins[name]
        var = ctx.variables.get(name)
        if var is None:
            return m.group(0)
        value = var.value()
        if fmt is None:
            return _plugin_format(value)
        if fmt not in _FORMATS:
            raise MacroError(f"template format {fmt!r} of ${{{name}}} is not emulated")
        return _FORMATS[fmt](value)

    return _TEMPLATE.sub(sub, sql)


# ---------------------------------------------------------------------------------------------
# step 3: the plugin's server-side macros


def _unix_s(ms: int) -> int:
    return math.floor(ms / 1000)


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(_unix_s(ms), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _need(args: Sequence[str], n: int, name: str) -> None:
    if len(args) != n:
        raise MacroError(f"$__{name}: expected {n} argument(s), received {len(args)}")


MacroFn = Callable[[QueryContext, list[str]], str]


def _time_filter(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeFilter")
    return (f"{a[0]} >= toDateTime({_unix_s(ctx.from_ms)}) AND "
            f"{a[0]} <= toDateTime({_unix_s(ctx.to_ms)})")


def _time_filter_ms(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeFilter_ms")
    return (f"{a[0]} >= fromUnixTimestamp64Milli({ctx.from_ms}) AND "
            f"{a[0]} <= fromUnixTimestamp64Milli({ctx.to_ms})")


def _date_filter(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "dateFilter")
    return f"{a[0]} >= toDate('{_date(ctx.from_ms)}') AND {a[0]} <= toDate('{_date(ctx.to_ms)}')"


def _date_time_filter(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 2, "dateTimeFilter")
    return (f"({a[0]} >= toDate('{_date(ctx.from_ms)}') AND {a[0]} <= "
            f"toDate('{_date(ctx.to_ms)}')) AND ({a[1]} >= toDateTime({_unix_s(ctx.from_ms)}) "
            f"AND {a[1]} <= toDateTime({_unix_s(ctx.to_ms)}))")


def _interval_s(ctx: QueryContext) -> int:
    return int(max(ctx.interval_ms / 1000, 1))


def _time_interval(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeInterval")
    return f"toStartOfInterval(toDateTime({a[0]}), INTERVAL {_interval_s(ctx)} second)"


def _time_interval_ms(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeInterval_ms")
    return (f"toStartOfInterval(toDateTime64({a[0]}, 3), INTERVAL "
            f"{int(max(ctx.interval_ms, 1))} millisecond)")


def _time_from(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeFrom")
    return f"{a[0]} >= '{_rfc3339(ctx.from_ms)}'"


def _time_to(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 1, "timeTo")
    return f"{a[0]} <= '{_rfc3339(ctx.to_ms)}'"


def _time_group(ctx: QueryContext, a: list[str]) -> str:
    _need(a, 2, "timeGroup")
    parts = ["minute", "hour", "day", "month", "year"]
    if a[1] not in parts:
        return ""
    return ",".join(f"datepart({p}, {a[0]})" for p in parts[parts.index(a[1]):])


#: name -> (function, takes arguments)
MACROS: dict[str, tuple[MacroFn, bool]] = {
    "fromTime": (lambda c, a: f"toDateTime({_unix_s(c.from_ms)})", False),
    "toTime": (lambda c, a: f"toDateTime({_unix_s(c.to_ms)})", False),
    "fromTime_ms": (lambda c, a: f"fromUnixTimestamp64Milli({c.from_ms})", False),
    "toTime_ms": (lambda c, a: f"fromUnixTimestamp64Milli({c.to_ms})", False),
    "timeFilter": (_time_filter, True),
    "timeFilter_ms": (_time_filter_ms, True),
    "dateFilter": (_date_filter, True),
    "dateTimeFilter": (_date_time_filter, True),
    "dt": (_date_time_filter, True),
    "timeInterval": (_time_interval, True),
    "timeInterval_ms": (_time_interval_ms, True),
    "interval_s": (lambda c, a: str(_interval_s(c)), False),
    # the SQL plugin SDK's defaults, for names the plugin does not define
    "timeFrom": (_time_from, True),
    "timeTo": (_time_to, True),
    "timeGroup": (_time_group, True),
    "table": (lambda c, a: "", False),
    "column": (lambda c, a: "", False),
}


def _matches(sql: str, name: str) -> list[tuple[str, str | None]]:
    """The SDK's ``getMacroMatches``: every ``$__name`` with the text up to the bracket that
    closes the first bracket after it (or just the name when a ``)`` comes first)."""
    out: list[tuple[str, str | None]] = []
    for m in re.finditer(r"\$__" + re.escape(name) + r"\b", sql):
        rest = sql[m.start():]
        depth = 0
        arg_start = 0
        end = 0
        for i, ch in enumerate(rest):
            if depth == 0 and end > 0:
                break
            if ch == "(":
                depth += 1
                if arg_start == 0:
                    arg_start = i + 1
            elif ch == ")":
                if depth == 0:
                    end = 0
                    break
                depth -= 1
                end = i + 1
        if end == 0:
            end = m.end() - m.start()
        text = rest[:end]
        out.append((text, rest[arg_start:end - 1] if arg_start > 0 else None))
    return out


def expand_macros(sql: str, ctx: QueryContext, order: Iterable[str] | None = None,
                  strict: bool = True) -> str:
    """The server-side macro expansion (``sqlutil.Interpolate``). The plugin walks a Go map,
    so the order of the macros is random; ``order`` fixes one (tests try several).
    ``strict`` raises :class:`MacroError` where the plugin would swallow text."""
    for name in (order if order is not None else MACROS):
        fn, takes_args = MACROS[name]
        for text, args in _matches(sql, name):
            if strict and not takes_args and args is not None:
                raise MacroError(f"$__{name} takes no arguments but the plugin would read "
                                 f"{text!r} as one macro call: the text after it would be lost")
            arg_list = [a.strip() for a in args.split(",")] if args is not None else []
            sql = sql.replace(text, fn(ctx, arg_list))
    return sql


def expand(sql: str, ctx: QueryContext, order: Iterable[str] | None = None,
           strict: bool = True) -> str:
    """What ClickHouse receives for the panel SQL ``sql`` (all three steps)."""
    sql = apply_conditional_all(sql, ctx.variables)
    sql = replace_variables(sql, ctx)
    out = expand_macros(sql, ctx, order, strict)
    if strict:
        left = re.findall(r"\$__\w+|\$\{?\w+", out)
        if left:
            raise MacroError(f"not expanded: {sorted(set(left))}")
    return out


def macro_orders(n: int = 3) -> list[list[str]]:
    """A few distinct macro orders (the plugin's is random): as listed, reversed, and
    rotations of the list."""
    names = list(MACROS)
    orders = [names, names[::-1]]
    for k in itertools.islice(itertools.count(1), max(0, n - 2)):
        orders.append(names[k:] + names[:k])
    return orders[:max(n, 1)]
