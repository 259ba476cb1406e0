"""`-o/--output json|table` on every `dledger` command that prints a result (the commands
that need no running group here; the others in tests/integration: test_cli, test_state_machine,
test_controller, test_broker)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from dledger.bench.load import LoadResult, LoadSpec
from dledger.cli import cli
from dledger.clitools import Rows, emit, emit_record

# members, broker replicas and live views: nothing to print as rows
NO_OUTPUT = {"server", "cluster", "controller", "broker", "top", "demo"}


def commands(group: click.Group, path: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out.update(commands(cmd, f"{path}{name} "))
        elif name not in NO_OUTPUT:
            out[f"{path}{name}"] = cmd
    return out


def test_every_command_that_prints_a_result_takes_output_json_or_table() -> None:
    found = commands(cli)
    assert {"get", "snapshot", "store inspect", "kv range", "admin sync-state-set", "send", "certs", "bench",
            "audit"} <= set(found)
    for name, cmd in found.items():
        opt = next((p for p in cmd.params if p.name == "output"), None)
        assert isinstance(opt, click.Option), f"dledger {name} has no -o/--output"
        assert opt.opts == ["-o", "--output"] and isinstance(opt.type, click.Choice), name
        assert list(opt.type.choices) == ["json", "table"], name
        assert opt.default in ("json", "table", None), name
        if opt.default is None:  # the command's own format without -o: the help says which
            assert opt.help is not None and "[default: " in opt.help, name


def run(*args: str) -> Result:
    """The command, on a wide terminal (a table's values on one line each)."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A member's store directory as a forged term left it: no entries, currterm past the limit."""
    d = tmp_path / "store"
    (d / "data").mkdir(parents=True)
    (d / "currterm").write_text(json.dumps({"term": 1 << 62, "voted_for": "n0"}))
    return d


def test_store_inspect_and_repair_term(store: Path) -> None:
    default = run("store", "inspect", "--store-dir", str(store)).output
    view = json.loads(default)
    assert default == run("store", "inspect", "--store-dir", str(store), "-o", "json").output  # json is the default
    # a term no message or record could carry: unreadable, the problem names the repair
    assert view["term"] is None and len(view["problems"]) == 1 and "repair-term" in view["problems"][0]
    table = run("store", "inspect", "--store-dir", str(store), "-o", "table").output
    assert "voted_for" in table and str(1 << 62) in table and "beyond dledger's limit" in table and "{" not in table
    table = run("store", "repair-term", "--store-dir", str(store), "-o", "table").output
    assert '{"before": null, "after": 0}' in table and "voted_for" in table  # the unreadable term is replaced
    change = json.loads(run("store", "repair-term", "--store-dir", str(store), "--term", "3", "-o", "json").output)
    assert change["term"] == {"before": 0, "after": 3}


def test_store_inspect_errors_stay_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["store", "inspect", "--store-dir", str(tmp_path), "-o", "table"])
    assert result.exit_code != 0 and "not a dledger store directory" in str(result.exception)
    result = CliRunner().invoke(cli, ["store", "inspect", "--store-dir", str(tmp_path), "-o", "yaml"])
    assert result.exit_code == 2 and "'yaml' is not one of 'json', 'table'" in result.output


def test_certs(tmp_path: Path) -> None:
    files = [json.loads(line) for line in run("certs", "--out", str(tmp_path / "a"), "--members", "n0",
                                              "-o", "json").output.splitlines()]
    assert {f["name"]: f["private_key"] for f in files} == {"ca": False, "ca-key": True, "n0": False, "n0-key": True,
                                                            "client": False, "client-key": True, "admin": False,
                                                            "admin-key": True}
    assert all(Path(f["path"]).is_file() for f in files)
    table = run("certs", "--out", str(tmp_path / "b"), "--members", "n0", "-o", "table").output
    assert "private_key" in table and "n0-key" in table and "start member n0 with: --tls-cert" in table
    text = run("certs", "--out", str(tmp_path / "c"), "--members", "n0").output  # as before
    assert text.startswith("wrote ") and "(private key, mode 0600)" in text and "{" not in text


def test_bench_summary_as_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench's summary with -o json: the report --json FILE writes, one line on stdout."""
    def fake_run(spec: LoadSpec, procs: int = 1) -> LoadResult:
        return LoadResult(entries=500, requests=100, elapsed=1.0, latencies_ms=array("d", [1.0, 2.0]), size=10,
                          batch=5)

    monkeypatch.setattr("dledger.bench.command._run", fake_run)
    peers = ["--peers", "n0-127.0.0.1:1", "--json", str(tmp_path / "r.json")]
    result = run("bench", *peers, "-o", "json")
    report = json.loads(result.stdout)  # stdout: the report alone (what it benches is said on stderr)
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert report["entries_per_s"] == 500 and report["config"]["target"] == "external group"
    assert result.stderr.splitlines()[0].startswith("bench: against --peers n0-127.0.0.1:1 (group ")
    assert "entries/s" in run("bench", *peers).stdout  # the table, as before


def test_bench_takes_its_group_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """DLEDGER_PEERS/DLEDGER_GROUP as every client command; bench says on stderr that it benches
    that group (no local one), and refuses the options of a local group beside it."""
    def fake_run(spec: LoadSpec, procs: int = 1) -> LoadResult:
        assert (spec.peers, spec.group) == ("n0-127.0.0.1:1;n1-127.0.0.1:2", "g1")
        return LoadResult(entries=10, requests=10, elapsed=1.0, latencies_ms=array("d", [1.0]), size=10, batch=1)

    monkeypatch.setattr("dledger.bench.command._run", fake_run)
    env = {"DLEDGER_PEERS": "n0-127.0.0.1:1;n1-127.0.0.1:2", "DLEDGER_GROUP": "g1"}
    result = CliRunner(env=env).invoke(cli, ["bench", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == "bench: against DLEDGER_PEERS n0-127.0.0.1:1;n1-127.0.0.1:2 (group g1)"
    assert json.loads(result.stdout)["config"]["target"] == "external group"

    result = CliRunner(env=env).invoke(cli, ["bench", "--flush", "sync", "--nodes", "1"])
    assert result.exit_code == 2, result.output  # a usage error, before any load
    assert "--nodes, --flush set up the local group bench starts; with DLEDGER_PEERS it benches" in result.stderr
    assert "unset DLEDGER_PEERS" in result.stderr
    result = CliRunner().invoke(cli, ["bench", "--peers", "n0-127.0.0.1:1", "--tls"])
    assert result.exit_code == 2 and "--tls set up the local group" in result.stderr, result.output
    assert "give no --peers" in result.stderr


def test_rows_and_records_print_json_lines_or_tables(capsys: pytest.CaptureFixture[str]) -> None:
    with Rows("json") as rows:
        rows.add({"a": 1, "body": {"b64": "AA=="}})
    assert capsys.readouterr().out == '{"a": 1, "body": {"b64": "AA=="}}\n'
    with Rows("table", "t") as rows:
        rows.add({"a": 1, "body": {"b64": "AA=="}})
        assert capsys.readouterr().out == ""  # gathered until the end
    out = capsys.readouterr().out
    assert '{"b64": "AA=="}' in out and "body" in out
    with pytest.raises(RuntimeError), Rows("table") as rows:  # what was done before an error still shows
        rows.add({"done": "yes"})
        raise RuntimeError
    assert "yes" in capsys.readouterr().out
    emit_record({"k": None, "problems": ["one", "two"]}, "table")
    out = capsys.readouterr().out
    assert "one" in out and "two" in out and "None" not in out
    emit([], "json")
    assert capsys.readouterr().out == ""


def test_top_takes_one_metrics_port_or_a_base_port_not_both() -> None:
    r = CliRunner().invoke(cli, ["top", "--peers", "n0-127.0.0.1:1", "--metrics-port", "9100",
                                 "--metrics-base-port", "9200"])
    assert r.exit_code == 2 and "not both" in r.output, r.output


@pytest.mark.parametrize("args", [["health"], ["status"], ["append", "x"], ["get", "--index", "1"], ["kv", "get", "k"],
                                  ["transfer", "--to", "n1"], ["snapshot"], ["top"]])
def test_a_missing_peers_is_a_usage_error_not_an_internal_one(args: list[str]) -> None:
    r = CliRunner(env={"DLEDGER_PEERS": None}).invoke(cli, args)
    assert r.exit_code == 2 and "Missing option '--peers'" in r.output, (args, r.output, r.exception)


def test_tables_show_user_data_as_text_and_whole() -> None:
    """A title or cell with rich markup ("[/]") is printed as is; a long value folds, not "…"."""
    r = CliRunner().invoke(click.Command("t", callback=lambda: emit(
        [{"key": "[/]k[bold]", "body": "x" * 300 + "\\"}], "table", "keys starting with '[/]'")), [])
    assert r.exit_code == 0, r.output
    assert "keys starting with '[/]'" in r.output and "[/]k[bold]" in r.output, r.output
    assert r.output.count("x") == 300 and r.output.count("\\") == 1 and "…" not in r.output, r.output


def test_tables_show_control_characters_and_say_when_empty() -> None:
    """An ESC in a stored body must not reach the terminal raw (it could recolour or retitle
    it); an empty result is a line on stderr, not a blank one."""
    r = CliRunner().invoke(click.Command("t", callback=lambda: emit([{"v": "\x1b[31mred\x07"}], "table")), [])
    assert "\x1b" not in r.output and "\\x1b[31mred\\x07" in r.output, r.output
    r = CliRunner().invoke(click.Command("t", callback=lambda: emit([], "table", "keys starting with 'z'")), [])
    assert r.output.strip() == "(none: keys starting with 'z')", r.output


@pytest.mark.parametrize(("args", "said"), [
    (["--mode", "controller", "--state-machine", "kv"], "--state-machine: not an option of --mode controller"),
    (["--mode", "controller", "--nodes", "5"], "--nodes: not an option of --mode controller"),
    (["--mode", "controller", "--retention-hours", "24"], "--retention-hours: not an option of --mode controller"),
    (["--controllers", "5", "--all-ack-in-sync-state-set"],
     "--all-ack-in-sync-state-set, --controllers: not an option of --mode raft"),
    (["--mode", "controller", "--store", "memory"], "--store memory: brokers keep their logs in files"),
    (["--tls", "--insecure"], "--tls and --insecure contradict each other"),
])
def test_cluster_refuses_an_option_it_would_drop(tmp_path: Path, args: list[str], said: str) -> None:
    """`dledger cluster --mode controller --tls` ran without TLS and dropped --flush, --store,
    --state-machine and --metrics-base-port: every option is now honoured or refused in one line."""
    result = CliRunner().invoke(cli, ["cluster", "--data-dir", str(tmp_path / "d"), *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "d").exists(), "refused, yet something was started"


def test_cluster_in_controller_mode_passes_on_its_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--flush, --group, --metrics-base-port and the certificates (TLS unless --insecure) reach
    the controller-mode deployment (which is only built here, not started)."""
    import dledger.broker.local as local

    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake(*args: object, **kwargs: object) -> None:
        seen.update(kwargs, args=args)
        raise Stop

    monkeypatch.setattr(local, "local_broker_cluster", fake)
    result = CliRunner().invoke(cli, ["cluster", "--mode", "controller", "--data-dir", str(tmp_path), "--flush", "sync",
                                      "--group", "ctl", "--metrics-base-port", "9300"])
    assert isinstance(result.exception, Stop), result.output
    assert seen["tls_dir"] == tmp_path / "certs" and seen["flush"] == "sync" and seen["group"] == "ctl"
    assert seen["metrics_base_port"] == 9300 and "--flush" in seen["args"][5]  # type: ignore[index]
    CliRunner().invoke(cli, ["cluster", "--mode", "controller", "--data-dir", str(tmp_path), "--insecure"])
    assert seen["tls_dir"] is None


def test_cluster_passes_retention_options_to_every_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--retention-hours and --file-reserved-hours reach each member's `dledger server` (the
    group is only built here, not started)."""
    import dledger.cli as cli_module

    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake(*args: object, **kwargs: object) -> None:
        seen["args"] = args
        raise Stop

    monkeypatch.setattr(cli_module, "local_cluster", fake)
    result = CliRunner().invoke(cli, ["cluster", "--data-dir", str(tmp_path), "--insecure", "--base-port", "29911",
                                      "--retention-hours", "168", "--file-reserved-hours", "24"])
    assert isinstance(result.exception, Stop), result.output
    extra = seen["args"][6]  # type: ignore[index]
    assert extra == ["--retention-hours", "168.0", "--file-reserved-hours", "24.0"], extra
