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
    ``BACKFILL_KUBECONFIG``), else the first existing file of ``$KUBECONFIG``, else the in-cluster
    service account, else ``~/.kube/config`` (controller-runtime's order).

    Raises:
        KubeConfigError: the kubeconfig is missing or invalid, or no configuration is found.
    """
    if settings.kubeconfig is not None:
        path = Path(settings.kubeconfig).expanduser()
        if not path.exists():
            raise KubeConfigError(f"kubeconfig {path} does not exist")
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {path} is not a file")
        return _from_file(path)
    env = os.environ.get("KUBECONFIG", "")
    if env:  # as kubectl and controller-runtime: before the in-cluster configuration (a trial: ignored)
        listed = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
        for path in listed:
            if path.exists():
                if not path.is_file():
                    raise KubeConfigError(f"KUBECONFIG: {path} is not a file")
                return _from_file(path)  # the first existing file of the list: kubectl merges them, this does not
        raise KubeConfigError(f"KUBECONFIG={env}: no such file")
    try:
        return _client(lambda cfg: config.load_incluster_config(client_configuration=cfg))
    except ConfigException:
        pass
    default = Path("~/.kube/config").expanduser()
    if not default.is_file():
        raise KubeConfigError("no Kubernetes configuration: not in a cluster, no --kubeconfig, no KUBECONFIG and no ~/.kube/config")
    return _from_file(default)


def _from_file(path: Path) -> client.ApiClient:
    """An ApiClient for kubeconfig file ``path``.

    Raises:
        KubeConfigError: the file does not load (not YAML, not a kubeconfig, unreadable), or the
            current user's exec plugin cannot be run or fails (the client would go on without
            credentials), with the file's name and the first line of the reason."""
    try:
        doc = yaml.safe_load(path.read_text())
        problem = _problem(doc, Path(os.path.abspath(path)).parent)  # the client's base (no symlinks followed)
        if problem is not None:
            raise KubeConfigError(f"kubeconfig {path}: {problem}")
        with _root_errors() as errors:
            api = _client(lambda cfg: config.load_kube_config(config_file=str(path), client_configuration=cfg))
        user, entry = _current_user(doc)
        if errors and isinstance(entry, dict) and "exec" in entry:
            api.close()
            first = errors[0].splitlines()[0] if errors[0] else "(no message)"
            raise KubeConfigError(f"kubeconfig {path}: user {user}: exec plugin failed: {first}")
        for text in errors:  # not ours to judge: said as the client said it
            logging.getLogger().error(text)
        return api
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except (ConfigException, ValueError, TypeError, AttributeError, OSError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: {_reason(exc, path)}") from None


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


def _current_user(doc: Any) -> tuple[Any, Any]:
    """``(name, user entry)`` of the current context's user in kubeconfig document ``doc``
    (either None when absent)."""
    if not isinstance(doc, dict):
        return None, None
    current = doc.get("current-context")
    contexts = {c.get("name"): c.get("context") for c in doc.get("contexts") or [] if isinstance(c, dict)}
    context = contexts.get(current)
    user = context.get("user") if isinstance(context, dict) else None
    entry = next((u.get("user") for u in doc.get("users") or [] if isinstance(u, dict) and u.get("name") == user), None)
    return user, entry


def _problem(doc: Any, base: Path) -> str | None:
    """What the client would take silently or report unclearly in a kubeconfig document: not a
    mapping, an empty ``current-context``, a current context whose ``user`` is not in ``users``
    (the client then connects anonymously), a user whose ``exec`` plugin cannot be run (the
    client logs ``[Errno 2]`` on every call and connects anonymously). ``base`` is the file's
    directory (a relative plugin path is run from there, as the client does). None when none
    of those; the client checks the rest."""
    if doc is None:
        return None  # an empty file: the client's own message ("the file is empty")
    if not isinstance(doc, dict):
        return f"not a kubeconfig: a YAML {type(doc).__name__}, not a mapping of clusters, contexts and users"
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


def _reason(exc: BaseException, path: Path) -> str:
    """The first line of ``exc``'s message without the client's own prefix and its repeats of
    the file's name (``Invalid kube-config file. Expected key current-context in PATH`` ->
    ``expected key current-context``; ``... name x in PATH/contexts list`` -> ``... name x in
    contexts list``; ``PATH file is empty`` -> ``the file is empty``); the exception's class
    when it says nothing."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    for prefix in ("Invalid kube-config file. ", "Invalid kube-config. ", "invalid kube-config. "):
        text = text.removeprefix(prefix)
    text = text.removesuffix(f" in {path}")
    text = text.replace(f" in {path}/", " in ").replace(f"{path} file", "the file")
    return text[:1].lower() + text[1:]
