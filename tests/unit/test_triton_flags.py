"""Triton's command line read by ``inferd serve`` (issue 27, item 6): every tritonserver flag is
the same, an alias, ignored with a log line or refused naming why; Triton's booleans; the closest
flag for a mistake; docs/coming-from-triton.md is the table the parser reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferd import cli
from inferd.settings import ServerSettings, setting_fields
from inferd.triton_flags import (
    TRITON_FLAGS,
    Treatment,
    TritonFlagError,
    mapping_markdown,
    translate,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "coming-from-triton.md"

# The flags of `tritonserver --help`, in its order: Triton 2.51 as bundled in nvidia-pytriton 0.7.0
# (pip download nvidia-pytriton==0.7.0 --no-deps; pytriton/tritonserver/bin/tritonserver --help).
_HELP_FLAGS = (
    "--help --id --exit-timeout-secs --log-verbose --log-info --log-warning --log-error "
    "--log-format --log-file --model-store --model-repository --exit-on-error "
    "--disable-auto-complete-config --strict-readiness --model-control-mode "
    "--repository-poll-secs --load-model --model-config-name --model-load-thread-count "
    "--model-load-retry-count --model-namespacing --enable-peer-access --allow-http "
    "--http-address --http-port --reuse-http-port --http-header-forward-pattern "
    "--http-thread-count --http-restricted-api --allow-grpc --grpc-address --grpc-port "
    "--reuse-grpc-port --grpc-header-forward-pattern --grpc-infer-allocation-pool-size "
    "--grpc-use-ssl --grpc-use-ssl-mutual --grpc-server-cert --grpc-server-key --grpc-root-cert "
    "--grpc-infer-response-compression-level --grpc-keepalive-time --grpc-keepalive-timeout "
    "--grpc-keepalive-permit-without-calls --grpc-http2-max-pings-without-data "
    "--grpc-http2-min-recv-ping-interval-without-data --grpc-http2-max-ping-strikes "
    "--grpc-max-connection-age --grpc-max-connection-age-grace --grpc-restricted-protocol "
    "--allow-sagemaker --sagemaker-port --sagemaker-safe-port-range --sagemaker-thread-count "
    "--allow-vertex-ai --vertex-ai-port --vertex-ai-thread-count --vertex-ai-default-model "
    "--allow-metrics --allow-gpu-metrics --allow-cpu-metrics --metrics-address --metrics-port "
    "--metrics-interval-ms --metrics-config --trace-config --backend-directory --backend-config "
    "--repoagent-directory --cache-config --cache-directory --rate-limit --rate-limit-resource "
    "--pinned-memory-pool-byte-size --cuda-memory-pool-byte-size --cuda-virtual-address-size "
    "--min-supported-compute-capability --buffer-manager-thread-count --host-policy "
    "--model-load-gpu-limit --strict-model-config --response-cache-byte-size --trace-file "
    "--trace-level --trace-rate --trace-count --trace-log-frequency"
)
TRITONSERVER_HELP_FLAGS = _HELP_FLAGS.split()

# KServe's own Triton runtime (kserve-tritonserver), after the program name the image's
# entrypoint drops.
KSERVE_TRITON_ARGS = [
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]


def settings_of(*argv: str) -> tuple[ServerSettings, list[tuple[str, str]]]:
    """``inferd serve ARGV``'s settings and the Triton flags it ignored, without serving."""
    args, ignored = cli._arguments(["serve", *argv])
    return cli._settings(args), ignored


def error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``inferd serve ARGV`` refuses with (exit status 2), without its help hint."""
    with pytest.raises(SystemExit) as exited:
        cli._arguments(["serve", *argv])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("inferd serve: error: ") and line.endswith(
        " (see inferd serve --help)"
    ), line
    return line.removeprefix("inferd serve: error: ").removesuffix(" (see inferd serve --help)")


def test_the_table_has_every_tritonserver_flag_once_in_its_help_order() -> None:
    assert [flag.name for flag in TRITON_FLAGS] == TRITONSERVER_HELP_FLAGS


def test_each_same_or_alias_names_an_inferd_flag_and_each_other_says_why() -> None:
    inferd_flags = {"--help"} | {cli._flag(f.name) for f in setting_fields()}
    for flag in TRITON_FLAGS:
        if flag.treatment in (Treatment.SAME, Treatment.ALIAS):
            assert flag.target in inferd_flags, flag.name
        else:
            assert flag.why and not flag.target, flag.name
        if flag.treatment is Treatment.SAME:
            assert flag.target == flag.name


def test_the_docs_page_holds_the_table_the_parser_reads() -> None:
    assert mapping_markdown() in DOC.read_text(), (
        "docs/coming-from-triton.md: replace its table with `python -m inferd.triton_flags`"
    )


def test_kservess_triton_runtime_arguments_start_inferd_unchanged() -> None:
    settings, ignored = settings_of(*KSERVE_TRITON_ARGS)
    assert settings.model_repository == Path("/mnt/models")
    assert (settings.grpc_port, settings.http_port) == (9000, 8080)
    assert settings.allow_grpc and settings.allow_http
    assert ignored == []


@pytest.mark.parametrize(
    ("argv", "setting", "value"),
    [
        (["--model-store", "/m"], "model_repository", Path("/m")),
        (["--grpc-address=127.0.0.2"], "host", "127.0.0.2"),
        (["--http-address", "127.0.0.3"], "http_host", "127.0.0.3"),
        (["--grpc-keepalive-time", "7200000"], "grpc_keepalive_time_secs", 7200.0),
        (["--grpc-keepalive-timeout=20000"], "grpc_keepalive_timeout_secs", 20.0),
        (["--model-control-mode=POLL"], "model_control_mode", "poll"),
        (["--log-format=ISO8601"], "log_format", "auto"),
        (["--log-format", "default"], "log_format", "auto"),
        (["--log-format=json"], "log_format", "json"),
        (["--load-model", "a", "--load-model=b"], "load_model", "a,b"),
        (["--http-thread-count", "4"], "http_thread_count", 4),
        # --allow-metrics=false wins over --metrics-port, wherever it is, as in Triton.
        (["--allow-metrics=false", "--metrics-port", "9"], "metrics_port", -1),
        (["--metrics-port", "9", "--allow-metrics", "true"], "metrics_port", 9),
        (["--metrics-port=off"], "metrics_port", -1),
    ],
)
def test_tritons_names_and_units_set_inferds_settings(
    argv: list[str], setting: str, value: object
) -> None:
    settings, ignored = settings_of(*argv)
    assert getattr(settings, setting) == value
    assert ignored == []


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["--allow-http=true"], True),
        (["--allow-http=false"], False),
        (["--allow-http=1"], True),
        (["--allow-http=0"], False),
        (["--allow-http", "false"], False),
        (["--allow-http", "0"], False),
        (["--allow-http", "ON"], True),
        (["--allow-http=off"], False),
        (["--allow-http"], True),
    ],
)
def test_tritons_boolean_syntax(given: list[str], expected: bool) -> None:
    for flag in ("--allow-http", "--allow-grpc", "--exit-on-error", "--strict-readiness"):
        argv = [token.replace("--allow-http", flag) for token in given]
        settings, _ = settings_of(*argv)
        assert getattr(settings, flag[2:].replace("-", "_")) is expected, argv


def test_the_new_settings_defaults_are_tritons() -> None:
    settings, _ = settings_of()
    assert settings.exit_on_error and settings.allow_http and settings.allow_grpc
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)


@pytest.mark.parametrize(
    "flag", [f for f in TRITON_FLAGS if f.treatment is Treatment.IGNORED], ids=lambda f: f.name
)
def test_an_ignored_flag_and_its_value_are_dropped_saying_why(flag: Any) -> None:
    value = "true" if flag.boolean else "4"
    argv = [flag.name, value] if flag.takes_value else [flag.name]
    translated = translate([*argv, "--grpc-port", "7"])
    assert translated.args == ["--grpc-port", "7"]  # its value was not left for inferd's parser
    assert translated.ignored == [(" ".join(argv), flag.why)]


@pytest.mark.parametrize(
    "flag",
    [f for f in TRITON_FLAGS if f.treatment is Treatment.REFUSED and f.harmless],
    ids=lambda f: f.name,
)
def test_a_flag_refused_elsewhere_is_ignored_at_tritons_default(flag: Any) -> None:
    given = f"{flag.name}={flag.harmless[0]}"
    assert translate([given]).args == []
    ((said, why),) = translate([given]).ignored
    assert said == given and flag.why in why


@pytest.mark.parametrize(
    "flag", [f for f in TRITON_FLAGS if f.treatment is Treatment.REFUSED], ids=lambda f: f.name
)
def test_a_refused_flag_names_itself_and_why(flag: Any) -> None:
    with pytest.raises(TritonFlagError) as refused:
        translate([flag.name, "2" if flag.harmless != ("2",) else "3"])
    assert flag.name in str(refused.value) and flag.why in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--rate-limit=execution_count"],
            "Triton's --rate-limit=execution_count is not supported: inferd has no rate limiter "
            "yet (only --rate-limit=off is accepted, and ignored)",
        ),
        (
            ["--model-namespacing", "true"],
            "Triton's --model-namespacing=true is not supported: inferd serves one repository, "
            "whose model names are unique (only --model-namespacing=false is accepted, and "
            "ignored)",
        ),
        (
            ["--model-store", "/a", "--model-repository=/b"],
            "--model-store and --model-repository: inferd serves one model repository, not "
            "Triton's several",
        ),
        (["--grpc-keepalive-time", "2h"], "not a whole number of milliseconds: '2h'"),
        (["--id"], "--id needs a value"),
    ],
)
def test_the_refusal_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert error_of(argv, capsys) == message


@pytest.mark.parametrize(
    ("mistake", "closest"),
    [
        ("--grpc-prot", "--grpc-port"),  # inferd's and Triton's
        ("--model-stor", "--model-store"),  # Triton's only
        ("--alow-http", "--allow-http"),
        ("--exit-on-eror=false", "--exit-on-error"),
        ("--http-max-chunsk", "--http-max-chunks"),
    ],
)
def test_an_unknown_flag_is_answered_with_the_closest_known_one(
    mistake: str, closest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = mistake.partition("=")[0]
    assert error_of([mistake], capsys) == f"unrecognized flag {flag}: did you mean {closest}?"


def test_a_flag_like_none_is_unrecognized_without_a_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert error_of(["--zzzz"], capsys) == "unrecognized flag --zzzz"


class _Log:
    """Stands in for cli's logger: the records main writes."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, object]]] = []

    def info(self, event: str, **fields: object) -> None:
        self.records.append((event, fields))


def test_each_ignored_flag_is_one_log_line_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[ServerSettings] = []

    async def serve(settings: ServerSettings, _log_control: object) -> None:
        served.append(settings)

    recorder = _Log()
    monkeypatch.setattr(cli, "_serve", serve)
    monkeypatch.setattr(cli, "log", recorder)
    argv = ["serve", "--model-store", str(tmp_path), "--log-format", "json"]
    argv += ["--backend-directory", "/opt/tritonserver/backends", "--strict-model-config=false"]
    argv += ["--reuse-grpc-port", "false"]
    assert cli.main(argv) == 0
    assert served[0].model_repository == tmp_path
    assert [fields["flag"] for event, fields in recorder.records] == [
        "--backend-directory /opt/tritonserver/backends",
        "--strict-model-config=false",
        "--reuse-grpc-port=false",
    ]
    assert {event for event, _ in recorder.records} == {"Triton flag ignored"}
    assert all(fields["why"] for _, fields in recorder.records)
