"""The emulation of the ClickHouse plugin's query expansion (conditional All, template
variables, server macros) against what the plugin produces."""

from __future__ import annotations

import pytest

from failslow.dashboards import macros as m
from failslow.dashboards.macros import ALL, MacroError, QueryContext, Variable

# 2023-11-14 22:13:20.123 UTC .. 22:23:20.987 UTC
CTX = QueryContext(1_700_000_000_123, 1_700_000_600_987, interval_ms=20_000, variables={
    "job": Variable("job-1"),
    "rank": Variable(("3", "17"), ("0", "3", "17"), multi=True),
    "ranks_all": Variable(ALL, ("0", "1"), multi=True),
    "name": Variable(("o'brien",), multi=True),
})


def test_time_macros_as_the_plugin_writes_them() -> None:
    assert m.expand("WHERE $__timeFilter(time)", CTX) == (
        "WHERE time >= toDateTime(1700000000) AND time <= toDateTime(1700000600)")
    assert m.expand("$__timeFilter_ms(t)", CTX) == (
        "t >= fromUnixTimestamp64Milli(1700000000123) AND "
        "t <= fromUnixTimestamp64Milli(1700000600987)")
    assert m.expand("SELECT $__fromTime, $__toTime", CTX) == (
        "SELECT toDateTime(1700000000), toDateTime(1700000600)")
    assert m.expand("SELECT ($__fromTime_ms)", CTX) == (
        "SELECT (fromUnixTimestamp64Milli(1700000000123))")
    assert m.expand("$__dateFilter(d)", CTX) == (
        "d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')")
    assert m.expand("$__timeInterval(time)", CTX) == (
        "toStartOfInterval(toDateTime(time), INTERVAL 20 second)")
    assert m.expand("$__timeInterval_ms(time)", CTX) == (
        "toStartOfInterval(toDateTime64(time, 3), INTERVAL 20000 millisecond)")
    assert m.expand("count() / ($__interval_s)", CTX) == "count() / (20)"


def test_interval_is_at_least_one_second() -> None:
    fast = QueryContext(0, 1000, interval_ms=50)
    assert m.expand("($__interval_s)", fast) == "(1)"
    assert m.expand("$__timeInterval(t)", fast).endswith("INTERVAL 1 second)")


def test_macro_arguments_may_contain_brackets() -> None:
    assert m.expand("$__timeFilter(fromUnixTimestamp64Nano(t_end)) AND x", CTX) == (
        "fromUnixTimestamp64Nano(t_end) >= toDateTime(1700000000) AND "
        "fromUnixTimestamp64Nano(t_end) <= toDateTime(1700000600) AND x")


def test_a_macro_without_arguments_before_a_bracket_swallows_it() -> None:
    sql = "WHERE t <= $__toTime AND (a = 1 OR b = 2)"
    with pytest.raises(MacroError, match="toTime"):
        m.expand(sql, CTX)
    # what the plugin actually sends: the condition in brackets is gone
    assert m.expand(sql, CTX, strict=False) == "WHERE t <= toDateTime(1700000600)"
    # a closing bracket first is safe
    assert m.expand("(t <= $__toTime) AND (a = 1)", CTX) == (
        "(t <= toDateTime(1700000600)) AND (a = 1)")


def test_wrong_argument_counts_are_errors() -> None:
    with pytest.raises(MacroError, match="timeFilter"):
        m.expand("$__timeFilter(a, b)", CTX)
    with pytest.raises(MacroError, match="dateTimeFilter"):
        m.expand("$__dateTimeFilter(a)", CTX)


def test_conditional_all() -> None:
    sql = "WHERE $__conditionalAll(rank IN (${rank:csv}), $rank) AND " \
          "$__conditionalAll(rank IN (${ranks_all:csv}), $ranks_all)"
    assert m.expand(sql, CTX) == "WHERE rank IN (3,17) AND 1=1"
    empty = QueryContext(0, 1, variables={"v": Variable("")})
    assert m.expand("$__conditionalAll(x = '$v', ${v})", empty) == "1=1"


def test_template_variables_and_formats() -> None:
    assert m.expand("job = '$job' AND j = '${job}' AND k = '[[job]]'", CTX) == (
        "job = 'job-1' AND j = 'job-1' AND k = 'job-1'")
    # the plugin's own formatter: multi-values quoted and comma-joined, no escaping
    assert m.expand("IN ($rank)", CTX) == "IN ('3','17')"
    assert m.expand("IN (${ranks_all})", CTX) == "IN ('0','1')"
    assert m.expand("IN (${rank:csv})", CTX) == "IN (3,17)"
    assert m.expand("IN (${name:sqlstring})", CTX) == "IN ('o''brien')"
    assert m.expand("IN (${name:singlequote})", CTX) == "IN ('o\\'brien')"
    with pytest.raises(MacroError, match="format"):
        m.expand("${job:percentencode}", CTX)


def test_builtins_and_unknown_names() -> None:
    assert m.expand("$__from $__to ${__interval} $__interval_ms $__range_s", CTX) == (
        "1700000000123 1700000600987 20s 20000 601")
    with pytest.raises(MacroError, match="nosuch"):
        m.expand("x = '$nosuch'", CTX)
    assert m.expand("x = '$nosuch'", CTX, strict=False) == "x = '$nosuch'"


def test_expansion_does_not_depend_on_the_macro_order() -> None:
    sql = ("SELECT $__timeInterval(fromUnixTimestamp64Nano(t)) AS time, count() / "
           "($__interval_s) FROM x WHERE $__timeFilter(fromUnixTimestamp64Nano(t)) AND "
           "t < toInt64(toUnixTimestamp($__toTime)) GROUP BY time")
    results = {m.expand(sql, CTX, order=o) for o in m.macro_orders(4)}
    assert len(results) == 1


def test_around_ns_pads_the_range() -> None:
    ctx = QueryContext.around_ns(1_750_000_000_500_000_000, 1_750_000_010_000_000_000)
    assert (ctx.from_ms, ctx.to_ms) == (1_749_999_999_500, 1_750_000_011_000)
