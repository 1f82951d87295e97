"""``$KUBECONFIG`` naming several files: merged as kubectl merges them (client-go's loading rules).

The controller used to load only the first existing file of the list (a kubeconfig split in a
clusters file and a credentials file did not load), and the Python client's own merge takes the
*last* file's ``current-context``: with the same ``$KUBECONFIG`` kubectl would talk to one
cluster and the controller to another. Each expected value below is read off the files the test
writes, by kubectl's rule: the first file to set a value wins.
"""

from __future__ import annotations

import pytest

from backfill.controller.kube import KubeConfigError, api_client
from backfill.settings import Settings


def _cluster(name: str, port: int) -> str:
    return f"{{name: {name}, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}"


def _load(monkeypatch, tmp_path, *texts: str, absent: bool = False):
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"kubeconfig-{i}"
        path.write_text(text)
        paths.append(str(path))
    if absent:
        paths.insert(1, str(tmp_path / "absent"))  # kubectl skips a file that does not exist
    return _load_list(monkeypatch, tmp_path, ":".join(paths))


def _load_list(monkeypatch, tmp_path, listed: str):
    """The controller's client for ``$KUBECONFIG=listed`` (no ``BACKFILL_KUBECONFIG``, home in ``tmp_path``)."""
    monkeypatch.setenv("KUBECONFIG", listed)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("BACKFILL_KUBECONFIG", raising=False)
    return api_client(Settings())


def _target(api) -> tuple[str, str]:
    """``(server URL, Authorization header)`` the client ``api`` was configured with (closed)."""
    try:
        return api.configuration.host, api.configuration.api_key.get("BearerToken", "")
    finally:
        api.close()


def test_the_first_current_context_wins_and_entries_come_from_any_file(monkeypatch, tmp_path):
    """File 1 names the context only; file 2 defines the contexts, clusters and user and names
    another current context. kubectl uses context ``one`` (port 6441, file 1 set it first);
    the client's own merge used ``two`` (port 6442); the code before refused (context ``one``
    not in file 1's contexts)."""
    first = "apiVersion: v1\nkind: Config\ncurrent-context: one\n"
    second = (
        "apiVersion: v1\nkind: Config\ncurrent-context: two\n"
        f"clusters: [{_cluster('c1', 6441)}, {_cluster('c2', 6442)}]\n"
        "contexts: [{name: one, context: {cluster: c1, user: admin}}, {name: two, context: {cluster: c2, user: admin}}]\n"
        "users: [{name: admin, user: {token: secret-2}}]\n"
    )
    assert _target(_load(monkeypatch, tmp_path, first, second, absent=True)) == ("https://127.0.0.1:6441", "Bearer secret-2")


def test_an_entry_defined_twice_is_the_first_files(monkeypatch, tmp_path):
    """Cluster ``c`` and user ``admin`` in both files: the first file's server and token."""
    first = (
        f"apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{_cluster('c', 7001)}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: admin, user: {token: first}}]\n"
    )
    second = (
        f"apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{_cluster('c', 7002)}]\n"
        "users: [{name: admin, user: {token: second}}]\n"
    )
    api = _load(monkeypatch, tmp_path, "", first, second)  # an empty file adds nothing
    assert _target(api) == ("https://127.0.0.1:7001", "Bearer first")


def test_a_problem_of_the_merged_configuration_names_the_list(monkeypatch, tmp_path):
    """The merged current context names a user no file defines: one error naming the list
    (the client would connect anonymously)."""
    first = "apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: c, user: admin}}]\n"
    second = f"apiVersion: v1\nkind: Config\nclusters: [{_cluster('c', 7003)}]\nusers: [{{name: other, user: {{token: t}}}}]\n"
    with pytest.raises(KubeConfigError) as err:
        _load(monkeypatch, tmp_path, first, second)
    listed = f"{tmp_path}/kubeconfig-0:{tmp_path}/kubeconfig-1"
    assert str(err.value) == f"KUBECONFIG={listed}: context x names user admin, which is not in its users list"


def test_a_file_of_the_list_that_is_not_a_kubeconfig_is_named(monkeypatch, tmp_path):
    good = (
        f"apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{_cluster('c', 7004)}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: admin, user: {token: t}}]\n"
    )
    with pytest.raises(KubeConfigError) as err:
        _load(monkeypatch, tmp_path, good, "- a\n- list\n")
    assert str(err.value) == f"kubeconfig {tmp_path}/kubeconfig-1: not a kubeconfig: a YAML list, not a mapping of clusters, contexts and users"
    with pytest.raises(KubeConfigError) as err:
        _load(monkeypatch, tmp_path, "", "")
    assert str(err.value) == f"KUBECONFIG={tmp_path}/kubeconfig-0:{tmp_path}/kubeconfig-1: every file is empty"


@pytest.mark.parametrize(
    "first, reason",
    [
        ("apiVersion: v1\nkind: Config\ncurrent-context: nope\n", "expected object with name nope in contexts list"),
        ("apiVersion: v1\nkind: Config\nclusters: []\n", "expected key current-context"),
    ],
    ids=["unknown context", "no current-context"],
)
def test_the_clients_errors_about_the_merged_lists_name_the_list_not_the_first_file(monkeypatch, tmp_path, first, reason):
    """The client names the merged lists after the first file ("in F/contexts list"), which
    reads as if only that file had been looked at."""
    with pytest.raises(KubeConfigError) as err:
        _load(monkeypatch, tmp_path, first, "apiVersion: v1\nkind: Config\ncontexts: []\n")
    assert str(err.value) == f"KUBECONFIG={tmp_path}/kubeconfig-0:{tmp_path}/kubeconfig-1: {reason}"


_CREDENTIAL = '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": {"token": "%s"}}'


def _split_config(tmp_path, user: str) -> str:
    """A clusters file in ``tmp_path/a`` and a credentials file (user ``admin``: ``user``) in
    ``tmp_path/b``, listed in that order in ``$KUBECONFIG``; ``a`` also holds a decoy of every
    file the user names (``client.crt``, ``client.key``, ``plugin.sh``), as a clusters
    directory may. Returns the list."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        for name in ("client.crt", "client.key", "ca.crt"):
            (d / name).write_text(f"{d.name}/{name}\n")
        plugin = d / "plugin.sh"
        plugin.write_text("#!/bin/sh\necho '" + _CREDENTIAL % f"token-of-{d.name}" + "'\n")
        plugin.chmod(0o755)
    (a / "config").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:7005', certificate-authority: ca.crt}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\n"
    )
    (b / "config").write_text(f"apiVersion: v1\nkind: Config\nusers: [{{name: admin, user: {user}}}]\n")
    return f"{a / 'config'}:{b / 'config'}"


def test_a_users_relative_files_are_read_from_the_directory_of_its_own_file(monkeypatch, tmp_path):
    """kubectl resolves an entry's relative paths against the directory of the file that
    defines it: the cluster's CA from ``a``, the user's certificate and key from ``b``. The
    client's own merge took the user's from ``a`` (the cluster's file): with a decoy there
    the controller connected as someone else, without one it did not start."""
    api = _load_list(monkeypatch, tmp_path, _split_config(tmp_path, "{client-certificate: client.crt, client-key: client.key}"))
    try:
        c = api.configuration
        assert (open(c.ssl_ca_cert).read(), open(c.cert_file).read(), open(c.key_file).read()) == ("a/ca.crt\n", "b/client.crt\n", "b/client.key\n")
    finally:
        api.close()


def test_a_users_relative_exec_plugin_is_the_one_beside_its_own_file(monkeypatch, tmp_path):
    """``command: ./plugin.sh`` in the credentials file runs ``b/plugin.sh`` (kubectl); the
    client's merge ran ``a/plugin.sh`` (or refused when ``a`` had none)."""
    user = "{exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: ./plugin.sh}}"
    api = _load_list(monkeypatch, tmp_path, _split_config(tmp_path, user))
    assert _target(api) == ("https://127.0.0.1:7005", "Bearer token-of-b")


def test_a_file_that_names_an_entry_twice_is_refused_as_kubectl_refuses_it(monkeypatch, tmp_path):
    """A trial: two clusters named ``c`` in one file loaded with the first one's server, where
    kubectl refuses the file (client-go: ``duplicate name "c" in list``). Now one error naming
    the file and the list, alone or in ``$KUBECONFIG``; one name in two *files* stays the
    first file's (test above)."""
    twice = (
        f"apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{_cluster('c', 7101)}, {_cluster('c', 7102)}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: admin, user: {token: t}}]\n"
    )
    path = tmp_path / "twice"
    path.write_text(twice)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError) as err:
        api_client(Settings(kubeconfig=str(path)))
    assert str(err.value) == f"kubeconfig {path}: clusters has two entries named c (kubectl refuses the file too)"
    with pytest.raises(KubeConfigError) as err:
        _load(monkeypatch, tmp_path, "apiVersion: v1\nkind: Config\n", twice)
    assert str(err.value) == f"kubeconfig {tmp_path}/kubeconfig-1: clusters has two entries named c (kubectl refuses the file too)"


def test_dev_null_in_the_list_is_an_empty_file(monkeypatch, tmp_path):
    """A trial: ``KUBECONFIG=/dev/null:real`` (a way to switch a user's config off) was "not a
    file"; kubectl reads /dev/null as an empty file. A directory is still an error
    (``tests/robustness/test_cli_errors.py``)."""
    good = tmp_path / "good"
    good.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{_cluster('c', 7201)}]\n"
        "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: admin, user: {token: dn}}]\n"
    )
    assert _target(_load_list(monkeypatch, tmp_path, f"/dev/null:{good}")) == ("https://127.0.0.1:7201", "Bearer dn")
    with pytest.raises(KubeConfigError) as err:
        _load_list(monkeypatch, tmp_path, "/dev/null")
    assert str(err.value) == "kubeconfig /dev/null: the file is empty"


_ONE_USER = "contexts: [{name: x, context: {cluster: c, user: admin}}]\nusers: [{name: admin, user: {token: t}}]\n"


@pytest.mark.parametrize(
    "lists, problem",
    [
        # a name the client could not hash crashed the controller (TypeError, exit 1)
        (f"clusters: [{_cluster('c', 7301)}, {{name: [x], cluster: {{server: 'https://h'}}}}]\n" + _ONE_USER,
         "clusters: an entry's name is a YAML list, not a string"),
        (f"clusters: [{_cluster('c', 7301)}]\ncontexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\nusers: 5\n",
         "users is a YAML int, not a list"),
        (f"clusters: [{_cluster('c', 7301)}]\ncontexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\nusers: abc\n",
         "users is a YAML str, not a list"),
        (f"clusters: [{_cluster('c', 7301)}, 7]\n" + _ONE_USER, "clusters: an entry is a YAML int, not a mapping"),
        # every list client-go converts by name, not only the three
        (f"clusters: [{_cluster('c', 7301)}]\n" + _ONE_USER + "extensions: [{name: e, extension: {}}, {name: e, extension: {}}]\n",
         "extensions has two entries named e (kubectl refuses the file too)"),
        ("clusters: [{name: c, cluster: {server: 'https://h', extensions: [{name: e, extension: {}}, {name: e, extension: {}}]}}]\n" + _ONE_USER,
         "clusters c: extensions has two entries named e (kubectl refuses the file too)"),
        (f"clusters: [{_cluster('c', 7301)}, {{cluster: {{server: 'https://h'}}}}, {{name: null, cluster: {{server: 'https://i'}}}}]\n" + _ONE_USER,
         'clusters has two entries named "" (kubectl refuses the file too)'),
        # a field of another type than client-go's (a second adversarial trial): a quoted "false"
        # turned TLS verification off; a number for the server was a raw AttributeError
        ("clusters: [{name: c, cluster: {server: 'https://h', insecure-skip-tls-verify: 'false'}}]\n" + _ONE_USER,
         "clusters c: insecure-skip-tls-verify is a YAML str, not true or false (kubectl refuses the file too)"),
        ("clusters: [{name: c, cluster: {server: 8080}}]\n" + _ONE_USER,
         "clusters c: server is a YAML int, not a string (kubectl refuses the file too)"),
        # the value of a credential is never said
        (f"clusters: [{_cluster('c', 7301)}]\ncontexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\n"
         "users: [{name: admin, user: {token: 918273645}}]\n",
         "users admin: token is a YAML int, not a string (kubectl refuses the file too)"),
        (f"clusters: [{_cluster('c', 7301)}]\ncontexts: [{{name: x, context: {{cluster: [c], user: admin}}}}]\n"
         "users: [{name: admin, user: {token: t}}]\n",
         "contexts x: cluster is a YAML list, not a string (kubectl refuses the file too)"),
        (f"clusters: [{{name: c, cluster: 'https://h'}}]\n" + _ONE_USER,
         "clusters c: cluster is a YAML str, not a mapping"),
    ],
)
def test_a_named_list_kubectl_cannot_read_is_one_error(monkeypatch, tmp_path, lists, problem):
    """An adversarial trial of the duplicate check: each of these crashed with a TypeError or
    was let through, where kubectl refuses the file. One error naming the file, alone and in
    ``$KUBECONFIG``."""
    path = tmp_path / "bad"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n" + lists)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError) as err:
        api_client(Settings(kubeconfig=str(path)))
    assert str(err.value) == f"kubeconfig {path}: {problem}"
    with pytest.raises(KubeConfigError) as err:
        _load_list(monkeypatch, tmp_path, f"{tmp_path / 'absent'}:{path}:/dev/null")
    assert str(err.value) == f"kubeconfig {path}: {problem}"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_no_device_but_the_null_device_is_read(monkeypatch, tmp_path, device):
    """An adversarial trial: every character device was read as a file, so ``--kubeconfig
    /dev/zero`` grew to 3.8 GB and died of MemoryError. Only the null device (or a link to
    it) reads as empty."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError) as err:
        api_client(Settings(kubeconfig=device))
    assert str(err.value) == f"kubeconfig {device} is not a file"
    with pytest.raises(KubeConfigError) as err:
        _load_list(monkeypatch, tmp_path, f"{device}:/dev/null")
    assert str(err.value) == f"KUBECONFIG: {device} is not a file"
    link = tmp_path / "off"
    link.symlink_to("/dev/null")
    with pytest.raises(KubeConfigError) as err:
        api_client(Settings(kubeconfig=str(link)))
    assert str(err.value) == f"kubeconfig {link}: the file is empty"


def test_kubeconfig_of_empty_files_in_a_pod_is_the_in_cluster_configuration(monkeypatch, tmp_path):
    """An adversarial trial: ``KUBECONFIG=/dev/null`` in a Pod was "the file is empty", where
    client-go falls back to the in-cluster service account for an empty configuration. Out of a
    cluster it is still that error (test above)."""
    import backfill.controller.kube as kube

    def in_cluster(client_configuration):
        client_configuration.host = "https://10.96.0.1:443"

    monkeypatch.setattr(kube.config, "load_incluster_config", in_cluster)
    empty = tmp_path / "empty"
    empty.write_text("")
    assert _target(_load_list(monkeypatch, tmp_path, f"/dev/null:{empty}"))[0] == "https://10.96.0.1:443"


def test_kubeconfig_defining_nothing_in_a_pod_is_the_in_cluster_configuration(monkeypatch, tmp_path):
    """A second adversarial trial: client-go falls back to the in-cluster configuration for any
    configuration without clusters, contexts and users (``ErrEmptyConfig``), not only for empty
    files: ``KUBECONFIG`` naming a file of ``{}`` was "expected key current-context" in a Pod."""
    import backfill.controller.kube as kube

    def in_cluster(client_configuration):
        client_configuration.host = "https://10.96.0.1:443"

    bare = tmp_path / "bare"
    bare.write_text("apiVersion: v1\nkind: Config\npreferences: {}\n")
    with pytest.raises(KubeConfigError) as err:  # out of a cluster: the client's error
        _load_list(monkeypatch, tmp_path, str(bare))
    assert str(err.value) == f"kubeconfig {bare}: expected key current-context"
    monkeypatch.setattr(kube.config, "load_incluster_config", in_cluster)
    assert _target(_load_list(monkeypatch, tmp_path, f"{bare}:/dev/null"))[0] == "https://10.96.0.1:443"


def test_a_utf16_kubeconfig_with_a_byte_order_mark_loads_as_kubectl_loads_it(monkeypatch, tmp_path):
    """A second adversarial trial: a kubeconfig saved as UTF-16 (PowerShell's ``>``), which kubectl
    reads, was refused with a UnicodeDecodeError's first line."""
    path = tmp_path / "utf16"
    path.write_bytes(("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                      f"clusters: [{_cluster('c', 7311)}]\n" + _ONE_USER).encode("utf-16"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _target(api_client(Settings(kubeconfig=str(path)))) == ("https://127.0.0.1:7311", "Bearer t")
