"""Robustness: bad CLI arguments end with ONE line ``backfill: error: ...`` on stderr, a
non-zero exit and no traceback. Runs ``backfill.cli.main`` in a subprocess (no database is
needed: every case fails before or at the first connection; the only server address used is
127.0.0.1 on port 1, which is closed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HUGE = "9" * 400 + "h"
CLOSED = "postgresql://u:p@127.0.0.1:1/db"


def _run(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")} | (extra_env or {})
    return subprocess.run(
        [sys.executable, "-c", "import sys; from backfill.cli import main; sys.exit(main(sys.argv[1:]))", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=30,
    )


def _assert_one_line_error(p: subprocess.CompletedProcess, controller: bool = False) -> str:
    """The one error line (its ``msg`` for the controller, whose every line is a JSON log object)."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode not in (0, None), p.stderr
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1, p.stderr[-2000:]
    line = lines[0]
    if controller:
        record = json.loads(line)
        assert record["level"] == "error" and record["logger"] == "backfill.cli", record
        line = record["msg"]
    assert line.startswith("backfill: error:"), p.stderr[-2000:]
    return line


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    files = {
        "nan_ts.csv": "model,timestamp\nm1,nan\nm1,2026-01-01T00:00:00Z\n",
        "inf_ts.csv": "model,timestamp\nm1,inf\nm1,2026-01-01T00:00:00Z\n",
        "neg_ts.csv": "model,timestamp\nm1,-1e12\nm1,0\n",
        "ms_ts.csv": "model,timestamp\nm1,1764496770000\nm1,1764500370000\n",
        "huge_ts.csv": "model,timestamp\nm1,1e300\nm1,2026-01-01T00:00:00Z\n",
        "huge_dur.csv": "model,timestamp,duration_s\nm1,2026-01-01T00:00:00Z,1e300\nm1,2026-01-02T00:00:00Z,1\n",
        "ok.csv": "model,timestamp\nm1,2026-01-01T00:00:00Z\nm1,2026-01-01T05:00:00Z\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


SIM = ["simulate", "--no-store", "--days", "0.1"]


@pytest.mark.parametrize(
    "args",
    [
        SIM + ["--idle-for", HUGE],
        SIM + ["--max-run", HUGE],
        SIM + ["--job", HUGE],
        SIM + ["--repeat-after", HUGE],
        SIM + ["--cancel-latency", HUGE],
        SIM + ["--idle-for", "99999999999h"],
        SIM + ["--repeat-after", "80000000h", "--days", "2"],
        SIM + ["--cancel-latency", "80000000h"],
        SIM + ["--idle-for", "５m"],
        SIM + ["--plot", "timeline.weird"],
        ["runs", "--database-url", "garbage"],
        ["replay", "--database-url", "mysql://x/y"],
        ["db", "upgrade", "--database-url", "garbage"],
        ["runs", "--database-url", "postgresql://[::1/db"],
        ["simulate", "--days", "0.1", "--database-url", CLOSED],
        ["simulate", "--days", "0.1", "--database-url", "garbage"],
        ["runs", "--database-url", CLOSED, "--since", "9999-12-31T23:59:59-23:59"],
        ["replay", "--database-url", CLOSED, "--since", "0001-01-01T00:00:00+23:59"],
        ["runs", "--database-url", CLOSED, "--schema", "abc\n"],
        ["simulate", "--days", "0.1", "--database-url", CLOSED, "--schema", "sim\n"],
    ],
    ids=lambda a: " ".join(x[:20].replace("\n", "\\n") for x in a),
)
def test_bad_arguments(tmp_path, args):
    _assert_one_line_error(_run(args, tmp_path))


@pytest.mark.parametrize("name", ["nan_ts.csv", "inf_ts.csv", "neg_ts.csv", "ms_ts.csv", "huge_ts.csv", "huge_dur.csv"])
def test_bad_trace_values(traces, name):
    p = _run(["simulate", "--no-store", "--format", "csv", "--trace", str(traces / name), "--idle-for", "1m", "--job", "1m"], traces)
    _assert_one_line_error(p)
    assert f"{name}:" in p.stderr


def test_a_simulation_past_the_year_9999_is_a_one_line_error(tmp_path):
    """An adversarial trial: a request late in year 9998 whose busy span, padded by the signal
    granularity, passes 9999-12-31 ended in an OverflowError traceback (a service time alone
    cannot: the trace reader takes at most a year, and times before 9999)."""
    trace = tmp_path / "late.csv"
    trace.write_text("model,timestamp\nz,253370764798\nz,253370764799\n")  # 9998-12-31T23:59:58Z, :59Z
    args = ["simulate", "--no-store", "--format", "csv", "--trace", str(trace), "--signal-granularity", "8761h"]
    line = _assert_one_line_error(_run(args, tmp_path))
    assert "past 9999-12-31" in line


@pytest.mark.parametrize(
    "args",
    [
        SIM + ["--idle-for", "1d"], SIM + ["--idle-for", "-5m"], SIM + ["--idle-for", "5"], SIM + ["--idle-for", "1e3s"],
        SIM + ["--idle-for", ""], SIM + ["--repeat-after", "30s"], SIM + ["--days", "nan"], SIM + ["--format", "bogus"],
        SIM + ["--trace", "/nonexistent.csv"], ["runs", "--schema", "Backfill"], ["runs", "--schema", "x; DROP TABLE events;--"],
        ["runs", "--schema", "a" * 100], ["runs", "--since", "garbage"], ["replay", "--backfill", "a/b/c"],
        ["runs", "--database-url", CLOSED], ["replay", "--database-url", CLOSED], ["db", "upgrade", "--database-url", CLOSED],
    ],
    ids=lambda a: " ".join(x[:20] for x in a),
)
def test_bad_arguments_already_handled(tmp_path, args):
    _assert_one_line_error(_run(args, tmp_path))


@pytest.mark.parametrize("args", [["runs", "--limit", "9" * 23], ["replay", "--limit", "9" * 23]])
def test_a_limit_past_a_bigint_is_an_argument_error_not_a_database_error(tmp_path, args):
    """A trial: ``runs --limit 99999999999999999999999`` reached PostgreSQL ("bigint out of range")."""
    line = _assert_one_line_error(_run([*args, "--database-url", CLOSED], tmp_path))
    assert line == "backfill: error: Invalid value for '--limit': Input should be less than or equal to 9223372036854775807"


@pytest.mark.parametrize("target", ["adir", ""])
def test_plot_reports_the_file_it_wrote(traces, target):
    """matplotlib appends '.png' to a name without a suffix; the CLI must not claim another path."""
    (traces / "adir").mkdir()
    p = _run(["simulate", "--no-store", "--format", "csv", "--trace", str(traces / "ok.csv"), "--idle-for", "1m",
              "--job", "1m", "--plot", str(traces / target) if target else ""], traces)
    if p.returncode == 0:
        import re
        m = re.search(r"written to (\S+)", p.stderr)
        assert m and Path(m.group(1)).is_file(), p.stderr
    else:
        _assert_one_line_error(p)


# Every command that reads Settings (a database command or the controller). A bad setting used
# to end as "database: 1 validation error for Settings" (the first line of pydantic's message).
SETTINGS_COMMANDS = [
    ["runs"], ["replay"], ["simulate", "--days", "0.1"], ["db", "upgrade"], ["db", "prune", "--before", "2026-01-01"],
    ["db", "url"], ["db", "shell"], ["recommend", "--backfill", "ns/bf"], ["controller"],
]
BAD_NUMBER = "Input should be a valid number, unable to parse string as a number"


@pytest.mark.parametrize("args", SETTINGS_COMMANDS, ids=" ".join)
def test_a_bad_setting_names_its_variable_and_problem_in_every_command(tmp_path, args):
    p = _run(args, tmp_path, {"BACKFILL_RESYNC_SECONDS": "abc"})
    if args == ["db", "shell"] and "psql is not installed" in p.stderr:
        pytest.skip("db shell checks for psql first")
    line = _assert_one_line_error(p, controller=args == ["controller"])
    assert p.returncode == 2
    assert line == f"backfill: error: settings: BACKFILL_RESYNC_SECONDS: {BAD_NUMBER}"


@pytest.mark.parametrize("args", [["runs"], ["replay"], ["db", "upgrade"], ["controller"]], ids=" ".join)
def test_an_unreadable_database_url_file_is_named_with_its_error(tmp_path, args):
    absent = tmp_path / "absent"
    p = _run(args, tmp_path, {"BACKFILL_DATABASE_URL_FILE": str(absent)})
    line = _assert_one_line_error(p, controller=args == ["controller"])
    assert line == f"backfill: error: settings: BACKFILL_DATABASE_URL_FILE: {absent}: No such file or directory"


def test_a_database_url_file_that_is_no_text_url_is_named_with_its_error(tmp_path):
    """An adversarial trial: a file of Latin-1 bytes gave ``settings: 'utf-8' codec can't decode
    byte 0xff in position 0`` (the setting unnamed), and ``/dev/zero`` would be read for ever."""
    latin1 = tmp_path / "url"
    latin1.write_bytes(b"\xffpostgresql://h/db")
    line = _assert_one_line_error(_run(["runs"], tmp_path, {"BACKFILL_DATABASE_URL_FILE": str(latin1)}))
    assert line == f"backfill: error: settings: BACKFILL_DATABASE_URL_FILE: {latin1}: not UTF-8 text (invalid start byte at byte 1)"
    line = _assert_one_line_error(_run(["runs"], tmp_path, {"BACKFILL_DATABASE_URL_FILE": "/dev/zero"}))
    assert line == "backfill: error: settings: BACKFILL_DATABASE_URL_FILE: /dev/zero is over 64 KiB: not a database URL"


FINITE = "Input should be a finite number"
PG_MAX = "Input should be less than or equal to 2147483.647"


@pytest.mark.parametrize(
    "name, value, problem",
    [
        # inf passed (> 0) and every watcher then looped on "OverflowError: timestamp out of range
        # for platform time_t"; nan is no duration either.
        ("BACKFILL_API_TIMEOUT_SECONDS", "inf", FINITE),
        ("BACKFILL_API_TIMEOUT_SECONDS", "nan", FINITE),
        ("BACKFILL_RESYNC_SECONDS", "Infinity", FINITE),
        ("BACKFILL_FOREGROUND_SIGNAL_GRANULARITY_SECONDS", "-inf", FINITE),
        # finite, but past what a socket or thread timeout can hold (the same overflow)
        ("BACKFILL_API_TIMEOUT_SECONDS", "1e10", "at most 1000000000 seconds (about 31 years)"),
        ("BACKFILL_WATCH_TIMEOUT_SECONDS", "10000000000", "at most 1000000000 seconds (about 31 years)"),
        # PostgreSQL refuses more than INT_MAX ms: the controller stopped with "RuntimeError: cannot
        # join thread before it is started", hiding why.
        ("BACKFILL_DB_STATEMENT_TIMEOUT_SECONDS", "3000000", PG_MAX),
        ("BACKFILL_DB_LOCK_TIMEOUT_SECONDS", "3000000", PG_MAX),
        ("BACKFILL_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", "2147483.648", PG_MAX),
        # libpq waits for ever to connect at 0 ("no call waits for ever", README)
        ("BACKFILL_DB_CONNECT_TIMEOUT_SECONDS", "0", "Input should be greater than or equal to 1"),
        # smaller than one relist: every relist overflowed the spool and relisted again (a storm)
        ("BACKFILL_SPOOL_MAX_RECORDS", "30", "Input should be greater than or equal to 10000"),
        # a partition that never fills (nothing after it could be pruned), or whose bound is past a
        # bigint (every append failed; an adversarial trial)
        ("BACKFILL_EVENT_PARTITION_SIZE", "9000000000000000000", "Input should be less than or equal to 1000000000"),
    ],
)
def test_a_setting_the_controller_cannot_use_is_refused_at_start(tmp_path, name, value, problem):
    # the kubeconfig is absent: a setting that passed used to end there (exit 2, another line)
    p = _run(["controller"], tmp_path, {name: value, "BACKFILL_KUBECONFIG": str(tmp_path / "absent")})
    line = _assert_one_line_error(p, controller=True)
    assert p.returncode == 2
    assert line == f"backfill: error: settings: {name}: {problem}"


def test_the_largest_postgresql_timeouts_are_accepted():
    from backfill.settings import Settings
    from backfill.store.engine import session_options

    s = Settings(db_lock_timeout_seconds=2147483.647, db_statement_timeout_seconds=2147483.647,
                 db_idle_in_transaction_timeout_seconds=2147483.647)
    assert session_options(s)[0] == (
        "-clock_timeout=2147483647 -cstatement_timeout=2147483647 -cidle_in_transaction_session_timeout=2147483647"
    )


def test_a_postgresql_timeout_below_a_millisecond_is_one_millisecond_not_off():
    """0.0004 s rounded to 0 ms, which PostgreSQL reads as no timeout at all: the opposite of
    what was asked (found by a trial). 0 itself stays off, as documented."""
    from backfill.settings import Settings
    from backfill.store.engine import session_options

    s = Settings(db_lock_timeout_seconds=0.0004, db_statement_timeout_seconds=0.0015, db_idle_in_transaction_timeout_seconds=0)
    assert session_options(s)[0] == "-clock_timeout=1 -cstatement_timeout=2 -cidle_in_transaction_session_timeout=0"


def test_a_model_level_check_names_every_variable_it_involves(tmp_path):
    p = _run(["controller"], tmp_path, {"BACKFILL_TLS_CERT_FILE": str(tmp_path / "tls.crt")})
    assert _assert_one_line_error(p, controller=True) == (
        "backfill: error: settings: BACKFILL_TLS_CERT_FILE, BACKFILL_TLS_KEY_FILE: must be set together (both or neither)"
    )


def test_a_lease_shorter_than_three_renew_periods_is_refused(tmp_path):
    """A new user's trial: ``BACKFILL_LEASE_DURATION_SECONDS=1`` with the default renew period
    (5 s) started two replicas that both led (tests/controller/test_leader.py shows the elector's
    side). The defaults (15, 5) and the fault harness's (3, 1) pass."""
    p = _run(["controller"], tmp_path, {"BACKFILL_LEASE_DURATION_SECONDS": "1"})
    assert _assert_one_line_error(p, controller=True) == (
        "backfill: error: settings: BACKFILL_LEASE_DURATION_SECONDS, BACKFILL_LEASE_RENEW_SECONDS: the lease duration (1 s) "
        "must be at least 3 times the renew period (5 s): the leader stops acting at duration - renew after its last renew"
    )
    from backfill.settings import Settings

    Settings(lease_duration_seconds=3, lease_renew_seconds=1)
    Settings(lease_duration_seconds=0.3, lease_renew_seconds=0.1)  # 3 x 0.1 is 0.30000000000000004 (an adversarial trial)
    Settings()
    p = _run(["controller"], tmp_path, {"BACKFILL_LEASE_DURATION_SECONDS": "1", "BACKFILL_LEASE_RENEW_SECONDS": "1e-300"})
    assert _assert_one_line_error(p, controller=True).startswith("backfill: error: settings: BACKFILL_LEASE_RENEW_SECONDS: ")


def test_a_bad_flag_is_named_as_the_flag_and_every_problem_is_said(tmp_path):
    p = _run(["controller", "--metrics-address", "nowhere"], tmp_path, {"BACKFILL_API_BURST": "0"})
    assert _assert_one_line_error(p, controller=True) == (
        "backfill: error: settings: --metrics-address: 'nowhere' is not host:port with a port from 0 to 65535; "
        "BACKFILL_API_BURST: Input should be greater than or equal to 1"
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["controller", "--kubeconfig", "/nonexistent/kubeconfig"], "kubeconfig /nonexistent/kubeconfig does not exist"),
        (["controller", "--no-such-flag"], "No such option: --no-such-flag"),
        (["controller", "--namespace", "Not_A_Label"], "settings: --namespace: 'Not_A_Label' is not a namespace name: at most 63 lower-case"),
        # an adversarial trial: these started, never led and never exited (/readyz 503 for ever)
        (["controller", "--leader-elect", "--lease-name", ""], "settings: --lease-name: '' is not a Lease name: at most 253 lower-case"),
        (["controller", "--leader-elect", "--lease-name", "UPPER_bad"], "settings: --lease-name: 'UPPER_bad' is not a Lease name"),
        (["controller", "--leader-elect", "--lease-name", "a" * 254], "is not a Lease name"),
        (["controller", "--leader-elect", "--lease-namespace", ""], "settings: --lease-namespace: '' is not a namespace name"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_the_controllers_errors_are_json_log_lines(tmp_path, args, fragment):
    """`backfill controller` logs JSON; its own start-up lines and errors were plain text."""
    line = _assert_one_line_error(_run(args, tmp_path), controller=True)
    assert fragment in line, line


def test_a_kubeconfig_that_is_not_yaml_is_named_with_its_reason(tmp_path):
    """It stopped the controller with ``ScannerError: mapping values are not allowed here``,
    naming neither the file nor what was wrong, and exit status 1."""
    bad = tmp_path / "notes.md"
    bad.write_text("# Notes\nsee: this: file\n")
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(bad)], tmp_path), controller=True)
    # libyaml's wording, or PyYAML's own without libyaml; the place either way (line 2 of the file, column 10)
    assert f"kubeconfig {bad}: not valid YAML: mapping values are not allowed " in line, line
    assert line.endswith("(line 2, column 10)"), line


def test_a_kubeconfig_that_is_not_utf8_says_which_byte(tmp_path):
    """A kubeconfig saved in Latin-1 (``server: https://café``): libyaml's reader said
    ``unacceptable character #x-001: incomplete UTF-8 octet sequence``, a code point that is not
    in the file and no place."""
    bad = tmp_path / "latin1"
    bad.write_bytes("clusters: [{name: café}]\n".encode("latin-1"))
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(bad)], tmp_path), controller=True)
    assert f"kubeconfig {bad}: not valid YAML: not UTF-8 text: " in line, line
    offset = "clusters: [{name: caf".encode().__len__() + 1  # the é, counted from 1
    assert line.endswith(f"(byte {offset})"), line
    assert "#x" not in line, line


def test_the_controller_reads_KUBECONFIG_as_kubectl_does(tmp_path):
    """A trial: the README's try-out exports KUBECONFIG for kubectl and the controller; the
    controller ignored it ("no Kubernetes configuration: ... no ~/.kube/config")."""
    bad = tmp_path / "envtest.kubeconfig"
    bad.write_text("# Notes\nsee: this: file\n")
    env = {"KUBECONFIG": f"{tmp_path / 'absent'}{os.pathsep}{bad}", "HOME": str(tmp_path)}
    line = _assert_one_line_error(_run(["controller"], tmp_path, env), controller=True)
    assert f"kubeconfig {bad}: not valid YAML" in line, line  # the first file of the list that exists
    line = _assert_one_line_error(_run(["controller"], tmp_path, {"KUBECONFIG": "/nonexistent/a", "HOME": str(tmp_path)}), controller=True)
    assert "KUBECONFIG=/nonexistent/a: no such file" in line, line
    # a directory is an error, as for kubectl (a review: it was skipped silently)
    line = _assert_one_line_error(_run(["controller"], tmp_path, {"KUBECONFIG": f"{tmp_path}{os.pathsep}{bad}", "HOME": str(tmp_path)}), controller=True)
    assert f"KUBECONFIG: {tmp_path} is not a file" in line, line


@pytest.mark.parametrize(
    "text, reason",
    [
        ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n", "expected key current-context"),
        ("apiVersion: v1\nkind: Config\ncurrent-context: nope\ncontexts: []\n", "expected object with name nope in contexts list"),
        ("", "the file is empty"),
        # a trial (2026-12-02): these three said "current-context  " (two spaces), a raw Python
        # message ("'list' object has no attribute 'get'"), or nothing at all (the controller
        # started and talked to the apiserver anonymously)
        ("apiVersion: v1\nkind: Config\ncurrent-context: \"\"\ncontexts: []\n", "current-context is empty (name one of its contexts)"),
        ("- clusters\n- users\n", "not a kubeconfig: a YAML list, not a mapping of clusters, contexts and users"),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: someone, user: {token: t}}]\n",
            "context x names user admin, which is not in its users list",
        ),
        # a trial (2026-12-02): a missing exec plugin started the controller, which logged
        # "[Errno 2] No such file or directory" from the client on every call, anonymously
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: admin}}]\n"
            "users: [{name: admin, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: no-such-plugin-9f3}}}]\n",
            "user admin: exec command no-such-plugin-9f3 is not found on PATH",
        ),
    ],
    ids=["no current-context", "unknown context", "empty", "empty current-context", "a list", "unknown user", "missing exec plugin"],
)
def test_a_kubeconfig_error_names_the_file_once(tmp_path, text, reason):
    """It said ``kubeconfig F: Invalid kube-config file. Expected key current-context in F``."""
    bare = tmp_path / "kubeconfig"
    bare.write_text(text)
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(bare)], tmp_path), controller=True)
    assert f"kubeconfig {bare}: {reason}" in line and line.count(str(bare)) == 1, line


def test_an_exec_plugin_path_is_taken_from_the_kubeconfigs_directory(tmp_path):
    """A relative plugin path is run from the kubeconfig's directory (the client's working
    directory for it): missing there is an error naming the resolved path; present there and
    executable, the controller goes on past the kubeconfig (to the next problem: the database)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    kubeconfig = conf / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\n"
        "users: [{name: admin, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: ./bin/token}}}]\n"
    )
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(kubeconfig)], tmp_path), controller=True)
    assert f"kubeconfig {kubeconfig}: user admin: exec command {conf}/bin/token is not an executable file" in line, line
    (conf / "bin").mkdir()
    plugin = conf / "bin" / "token"
    plugin.write_text('#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": "t"}}\'\n')
    plugin.chmod(0o755)
    from backfill.controller.kube import _from_files

    _from_files([kubeconfig]).close()  # loads: the plugin is found and run


def test_an_exec_plugin_that_fails_is_a_one_line_error(tmp_path):
    """A trial: a plugin on PATH that fails (gke-gcloud-auth-plugin without an account) started
    the controller, which logged the plugin's error over several lines and went on without
    credentials."""
    plugin = tmp_path / "token"
    plugin.write_text("#!/bin/sh\necho 'no active account' >&2\necho 'run login first' >&2\nexit 1\n")
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\n"
        f"users: [{{name: admin, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {plugin}}}}}}}]\n"
    )
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(kubeconfig)], tmp_path), controller=True)
    assert f"kubeconfig {kubeconfig}: user admin: exec plugin failed: exec: process returned 1. no active account" in line, line


def test_a_kubeconfig_nested_too_deeply_is_a_one_line_error(tmp_path):
    """A second adversarial trial: 100,000 nested lists stopped the controller with a
    RecursionError traceback and exit status 1."""
    deep = tmp_path / "deep"
    deep.write_text("a:\n" + "".join("  " * (i + 1) + "-\n" for i in range(30_000)))
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(deep)], tmp_path), controller=True)
    assert line.startswith(f"backfill: error: kubeconfig {deep}: not "), line
    assert any(words in line for words in ("too deeply", "nesting depth", "level")), line


def test_a_directory_given_as_kubeconfig_is_named_as_such(tmp_path):
    """It said ``does not exist`` of a directory that exists."""
    line = _assert_one_line_error(_run(["controller", "--kubeconfig", str(tmp_path)], tmp_path), controller=True)
    assert f"kubeconfig {tmp_path} is not a file" in line, line


def test_db_upgrade_says_the_drivers_first_line_without_the_exception_class(tmp_path):
    """It printed ``db upgrade: (psycopg.OperationalError) connection failed: ...`` where ``runs``
    and ``db shell`` print the same failure without SQLAlchemy's class prefix."""
    line = _assert_one_line_error(_run(["db", "upgrade", "--database-url", CLOSED], tmp_path))
    assert line.startswith("backfill: error: db upgrade: connection") and "OperationalError" not in line, line


def test_db_shell_on_a_server_that_does_not_answer_is_one_line_before_psql(tmp_path):
    """The schema check is the probe (it used to connect twice); psql never starts."""
    if shutil.which("psql") is None:
        pytest.skip("db shell checks for psql first")
    p = _run(["db", "shell", "--database-url", CLOSED], tmp_path)
    line = _assert_one_line_error(p)
    assert p.returncode == 2 and line.startswith("backfill: error: database: connection failed"), line


@pytest.mark.parametrize("days", ["nan", "inf", "0", "367", "366.0000001"])
def test_days_out_of_range_says_the_range(days, capsys):
    """A new user's trial: ``--days nan`` said "Input should be less than or equal to 366"."""
    from backfill.cli import main

    assert main(["simulate", "--no-store", "--days", days]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"backfill: error: --days {float(days)!r}: give a number of days from 0.01 to 366"


def test_running_out_of_memory_is_one_line_and_exit_1(tmp_path):
    """A trial: ``simulate`` of a year of 1,000 synthetic models with ``--max-attempts 100000000``
    under a 2 GB limit ended in a MemoryError traceback."""
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (700 << 20, 700 << 20)); "
        "from backfill.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, "simulate", "--no-store", "--synthetic-models", "1000", "--days", "366", "--max-attempts", "100000000"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "backfill: error: out of memory: the input or its simulation is too large for this machine (simulate and recommend "
        "hold about 4 KB an attempt: lower --max-attempts, or narrow the input)"
    ]
