"""docs/configuration.md is generated from DLedgerConfig: it must be the current rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.config import ConfigError, DLedgerConfig
from dledger.config_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_is_current() -> None:
    assert DOC.read_text() == render(), "regenerate: python -m dledger.config_doc > docs/configuration.md"


def test_every_key_has_a_meaning_in_the_reference() -> None:
    member, broker = render().split("## Broker retention")
    rows = [line for line in member.splitlines() if line.startswith("| `")]
    assert len(rows) == len(DLedgerConfig.__dataclass_fields__)
    broker_rows = [line for line in broker.splitlines() if line.startswith("| `")]
    assert len(broker_rows) == 4 and all(not row.rstrip().endswith("|  |") for row in broker_rows), broker_rows
    assert all(not row.rstrip().endswith("|  |") for row in rows), [r for r in rows if r.rstrip().endswith("|  |")]


def test_an_unknown_key_names_the_valid_ones_and_a_close_match() -> None:
    with pytest.raises(ConfigError, match=r"flush_intervall_ms \(did you mean flush_interval_ms\?\); valid keys "
                                          r"are .*store_dir"):
        DLedgerConfig.from_dict({"flush_intervall_ms": 5})


def test_a_key_written_as_a_flag_is_told_the_key_it_means(tmp_path: Path) -> None:
    """`dledger server --config`: `id` is the flag --id, which sets self_id; `self-id` is not snake_case."""
    from click.testing import CliRunner

    from dledger.cli import cli

    (tmp_path / "m.toml").write_text('id = "n0"\nstore = "memory"\nself-id = "n0"\npeers = "n0-127.0.0.1:1"\n')
    r = CliRunner().invoke(cli, ["server", "--config", str(tmp_path / "m.toml")])
    assert r.exit_code == 1 and r.exception is not None, r.output
    message = str(r.exception)
    assert "id (the flag --id sets the key self_id)" in message
    assert "store (the flag --store sets the key store_type)" in message
    assert "self-id (keys are snake_case: self_id)" in message


def test_odd_keys_get_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="configuration keys are names, not 1"):
        DLedgerConfig.from_dict({1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"'peers ' \(did you mean peers\?\), \[tls\] \(a table: a member's keys"):
        DLedgerConfig.from_dict({"tls": {"cert": "c.pem"}, "peers ": "n0-127.0.0.1:1"})


def test_the_example_configuration_loads(tmp_path: Path) -> None:
    import re

    (block,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    (tmp_path / "member.toml").write_text(block)
    cfg = DLedgerConfig.from_toml(str(tmp_path / "member.toml"))
    assert (cfg.group, cfg.flush, cfg.metrics_port) == ("orders", "sync", 9100)


def test_lease_timers_without_a_drift_margin_or_a_missed_heartbeat_are_refused() -> None:
    """Lease reads need a margin for clock rates (none is refused), and a follower that
    campaigns after one missed heartbeat would flap: both are refused with the rule."""
    def cfg(max_heart_beat_leak: int = 4, lease_clock_drift_ms: int = 200) -> DLedgerConfig:
        return DLedgerConfig(self_id="n0", peers="n0-127.0.0.1:1", store_type="memory",
                             max_heart_beat_leak=max_heart_beat_leak, lease_clock_drift_ms=lease_clock_drift_ms)

    with pytest.raises(ConfigError, match=r"lease_clock_drift_ms must be in \[1, 600\)"):
        cfg(lease_clock_drift_ms=0).validate()
    with pytest.raises(ConfigError, match="max_heart_beat_leak must be at least 2"):
        cfg(max_heart_beat_leak=1, lease_clock_drift_ms=100).validate()
    cfg(lease_clock_drift_ms=60).validate()
    with pytest.raises(ConfigError, match=r"the lease.*at most 600000 ms"):  # heartbeats carry it, bounded
        cfg(max_heart_beat_leak=4001).validate()
