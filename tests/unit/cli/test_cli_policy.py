"""The command line's one error policy, settings and logging options (failslow.cli.app)."""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from failslow import cli, events
from failslow.cli.app import BENCHMARK_MODULES, build_parser


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, needle", [
    (["analyze", "{tmp}/nowhere"], "nowhere"),
    (["analyze", "{tmp}"], "coll"),  # a directory without the required records
    (["simulate", "--preset", "no-such-preset", "--out", "{tmp}/x"], "no-such-preset"),
    (["simulate"], "--out"),
    (["plan", "microbatches", "--times", "1,2"], "--total"),
    (["plan", "microbatches", "--times", "1,2", "--total", "1"], "plan microbatches"),
    (["changepoints", "{tmp}/missing.csv"], "missing.csv"),
    (["bench", "no-such-benchmark"], "unknown benchmark"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], needle: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "meta.json").write_text("{}")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"failslow {argv[0]}") and needle in lines[0], lines


def test_usage_errors_are_one_line_naming_the_command(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    for argv, prog in ((["analyze", "x", "--bogus"], "failslow analyze"),
                       (["infra", "up", "--bogus"], "failslow infra up"),
                       (["analyze"], "failslow analyze")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        lines = _err_lines(capsys)
        assert len(lines) == 1 and lines[0].startswith(prog + ": "), lines


def test_verbose_before_and_after_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["analyze", "x"]).verbose == 0
    assert parser.parse_args(["-v", "analyze", "x"]).verbose == 1
    assert parser.parse_args(["analyze", "x", "-v"]).verbose == 1
    assert parser.parse_args(["-vv", "analyze", "x"]).verbose == 2
    assert parser.parse_args(["infra", "status", "-vv"]).verbose == 2

    import failslow.engine.offline as an

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something broke inside")

    monkeypatch.setattr(an, "analyze", broken)
    assert cli.main(["analyze", str(tmp_path)]) == 1
    assert len(_err_lines(capsys)) == 1
    with pytest.raises(RuntimeError, match="something broke inside"):
        cli.main(["analyze", str(tmp_path), "-v"])

    def bad(*args: object, **kwargs: object) -> None:
        raise events.ContractError("meta.json: no job")

    monkeypatch.setattr(an, "analyze", bad)
    assert cli.main(["analyze", str(tmp_path), "-v"]) == 2  # bad input: the traceback too
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == (
        "failslow analyze: meta.json: no job")


def test_no_abbreviations_and_the_old_clickhouse_flag(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--clickhouse", "http://h:8123"]).clickhouse == \
        "http://h:8123"
    args = parser.parse_args(["demo", "--clickhouse-url", "http://h:8123"])
    assert args.clickhouse == "http://h:8123"
    assert "deprecated; use --clickhouse" in capsys.readouterr().err
    assert "--clickhouse-url" not in parser.parse_args(["demo"]).__dict__
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--data", "x"])  # not taken for --data-dir
    with pytest.raises(SystemExit):
        parser.parse_args(["--log", "json", "config", "show"])  # not --log-format


def test_config_show_masks_a_secret_from_a_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "password"
    secret.write_text("hunter2-very-secret\n")
    monkeypatch.setenv("FAILSLOW_CLICKHOUSE_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("FAILSLOW_KAFKA", "10.1.2.3:9092")
    assert cli.main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "10.1.2.3:9092" in out
    line = next(x for x in out.splitlines() if x.startswith("clickhouse.password"))
    assert "********" in line and "FAILSLOW_CLICKHOUSE_PASSWORD" in line
    assert cli.main(["config", "show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clickhouse"]["password"] == "********" and doc["kafka"]["bootstrap"] == \
        "10.1.2.3:9092"
    secret.unlink()  # an unreadable secret file is bad input
    assert cli.main(["config", "show"]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1 and "FAILSLOW_CLICKHOUSE_PASSWORD_FILE" in lines[0]


def test_config_file_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from failslow import settings

    toml = tmp_path / "failslow.toml"
    toml.write_text('log_format = "json"\n[kafka]\ntopic_prefix = "from-toml-"\n')
    assert cli.main(["--config", str(toml), "config", "show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kafka"]["topic_prefix"] == "from-toml-" and doc["log_format"] == "json"
    yml = tmp_path / "failslow.yaml"
    yml.write_text("kafka:\n  group: from-yaml\n")
    assert cli.main(["--config", str(yml), "config", "show"]) == 0
    assert "from-yaml" in capsys.readouterr().out
    assert settings.get_settings().kafka.group == "failslow-processor"  # not left behind
    yml.write_text("kafka: [1, 2\n")
    assert cli.main(["--config", str(yml), "config", "show"]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1 and "not valid YAML" in lines[0]
    assert cli.main(["--config", str(tmp_path / "none.toml"), "config", "show"]) == 2
    assert "none.toml" in _err_lines(capsys)[0]


def test_log_format_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    import failslow.engine.offline as an

    def noisy(*args: object, **kwargs: object) -> None:
        logging.getLogger("failslow.engine.offline").warning("replaying %d windows", 3)
        logging.getLogger("failslow.detectors").info("a detail")
        raise events.ContractError("no coll records")

    monkeypatch.setattr(an, "analyze", noisy)
    assert cli.main(["--log-format", "json", "-v", "analyze", str(tmp_path)]) == 2
    *logs, last = _err_lines(capsys)
    docs = [json.loads(x) for x in logs if x.startswith("{")]
    assert [d["message"] for d in docs] == ["replaying 3 windows", "a detail"]
    assert {"time", "level", "logger", "message"} <= set(docs[0])
    assert docs[0]["level"] == "WARNING" and docs[0]["logger"] == "failslow.engine.offline"
    assert last == "failslow analyze: no coll records"
    monkeypatch.setenv("FAILSLOW_LOG_FORMAT", "json")  # the default comes from the settings
    assert cli.main(["analyze", str(tmp_path)]) == 2
    first = _err_lines(capsys)[0]
    assert json.loads(first)["message"] == "replaying 3 windows"
    assert cli.main(["--log-format", "text", "analyze", str(tmp_path)]) == 2
    assert _err_lines(capsys)[0] == "WARNING failslow.engine.offline: replaying 3 windows"


def test_help_imports_no_benchmark_and_the_table_is_right() -> None:
    code = ("import sys\nfrom failslow.cli import build_parser\nbuild_parser()\n"
            "print([m for m in sys.modules if m.startswith('failslow.bench')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    for name, module in BENCHMARK_MODULES.items():
        assert name in importlib.import_module(module).BENCHMARKS, (name, module)
