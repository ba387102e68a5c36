"""The models, their owner Pods and BundleDeliveries as the watches report them, for the passes.

kopf watches every Pod and BundleDelivery labelled with a model's UID, to wake its model.
Their handlers also hand each event's object to a :class:`ChildCache`, and a pass reads its
model's children from it instead of LISTing them from the API server (issue 27, point 1).
The cache answers ``None``, and the pass LISTs as before, when it cannot know:

- **not ready**: kopf's indexes do not hold their first listing yet (below), or, where
  a pass runs without kopf, the sweep has not listed that kind in that namespace yet;
- **a recorded child is missing**: a child the model's status records is neither cached nor
  seen deleted. Its event may still be on the way (created a moment ago by another
  operator at a handover), or it was missed; only the API server knows.

This operator's own writes go into the cache when the API server answers them (a create or
patch: the object written; a delete: the object marked as terminating, until the watch
reports it), so a pass right after a write does not act on the state before it. The
version each write left is remembered for every child kind (:meth:`ChildCache.is_own_write`):
the watch event that reports it then wakes no model (the pass that wrote it knew).

**Versions.** An object replaces the cached one only if its ``resourceVersion`` is newer,
compared as integers (every API server backed by etcd gives integers; a version that is
not one always replaces). The same version again changes nothing, so the same event seen
by the index and by the event handler is stored once, and a late event of the version this
operator deleted does not undo its mark. An object seen deleted is remembered (a bounded set of UIDs), so
a late event or a LIST made before the delete does not bring it back.

**The sweep refreshes it.** Each minute the sweep LISTs the metadata of every swept kind
per namespace (``sweep.py``). Where the cache holds other objects or other versions than
that LIST (:meth:`ChildCache.agrees`), the sweep LISTs the whole objects again and
:meth:`ChildCache.refresh` takes them: cached objects it lacks that are not newer than the
LIST are dropped (a missed DELETED event), newer ones it has replace older cached ones (a
missed MODIFIED event). A settled cluster agrees, and costs only the metadata.

**Ready from the start.** The operator declares kopf indexes on Pods and BundleDeliveries
whose functions feed this cache (``handlers.py``); kopf runs no other handler, so no pass,
before every index holds its resource's first listing. The first model's driver then
calls :meth:`ChildCache.mark_ready`. Before that (and in tests that run a pass without
kopf) the cache answers for a namespace once the sweep has listed it there.

**kubelet's FailedMount Events** on owner Pods are kept too, by Pod UID: kopf watches
them (filtered by the API server on reason and kind) and a new one wakes the Pod's model,
so a Pod waiting for its volume is not polled. They carry no label to index them by, so a
namespace's Events are known once one LIST of them there was made after the watch began
(:meth:`ChildCache.refresh_events`; the union of that LIST and the watch misses nothing).

**The models themselves** are kept too, by UID, so a pass starts from its model without a
GET (two of the ten requests per model at creation, experiments/10). The cache holds the
newest version it has seen of each: from the model watch (``handlers.py``), and from the
answers to this operator's own status writes and reads (``kube.py``). So the copy a pass
gets is never older than this operator's last write of the model, which a pass must see
(one that finds nothing to change writes nothing), and it holds every change the watch
has delivered. A change the watch has not delivered yet wakes the model when it comes;
the status writes that carry records are conditional on the version read, so a write
from a copy that another writer has overtaken is refused (409) and made again from a
fresh read. Where versions are not integers the cache serves no model and passes GET.

Objects are held without ``metadata.managedFields``: no pass reads them, and they are much
of what each copy into and out of the cache would cost.

Thread-safe: events arrive on the event loop; passes and the sweep use it from threads.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any, Iterable

from .naming import LABEL_MODEL, LABEL_MODEL_UID

KINDS = ("Pod", "BundleDelivery")   # and FailedMount Events, apart (by Pod UID)
GONE_REMEMBERED = 20000   # UIDs of objects seen deleted
OWN_WRITES_REMEMBERED = 20000   # the version of this operator's last write, by UID


def _version(obj: dict[str, Any]) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


def _replaces(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether ``new`` replaces the cached ``old``: a newer version (or one not comparable)."""
    a, b = _version(new), _version(old)
    return a is None or b is None or a > b


class ChildCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (namespace, kind) -> model label -> uid -> object
        self._objects: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {}
        self._where: dict[str, tuple[str, str, str]] = {}   # uid -> (namespace, kind, model)
        self._ready: set[tuple[str, str]] = set()
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._all_ready = False
        self._events: dict[str, dict[str, dict[str, Any]]] = {}   # Pod UID -> Event UID -> Event
        self._events_ready: set[str] = set()                        # namespaces
        self._own: OrderedDict[str, str | None] = OrderedDict()      # uid -> version this operator wrote
        self._models: dict[str, dict[str, Any]] = {}                  # model UID -> newest version seen

    def mark_ready(self) -> None:
        """kopf's indexes hold their first listing: the cache answers everywhere."""
        self._all_ready = True

    # -- what the watches and this operator's writes say ----------------------------------
    def observe(self, kind: str, event_type: str | None, obj: dict[str, Any]) -> None:
        """A watch event (``event_type`` ADDED, MODIFIED, DELETED, or None while kopf lists)
        of a Pod, a BundleDelivery or a FailedMount ``Event``."""
        with self._lock:
            if kind == "Event":
                self._put_event(obj, gone=event_type == "DELETED")
            elif event_type == "DELETED":
                self._forget(obj, gone=True)
            else:
                self._put(kind, obj)

    def observe_model(self, event_type: str | None, obj: dict[str, Any]) -> None:
        """A ResidentModel as the model watch delivered it (``event_type`` ADDED, MODIFIED,
        DELETED, or None while kopf lists), or as the API server answered this operator's
        read or status write of it (None)."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not uid:
            return
        with self._lock:
            if event_type == "DELETED":
                self._models.pop(uid, None)
                self._remember_gone(uid)
            elif uid not in self._gone:
                held = self._models.get(uid)
                if held is None or _replaces(obj, held):
                    self._models[uid] = _kept(obj)

    def wrote(self, kind: str, obj: dict[str, Any], own: bool = True) -> None:
        """The object as the API server answered this operator's create or patch (``own``),
        or its create's 409 (what held the name: not this operator's write)."""
        meta = obj.get("metadata") or {}
        with self._lock:
            if kind in KINDS:
                self._put(kind, obj)
            if own and meta.get("uid"):
                self._own[meta["uid"]] = meta.get("resourceVersion")
                self._own.move_to_end(meta["uid"])
                while len(self._own) > OWN_WRITES_REMEMBERED:
                    self._own.popitem(last=False)

    def is_own_write(self, obj: dict[str, Any]) -> bool:
        """Is ``obj`` (a watch event's) at the version this operator's last write of it left?
        Then the event tells the model nothing its pass did not know when it wrote it."""
        meta = obj.get("metadata") or {}
        with self._lock:
            return bool(meta.get("uid")) and self._own.get(meta["uid"]) == meta.get("resourceVersion")

    def deleting(self, uid: str, when: str) -> None:
        """This operator deleted ``uid`` at ``when`` (RFC 3339): if cached, terminating until
        the watch says more (its next event has a newer version and replaces the mark)."""
        with self._lock:
            where = self._where.get(uid)
            if where is None:
                return
            namespace, kind, model = where
            obj = self._objects[(namespace, kind)][model][uid]
            if not obj["metadata"].get("deletionTimestamp"):
                marked = dict(obj, metadata=dict(obj["metadata"], deletionTimestamp=when))
                self._objects[(namespace, kind)][model][uid] = marked

    def refresh(self, namespace: str, kind: str, listed: list[dict[str, Any]], version: str | None) -> None:
        """The sweep's LIST of ``kind`` in ``namespace`` (every object labelled with a model
        UID), made at ``version``: from now on the cache answers for them."""
        try:
            at = int(version) if version is not None else None
        except ValueError:
            at = None
        with self._lock:
            seen = set()
            for obj in listed:
                seen.add(obj["metadata"]["uid"])
                self._put(kind, obj)
            for model_objects in list(self._objects.get((namespace, kind), {}).values()):
                for uid, obj in list(model_objects.items()):
                    v = _version(obj)
                    if uid in seen:
                        continue
                    if at is not None and v is not None:
                        if v <= at:   # it was there before the LIST, which lacks it: deleted
                            self._forget(obj, gone=True)
                    else:             # no order known: a pass asks the API server
                        self._forget(obj, gone=False)
            self._ready.add((namespace, kind))

    def agrees(self, namespace: str, kind: str, listed: list[dict[str, Any]]) -> bool:
        """Whether the cache answers for ``kind`` in ``namespace`` and holds exactly the
        objects of ``listed`` (a LIST of every object labelled with a model UID there, only
        their metadata will do), each at the version listed: then :meth:`refresh` with the
        whole objects would change nothing."""
        with self._lock:
            if not self._all_ready and (namespace, kind) not in self._ready:
                return False
            held = {uid: obj for by_model in self._objects.get((namespace, kind), {}).values()
                    for uid, obj in by_model.items()}
            return len(held) == len(listed) and all(
                (obj := held.get(o["metadata"].get("uid"))) is not None
                and obj["metadata"].get("resourceVersion") == o["metadata"].get("resourceVersion")
                for o in listed)

    def refresh_events(self, namespace: str, listed: list[dict[str, Any]]) -> None:
        """A LIST of the FailedMount Events in ``namespace``, made after the watch began."""
        with self._lock:
            for obj in listed:
                self._put_event(obj, gone=False)
            self._events_ready.add(namespace)

    # -- what a pass reads -------------------------------------------------------------------
    def mount_events(self, namespace: str, pod_uid: str) -> list[dict[str, Any]] | None:
        """The FailedMount Events of the Pod ``pod_uid``; None until the namespace's are known."""
        with self._lock:
            if namespace not in self._events_ready:
                return None
            return [copy.deepcopy(e) for e in self._events.get(pod_uid, {}).values()]

    def model(self, uid: str) -> dict[str, Any] | None:
        """A copy of the newest version seen of the model ``uid``; None if none was seen,
        it was seen deleted, or its version is not an integer (see the module docstring)."""
        with self._lock:
            held = self._models.get(uid)
            return copy.deepcopy(held) if held is not None and _version(held) is not None else None

    def model_uid_of(self, uid: str) -> str | None:
        """The model UID label of the cached Pod or BundleDelivery ``uid``."""
        with self._lock:
            where = self._where.get(uid)
            if where is None:
                return None
            obj = self._objects[where[:2]][where[2]][uid]
            return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_MODEL_UID)

    def children(self, namespace: str, kind: str, model: str, recorded: Iterable[str]
                 ) -> list[dict[str, Any]] | None:
        """Copies of the ``kind`` objects labelled ``model`` (the model label's value) in
        ``namespace``, or None when the cache cannot know them (see the module docstring)."""
        with self._lock:
            if not self._all_ready and (namespace, kind) not in self._ready:
                return None
            objs = self._objects.get((namespace, kind), {}).get(model, {})
            if any(uid not in objs and uid not in self._gone for uid in recorded):
                return None
            # in the API server's order (by name), which some choices of a pass follow
            return [copy.deepcopy(o) for o in sorted(objs.values(), key=lambda o: o["metadata"].get("name", ""))]

    # -- under the lock ----------------------------------------------------------------------
    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid, namespace = meta.get("uid"), meta.get("namespace")
        if not uid or not namespace or uid in self._gone:
            return
        model = (meta.get("labels") or {}).get(LABEL_MODEL, "")
        old_where = self._where.get(uid)
        if old_where is not None:
            old = self._objects[old_where[:2]][old_where[2]][uid]
            if not _replaces(obj, old):
                return
            self._remove(uid, old_where)
        obj = _kept(obj)
        obj.setdefault("kind", kind)
        self._objects.setdefault((namespace, kind), {}).setdefault(model, {})[uid] = obj
        self._where[uid] = (namespace, kind, model)

    def _put_event(self, obj: dict[str, Any], gone: bool) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        pod_uid = (obj.get("involvedObject") or {}).get("uid")
        if not uid or not pod_uid:
            return
        held = self._events.setdefault(pod_uid, {})
        if gone:
            held.pop(uid, None)
        elif uid not in held or _replaces(obj, held[uid]):
            held[uid] = _kept(obj)
        if not held:
            del self._events[pod_uid]

    def _forget(self, obj: dict[str, Any], gone: bool) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if not uid:
            return
        where = self._where.get(uid)
        if where is not None:
            self._remove(uid, where)
        if gone:
            self._remember_gone(uid)
            self._events.pop(uid, None)   # a Pod's Events go with it

    def _remember_gone(self, uid: str) -> None:
        self._gone[uid] = None
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)

    def _remove(self, uid: str, where: tuple[str, str, str]) -> None:
        namespace, kind, model = where
        by_model = self._objects[(namespace, kind)]
        by_model[model].pop(uid, None)
        if not by_model[model]:
            del by_model[model]
        del self._where[uid]


def _kept(obj: Any) -> dict[str, Any]:
    """A copy of ``obj`` as the cache holds it: without ``metadata.managedFields``, which no
    pass reads and which is much of a Pod's size, so each copy in and out costs less (at
    3,000 models ``copy.deepcopy`` was 12 % of the operator's samples while they converged;
    experiments/10, ``3000-models-converging-profile/``)."""
    meta = obj.get("metadata") or {}
    slim = dict(obj)
    if "managedFields" in meta:
        slim["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return copy.deepcopy(slim)
