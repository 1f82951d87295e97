"""The Kubernetes ApiClient from settings: kubeconfig path, else in-cluster, else ~/.kube/config."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from backfill.settings import Settings


class KubeConfigError(Exception):
    """No usable Kubernetes configuration (one-line message)."""


#: HTTP connections kept to the apiserver: the watches (6), the job-deletes and job-creates pools
#: (16 each: actor.DELETE_WORKERS, actor.CREATE_WORKERS), the status writer, the Events thread, the
#: reconcile loop and the Lease, with room. A smaller pool discards connections under a burst and
#: pays a TLS handshake per cancel.
CONNECTION_POOL_SIZE = 48


def _client(load: Any) -> client.ApiClient:
    cfg = client.Configuration()
    load(cfg)
    cfg.connection_pool_maxsize = CONNECTION_POOL_SIZE
    # No retries inside urllib3: a retry there would resend a mutation below the leadership
    # fence (controller/fence.py). Every caller retries through its own, fenced path (watches
    # relist, deletes resend once, creates and statuses are re-issued by the next decide).
    cfg.retries = False
    return client.ApiClient(cfg)


def api_client(settings: Settings) -> client.ApiClient:
    """An ApiClient for the configured cluster: ``settings.kubeconfig`` (``--kubeconfig``,
    ``BACKFILL_KUBECONFIG``), else the files ``$KUBECONFIG`` lists, merged as kubectl merges
    them (:func:`_merged`; when they define no cluster, context or user, e.g. ``/dev/null`` or
    ``{}``, the in-cluster service account if there is one, as client-go), else the in-cluster service
    account, else ``~/.kube/config`` (controller-runtime's order).

    Raises:
        KubeConfigError: the kubeconfig is missing or invalid, or no configuration is found.
    """
    if settings.kubeconfig is not None:
        path = Path(settings.kubeconfig).expanduser()
        if not path.exists():
            raise KubeConfigError(f"kubeconfig {path} does not exist")
        if not (path.is_file() or _is_devnull(path)):  # /dev/null: "the file is empty", as kubectl
            raise KubeConfigError(f"kubeconfig {path} is not a file")
        return _from_files([path])
    env = os.environ.get("KUBECONFIG", "")
    if env:  # as kubectl and controller-runtime: before the in-cluster configuration (a trial: ignored)
        listed = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
        for path in listed:  # /dev/null reads as an empty file, as kubectl reads it (a trial: "not a file")
            if path.exists() and not (path.is_file() or _is_devnull(path)):
                raise KubeConfigError(f"KUBECONFIG: {path} is not a file")
        existing = list(dict.fromkeys(path for path in listed if path.exists()))  # kubectl skips missing files
        if not existing:
            raise KubeConfigError(f"KUBECONFIG={env}: no such file")
        return _from_files(existing, in_cluster_if_empty=True)
    try:
        return _client(lambda cfg: config.load_incluster_config(client_configuration=cfg))
    except ConfigException:
        pass
    default = Path("~/.kube/config").expanduser()
    if not default.is_file():
        raise KubeConfigError("no Kubernetes configuration: not in a cluster, no --kubeconfig, no KUBECONFIG and no ~/.kube/config")
    return _from_files([default])


def _is_devnull(path: Path) -> bool:
    """``path`` is the null device (``os.devnull``, or a link to it): read as an empty file.
    No other device: ``/dev/zero`` or ``/dev/urandom`` would be read until memory ran out
    (a trial: 3.8 GB, then MemoryError)."""
    try:
        return path.samefile(os.devnull)
    except OSError:
        return False


#: The file-path fields of kubeconfig entries, per list (client-go ``clientcmd`` ``ResolvePaths``):
#: relative to the directory of the file that defines the entry.
_PATH_FIELDS = {"clusters": ("cluster", ("certificate-authority",)), "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


def _resolved(item: str, entry: dict[str, Any], base: Path) -> dict[str, Any]:
    """Entry ``entry`` of list ``item`` with its relative file paths made absolute against
    ``base`` (the directory of the file that defines it), as kubectl resolves them: the
    certificate authority of a cluster; the client certificate, key and token file of a user,
    and its exec command when it names a path (has a slash; a bare name is looked up on
    ``PATH``). Other fields are left as they are; ``entry`` is not changed."""
    key, fields = _PATH_FIELDS.get(item, ("", ()))
    body = entry.get(key)
    if not isinstance(body, dict):
        return entry
    body = dict(body)
    for field in fields:
        if isinstance(body.get(field), str) and body[field] and not os.path.isabs(body[field]):
            body[field] = str(base / body[field])
    plugin = body.get("exec")
    if item == "users" and isinstance(plugin, dict) and isinstance(plugin.get("command"), str):
        command = plugin["command"]
        if "/" in command and not os.path.isabs(command):
            body["exec"] = {**plugin, "command": str(base / command)}
    return {**entry, key: body}


def _merged(docs: list[tuple[Path, Any]]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfig documents (client-go ``clientcmd`` loading rules,
    the order of ``$KUBECONFIG``): the first file to set a value wins, never a later one: the
    first ``current-context`` set (non-empty) is the one used, and the first entry of a name
    in ``clusters``, ``contexts`` and ``users`` is kept. Relative file paths of an entry are
    resolved against the directory of the file that defines it (:func:`_resolved`), so a user
    from a credentials file in another directory gets its own certificate, key, token file and
    exec plugin. (The Python client's own merge takes the *last* file's ``current-context``
    and resolves a user's paths against the directory of the cluster's file: with a list
    kubectl used one cluster, or one identity, and the client another.) ``docs``: ``(path,
    parsed YAML mapping)`` in order, empty files left out.

    Returns the merged document."""
    out: dict[str, Any] = {"clusters": [], "contexts": [], "users": []}
    for path, doc in docs:
        if not out.get("current-context") and doc.get("current-context"):
            out["current-context"] = doc["current-context"]
        elif "current-context" not in out and "current-context" in doc:
            out["current-context"] = doc["current-context"]  # set but empty: said as such if nothing later sets it
        base = Path(os.path.abspath(path)).parent
        for item in ("clusters", "contexts", "users"):
            names = {e.get("name") for e in out[item]}
            for entry in doc.get(item) or []:
                if isinstance(entry, dict) and entry.get("name") not in names:
                    out[item].append(_resolved(item, entry, base))
                    names.add(entry.get("name"))
    return out


def _from_files(paths: list[Path], in_cluster_if_empty: bool = False) -> client.ApiClient:
    """An ApiClient for kubeconfig file ``paths`` (one, or the files ``$KUBECONFIG`` lists that
    exist, merged as kubectl merges them: :func:`_merged`). With ``in_cluster_if_empty``, files
    that define no cluster, context or user (empty, ``/dev/null``, ``{}``) give the in-cluster
    configuration when there is one (client-go's ``ErrEmptyConfig`` fallback; a file given
    by ``--kubeconfig`` is meant, and its emptiness is an error). Each file is read and parsed once
    and the client loads the merged document: the client's own file loader parsed a file again
    and looked every entry up in a list (a trial: 100,000 clusters in one file did not load in
    minutes), and read only UTF-8.

    Raises:
        KubeConfigError: a file does not load (not YAML, not a kubeconfig, unreadable), or the
            current user's exec plugin cannot be run or fails (the client would go on without
            credentials), with the file's name (``KUBECONFIG=a:b`` for a problem of the merged
            configuration) and the first line of the reason."""
    label = f"kubeconfig {paths[0]}" if len(paths) == 1 else "KUBECONFIG=" + os.pathsep.join(map(str, paths))
    docs: list[tuple[Path, Any]] = []
    for path in paths:
        doc = _read(path)
        if doc is None:
            continue  # an empty file adds nothing (kubectl)
        problem = _problem(doc, path.parent) if not isinstance(doc, dict) else _shape_problem(doc)
        if problem is not None:
            raise KubeConfigError(f"kubeconfig {path}: {problem}")
        docs.append((path, doc))
    if in_cluster_if_empty and not any(doc.get(item) for _, doc in docs for item in _BODIES):
        try:  # e.g. KUBECONFIG=/dev/null in a Pod
            return _client(lambda cfg: config.load_incluster_config(client_configuration=cfg))
        except ConfigException:
            pass  # not in a cluster: the empty configuration is the error
    if not docs:
        raise KubeConfigError(f"{label}: {'the file is' if len(paths) == 1 else 'every file is'} empty")
    doc = _merged(docs)
    # Every relative path is absolute now, and the client runs an exec plugin from this
    # process's directory when it loads a document (as kubectl does): Path.cwd() is the base.
    return _load(doc, Path.cwd(), label, lambda cfg: config.load_kube_config_from_dict(
        doc, context=doc.get("current-context") or None, client_configuration=cfg, persist_config=False
    ))


#: PyYAML's safe loader on libyaml when the wheel has it (3x faster: a 100,000-cluster file in
#: 8 s, not 25 s), else the pure-Python one; both read the same YAML.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(path: Path) -> Any:
    """Kubeconfig file ``path`` parsed (YAML in UTF-8, or UTF-16 with a byte order mark, as
    kubectl reads it; None for an empty file).

    Raises:
        KubeConfigError: not YAML, nested too deeply to parse, or unreadable (the file's name
            and the first line of why; a trial: 100,000 nested lists stopped the controller with
            a RecursionError traceback)."""
    try:
        raw = path.read_bytes()
        return yaml.load(raw, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path}: not valid YAML: {_yaml_reason(exc, raw)}") from None
    except RecursionError:
        raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig: nested too deeply to read") from None
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {path}: {_reason(exc, path)}") from None


def _yaml_reason(exc: yaml.YAMLError, raw: bytes) -> str:
    """What is wrong with YAML document ``raw`` (the file's bytes) and where, in one line:
    ``mapping values are not allowed in this context (line 2, column 10)``, or ``not UTF-8
    text: invalid continuation byte (byte 22)`` (lines, columns and bytes from 1). Python's
    decoder names the first bad byte: libyaml's reader named a later one, with a code point
    (``#x-001``) that is not in the file."""
    if isinstance(exc, yaml.reader.ReaderError) and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:  # kubectl reads UTF-8, or UTF-16 with a BOM
            return f"not UTF-8 text: {bad.reason} (byte {bad.start + 1})"
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem:
        return str(exc).splitlines()[0]
    return problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else "")


def _load(doc: Any, base: Path, label: str, load: Any) -> client.ApiClient:
    """Check kubeconfig document ``doc`` (:func:`_problem`; ``base``: where a relative exec
    plugin is run from), then build the client with ``load(configuration)``; errors are
    ``KubeConfigError("{label}: reason")``."""
    problem = _problem(doc, base)
    if problem is not None:
        raise KubeConfigError(f"{label}: {problem}")
    try:
        with _root_errors() as errors:
            api = _client(load)
    except (ConfigException, ValueError, TypeError, AttributeError, KeyError, OSError) as exc:
        raise KubeConfigError(f"{label}: {_reason(exc, None)}") from None
    user, entry = _current_user(doc)
    if errors and isinstance(entry, dict) and "exec" in entry:
        api.close()
        first = errors[0].splitlines()[0] if errors[0] else "(no message)"
        raise KubeConfigError(f"{label}: user {user}: exec plugin failed: {first}")
    for text in errors:  # not ours to judge: said as the client said it
        logging.getLogger().error(text)
    return api


@contextmanager
def _root_errors() -> Iterator[list[str]]:
    """Collect (their messages) and hold back the ERROR records logged on the root logger meanwhile: the
    client's kubeconfig loader reports a failed exec plugin that way (``logging.error``) and goes
    on without credentials, so the caller can make it a :class:`KubeConfigError` instead."""
    caught: list[str] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            caught.append(record.getMessage())
            return False
        return True

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield caught
    finally:
        root.removeFilter(keep)


def _current_context(doc: Any) -> dict[str, Any]:
    """The current context's ``context`` mapping in kubeconfig document ``doc`` ({} when absent)."""
    if not isinstance(doc, dict):
        return {}
    current = doc.get("current-context")
    context = next((c.get("context") for c in doc.get("contexts") or [] if isinstance(c, dict) and c.get("name") == current), None)
    return context if isinstance(context, dict) else {}


def _current_user(doc: Any) -> tuple[Any, Any]:
    """``(name, user entry)`` of the current context's user in kubeconfig document ``doc``
    (either None when absent)."""
    if not isinstance(doc, dict):
        return None, None
    user = _current_context(doc).get("user")
    entry = next((u.get("user") for u in doc.get("users") or [] if isinstance(u, dict) and u.get("name") == user), None)
    return user, entry


def _problem(doc: Any, base: Path) -> str | None:
    """What the client would take silently or report unclearly in a kubeconfig document: not a
    mapping, a named list or a field kubectl cannot read (:func:`_shape_problem`), an empty ``current-context``, a current context whose ``user`` is not in ``users``
    (the client then connects anonymously), a user whose ``exec`` plugin cannot be run (the
    client logs ``[Errno 2]`` on every call and connects anonymously). ``base`` is the file's
    directory (a relative plugin path is run from there, as the client does). None when none
    of those; the client checks the rest."""
    if doc is None:
        return None  # an empty file: the client's own message ("the file is empty")
    if not isinstance(doc, dict):
        return f"not a kubeconfig: a YAML {type(doc).__name__}, not a mapping of clusters, contexts and users"
    shape = _shape_problem(doc)
    if shape is not None:
        return shape
    current = doc.get("current-context")
    if current == "":
        return "current-context is empty (name one of its contexts)"
    user, entry = _current_user(doc)
    users = {u.get("name") for u in doc.get("users") or [] if isinstance(u, dict)}
    if user and user not in users:
        return f"context {current} names user {user}, which is not in its users list"
    plugin = entry.get("exec") if isinstance(entry, dict) else None
    if isinstance(plugin, dict):
        return _exec_problem(user, plugin.get("command"), base)
    return None


#: kubeconfig entry lists -> the key of an entry's body (client-go's Named* types).
_BODIES = {"clusters": "cluster", "contexts": "context", "users": "user"}


def _named_lists(doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` of every list of named entries in kubeconfig document ``doc`` that
    client-go converts to a map by name: ``clusters``, ``contexts``, ``users`` and
    ``extensions``, the ``extensions`` of each cluster, context and user, and of
    ``preferences``. A value is as found (it may be no list at all)."""
    for item in ("clusters", "contexts", "users", "extensions"):
        value = doc.get(item)
        yield item, value
        if item in _BODIES and isinstance(value, list):
            for entry in value:
                body = entry.get(_BODIES[item]) if isinstance(entry, dict) else None
                if isinstance(body, dict) and body.get("extensions") is not None:
                    yield f"{item} {entry.get('name')}: extensions", body["extensions"]
    preferences = doc.get("preferences")
    if isinstance(preferences, dict) and preferences.get("extensions") is not None:
        yield "preferences: extensions", preferences["extensions"]


def _names_problem(doc: dict[str, Any]) -> str | None:
    """What kubectl would refuse in the named lists of kubeconfig document ``doc``
    (:func:`_named_lists`), said as a problem, or None: a list that is not a list, an entry
    that is not a mapping, a name that is not a string (a missing or null name is ``""``, as
    in Go), or two entries of one name (client-go's conversion: ``duplicate name "x" in
    list``). The Python client took the first of two entries silently (a file kubectl would
    not use worked here), and crashed on a name it could not hash (a trial: ``name: [x]``)."""
    for where, entries in _named_lists(doc):
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"{where} is a YAML {type(entries).__name__}, not a list"
        seen: set[str] = set()
        for entry in entries:
            if not isinstance(entry, dict):
                return f"{where}: an entry is a YAML {type(entry).__name__}, not a mapping"
            name = entry.get("name")
            name = "" if name is None else name
            if not isinstance(name, str):
                return f"{where}: an entry's name is a YAML {type(name).__name__}, not a string"
            if name in seen:
                shown = name or '""'
                return f"{where} has two entries named {shown} (kubectl refuses the file too)"
            seen.add(name)
    return None


#: The typed fields of kubeconfig entries that the client reads (client-go ``clientcmd/api/v1``
#: types: Cluster, AuthInfo, Context), per list: field -> (Python type, what kubectl expects).
#: kubectl refuses a file where one is of another type; the Python client took it as it came:
#: ``insecure-skip-tls-verify: "false"`` (a string) turned TLS verification *off*, and
#: ``server: 8080`` failed with ``'int' object has no attribute 'rstrip'`` (a trial).
_FIELD_TYPES: dict[str, dict[str, tuple[type, str]]] = {
    "clusters": {
        "insecure-skip-tls-verify": (bool, "true or false"),
        "disable-compression": (bool, "true or false"),
        **{field: (str, "a string") for field in ("server", "tls-server-name", "certificate-authority", "certificate-authority-data", "proxy-url")},
    },
    "users": {
        **{field: (str, "a string") for field in (
            "client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "tokenFile",
            "as", "as-uid", "username", "password",
        )},
        "as-groups": (list, "a list"),
        "as-user-extra": (dict, "a mapping"),
        "auth-provider": (dict, "a mapping"),
        "exec": (dict, "a mapping"),
    },
    "contexts": {field: (str, "a string") for field in ("cluster", "user", "namespace")},
}


def _fields_problem(doc: dict[str, Any]) -> str | None:
    """A field of kubeconfig document ``doc`` (``current-context``, or one of an entry's body:
    :data:`_FIELD_TYPES`) whose YAML type kubectl would refuse, said as a problem, or None. A
    null field is absent, as in Go. ``doc``'s named lists are lists of mappings
    (:func:`_names_problem` first)."""
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        return f"current-context is a YAML {type(current).__name__}, not a string"
    for item, fields in _FIELD_TYPES.items():
        for entry in doc.get(item) or []:
            body = entry.get(_BODIES[item])
            if body is None:
                continue
            if not isinstance(body, dict):
                return f"{item} {entry.get('name')}: {_BODIES[item]} is a YAML {type(body).__name__}, not a mapping"
            for field, (kind, expected) in fields.items():
                value = body.get(field)
                if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
                    # the value is not said: it may be a credential
                    return f"{item} {entry.get('name')}: {field} is a YAML {type(value).__name__}, not {expected} (kubectl refuses the file too)"
    return None


def _shape_problem(doc: dict[str, Any]) -> str | None:
    """What kubectl would refuse in the shape of kubeconfig document ``doc`` (a mapping):
    its named lists (:func:`_names_problem`), then its typed fields (:func:`_fields_problem`);
    None when neither."""
    return _names_problem(doc) or _fields_problem(doc)


def _exec_problem(user: str, command: Any, base: Path) -> str | None:
    """Why user ``user``'s exec plugin ``command`` cannot be run, or None: a name without a
    slash is looked up on ``PATH``; a path is taken from ``base`` when relative (the client
    runs the plugin with the kubeconfig's directory as its working directory)."""
    if not isinstance(command, str) or not command:
        return f"user {user}: exec has no command"
    if "/" not in command:
        if shutil.which(command) is None:
            return f"user {user}: exec command {command} is not found on PATH"
        return None
    path = base / command  # an absolute command stays itself
    if not path.is_file() or not os.access(path, os.X_OK):
        return f"user {user}: exec command {path} is not an executable file"
    return None


def _reason(exc: BaseException, path: Path | None) -> str:
    """The first line of ``exc``'s message without the client's own prefix and its repeats of
    the file's name (``Invalid kube-config file. Expected key current-context in PATH`` ->
    ``expected key current-context``; ``... name x in PATH/contexts list`` -> ``... name x in
    contexts list``; ``PATH file is empty`` -> ``the file is empty``); the exception's class
    when it says nothing."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    for prefix in ("Invalid kube-config file. ", "Invalid kube-config. ", "invalid kube-config. "):
        text = text.removeprefix(prefix)
    text = text.replace(" in kube-config/", " in ").removesuffix(" in kube-config")  # a loaded document's name
    if path is not None:
        text = text.removesuffix(f" in {path}")
        text = text.replace(f" in {path}/", " in ").replace(f"{path} file", "the file")
    return text[:1].lower() + text[1:]
