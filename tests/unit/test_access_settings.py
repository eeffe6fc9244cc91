"""The access settings as ``inferd serve`` reads them (issue 13, item 6): Triton's boolean flags,
the repeatable --grpc-restricted-protocol and where its secret comes from."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from inferd.cli import _add_setting_flags, _settings
from inferd.settings import ServerSettings
from inferd.transport.core_server import restricted_protocol


def parse(argv: list[str]) -> ServerSettings:
    parser = argparse.ArgumentParser()
    _add_setting_flags(parser)
    return _settings(parser.parse_args(argv))


def test_tls_flags_are_tritons_and_booleans_read_as_triton_writes_them() -> None:
    assert not parse([]).grpc_use_ssl
    assert parse(["--grpc-use-ssl"]).grpc_use_ssl
    assert parse(["--grpc-use-ssl=true"]).grpc_use_ssl
    assert not parse(["--grpc-use-ssl=false"]).grpc_use_ssl
    files = ["--grpc-server-cert", "c", "--grpc-server-key", "k", "--grpc-root-cert", "r"]
    settings = parse(["--grpc-use-ssl-mutual", *files])
    assert settings.grpc_use_ssl_mutual
    assert (settings.grpc_server_cert, settings.grpc_server_key, settings.grpc_root_cert) == (
        "c",
        "k",
        "r",
    )
    with pytest.raises(SystemExit):
        parse(["--grpc-use-ssl=maybe"])


def test_restricted_protocols_repeat_and_come_from_the_environment_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse([]).grpc_restricted_protocol == ()
    two = ["--grpc-restricted-protocol", "inference:a=1", "--grpc-restricted-protocol=health:b=2"]
    assert parse(two).grpc_restricted_protocol == ("inference:a=1", "health:b=2")
    monkeypatch.setenv("INFERD_GRPC_RESTRICTED_PROTOCOL", "inference:a=1;logging:c=env:X")
    monkeypatch.setenv("INFERD_GRPC_CONTROL_ON_TCP", "true")
    settings = parse([])
    assert settings.grpc_restricted_protocol == ("inference:a=1", "logging:c=env:X")
    assert settings.grpc_control_on_tcp


def test_a_restricted_protocols_value_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert restricted_protocol("inference,health:key=plain") == (
        ["inference", "health"],
        "key",
        "plain",
    )
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\nsecond line ignored\n")
    assert restricted_protocol(f"logging:admin=@{secret}") == (["logging"], "admin", "from-a-file")
    monkeypatch.setenv("INFERD_TEST_SECRET", "from-the-environment")
    assert restricted_protocol("trace:t=env:INFERD_TEST_SECRET")[2] == "from-the-environment"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("inference", "GROUPS:KEY=VALUE"),
        ("inference:key", "GROUPS:KEY=VALUE"),
        (":key=v", "GROUPS:KEY=VALUE"),
        ("inference:=v", "GROUPS:KEY=VALUE"),
        ("inference:k=env:INFERD_TEST_UNSET_SECRET", "INFERD_TEST_UNSET_SECRET is not set"),
        ("inference:k=@/nonexistent/secret", "cannot read /nonexistent/secret"),
    ],
)
def test_a_malformed_restricted_protocol_is_refused_without_showing_its_value(
    spec: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        restricted_protocol(spec)
    assert "=v" not in str(refused.value)
