"""The watched kinds, each described once (Kueue registers each integration once).

A :class:`Kind` says everything the controller needs about one watched resource: how to list
and watch it (namespaced and cluster-wide, and whether a namespaced controller still watches it
in every namespace: the node-level signals), how an object becomes events (a
:class:`~backfill.controller.translate.Translator` method), which objects the folded log
believes exist (for a relist to notice what vanished while nobody watched), and the "gone" event
for such an object. Adding a watched kind is one entry in :data:`KINDS` (plus its translation).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable

from kubernetes import client

from backfill.core import events as ev
from backfill.core.jobtemplate import backfill_of_job, labelled_backfill
from backfill.core.state import World, is_orphan_key

from .translate import Pair, Translator, vanished

GROUP, VERSION = "ai.flexinfer", "v1alpha2"

Known = tuple[str, str, str]  # (namespace, name, uid)


@dataclass(frozen=True)
class Kind:
    """One watched resource.

    Attributes:
        name: short name used in logs and ``/readyz`` (``model``, ``job``, ``gpulease``, ...;
            ``gpulease``, not ``lease``, which read as the leader-election Lease: a new user).
        plural: the API resource name (``models``, ``jobs``, ...).
        custom: True for an ``ai.flexinfer/v1alpha2`` custom resource, False for ``batch/v1``.
        translate: the :class:`Translator` method ``(type, obj, now) -> [(event, key)]``.
        known: ``world -> [(namespace, name, uid)]`` the log believes exist.
        vanish: ``(namespace, name, uid, now, list_resource_version) -> (event, key)``, the event
            for a known object a list did not return.
        list_name: the name a listed object is matched under against ``known``.
        lists_after: kinds whose first list must be in the log before this kind's first list
            (bounded wait, :class:`~backfill.controller.watchers.Watcher`). Jobs list after the
            foreground signals: after a restart, a Job deleted while nobody watched is folded
            *after* the demand that preempted it, so its run ends ``preempted``, not
            ``cancelled`` (the projector judges a vanished Job by the demand it has seen); and
            after the declarations: on a fresh log, a Job another log left is folded with its
            ModelBackfill known (unexplained if live, its name taken if finished), not ignored.
        all_namespaces: a node-level signal, listed and watched across every namespace even by a
            namespaced controller (``settings.namespace``): a GamingSession is gaming intent for
            its node and a GPULease blocks its node and shared group whichever namespace holds
            them (cluster-contract), and the projector matches them by node/group only. The
            others (declarations, templates, Models, Jobs) stay in the controller's namespace.
    """

    name: str
    plural: str
    custom: bool
    translate: Callable[[Translator], Callable[[str, dict, datetime], list[Pair]]]
    known: Callable[[World], Iterable[Known]]
    vanish: Callable[[str, str, str, datetime, str], Pair]
    list_name: Callable[[dict], str] = lambda obj: (obj.get("metadata") or {}).get("name", "")
    lists_after: tuple[str, ...] = ()
    all_namespaces: bool = False

    def watch_namespace(self, namespace: str | None) -> str | None:
        """The namespace a controller scoped to ``namespace`` (None: every namespace) lists and
        watches this kind in: None (every namespace) for an :attr:`all_namespaces` kind."""
        return None if self.all_namespaces else namespace

    def list_functions(self, api: Any) -> tuple[Callable[..., Any], Callable[..., Any], tuple, dict]:
        """``(namespaced, cluster_wide, leading_args, kwargs)`` of the kubernetes client for this kind.

        A namespaced call takes ``*leading_args, namespace, **kwargs``; a cluster-wide one
        ``*leading_args, **kwargs`` (custom objects: ``group, version, [namespace,] plural``)."""
        kwargs: dict[str, Any] = {}
        if self.custom:
            co = client.CustomObjectsApi(api)

            def namespaced(ns: str, **kw: Any) -> Any:
                return co.list_namespaced_custom_object(GROUP, VERSION, ns, self.plural, **kw)

            def cluster(**kw: Any) -> Any:
                return co.list_cluster_custom_object(GROUP, VERSION, self.plural, **kw)

            return namespaced, cluster, (), kwargs
        batch = client.BatchV1Api(api)
        if self.plural == "cronjobs":
            return batch.list_namespaced_cron_job, batch.list_cron_job_for_all_namespaces, (), kwargs
        return batch.list_namespaced_job, batch.list_job_for_all_namespaces, (), kwargs


def _vanish(kind: str) -> Callable[[str, str, str, datetime, str], Pair]:
    return lambda ns, name, uid, now, rv: vanished(kind, ns, name, uid, now, rv)


def _job_vanished(ns: str, name: str, uid: str, now: datetime, rv: str) -> Pair:
    backfill, job = name.split("/", 1)
    e = ev.JobDeleted(at=now, namespace=ns, backfill=backfill, name=job, uid=uid)
    return e, e.natural_key()


def _known_jobs(world: World) -> list[Known]:
    """Live attempts whose Job was observed, suspended ones (their Job still exists, issue 11),
    an ended attempt's finished Job status still names (a deletion while unwatched clears the
    name: :attr:`backfill.core.state.Attempt.job_gone`), a deleted declaration's live Job
    (:func:`backfill.core.state.orphan_key`) and the unexplained Jobs being deleted, as
    (namespace, "backfill/job", job uid)."""
    out = [
        (ns, name if is_orphan_key((ns, name)) else f"{name}/{a.job_name}", a.job_uid)  # an orphan's key names both
        for (ns, name), a in world.live.items()
        if a.created_at is not None or a.started_at is not None
    ]
    for (ns, name), b in world.backfills.items():  # a relist is rare: a scan is fine
        a = b.attempt
        if a is not None and (a.suspended or (a.kept_job and a.job_uid)):
            out.append((ns, f"{name}/{a.job_name}", a.job_uid))
        out.extend((ns, f"{name}/{job}", uid) for job, uid in b.unexplained)
    return out


def _job_list_name(obj: dict) -> str:
    """The name a listed Job is matched under against :func:`_known_jobs` ("backfill/job")."""
    m = obj.get("metadata") or {}
    # the ownerReference (the full name), else the label (ours with the ownerReference removed)
    return f"{backfill_of_job(m) or labelled_backfill(m) or ''}/{m.get('name', '')}"


KINDS: tuple[Kind, ...] = (
    Kind(
        "cronjob", "cronjobs", False, lambda t: t.cronjob,
        lambda w: [(ns, n, "") for (ns, n), t in w.templates.items() if t.job_template is not None], _vanish("cronjob"),
    ),
    Kind(
        "model", "models", True, lambda t: t.model,
        lambda w: [(ns, n, "") for (ns, n), m in w.models.items() if m.exists], _vanish("model"),
    ),
    Kind(
        "gamingsession", "gamingsessions", True, lambda t: t.gaming_session,
        lambda w: [(ns, n, "") for (ns, n) in w.gaming], _vanish("gaming"), all_namespaces=True,
    ),
    Kind(
        "gpulease", "gpuleases", True, lambda t: t.gpu_lease,
        lambda w: [(ns, n, "") for (ns, n) in w.leases], _vanish("lease"), all_namespaces=True,
    ),
    Kind(
        "backfill", "modelbackfills", True, lambda t: t.backfill,
        lambda w: [(b.namespace, b.name, b.uid) for b in w.backfills.values() if not b.gone], _vanish("backfill"),
    ),
    Kind(
        "job", "jobs", False, lambda t: t.job, _known_jobs, _job_vanished, _job_list_name,
        lists_after=("model", "gamingsession", "gpulease", "backfill"),
    ),
)
"""Every watched kind, in start order (templates and models before the declarations using them)."""
