"""A single controller on Ray: worker groups placed by a device mapping, each a
``torch.distributed`` group.

**The pattern** (HybridFlow, arXiv:2409.19256, section 4; veRL, OpenRLHF, slime, ROLL and NeMo-RL
do the same): one driver process, the *controller*, holds the algorithm's control flow and calls
methods on workers; each model role (actor = trainer, rollout, reference, ...) is a *worker
group*, several processes that run the same program on their shares of the data (SPMD) and talk
to each other with collectives. Ray (https://docs.ray.io) starts the processes (actors), places
them on devices (placement groups) and carries the calls and their results; ``torch.distributed``
carries the tensors between workers (gloo on CPU, NCCL on GPUs).

**Device mapping** (:class:`DeviceMapping`, as ROLL's ``device_mapping``): each role names the
devices of its pool. Roles with *identical* pools are **colocated**: one process per device hosts
all of them and time-shares the device (veRL's hybrid engine), and the actor's weights reach the
rollout engine inside that process. Roles with *disjoint* pools are **disaggregated**: separate
processes on separate devices, and the weights travel over a sync group (chapter 12's weight
sync). Pools that overlap without being equal are refused. On CPU a "device" is a Ray bundle of
``cpus_per_device`` CPUs (fractions allowed, so that four workers fit on two cores); with GPUs,
one GPU per bundle. A Ray cluster spans machines unchanged (``ray.init(address=...)``).

**Process groups.** Every worker of every group joins one ``torch.distributed`` world (ranks in
the order of :meth:`DeviceMapping.groups`, then device order); the controller picks the port on
the node of rank 0. Inside it, named subgroups (``dist.new_group``): one per worker group
(``"actor"``, ``"rollout"``, or ``"actor+rollout"`` when colocated), and for a disaggregated
actor and rollout a ``"sync"`` group: the actor's first rank and every rollout rank.

**Faults.** Every call goes through :meth:`Controller.wait`, which waits at most ``timeout``
seconds for any progress. A worker whose process dies makes it raise :class:`WorkerDiedError`
naming the worker, its process id and device and what it was doing; an exception inside a worker
becomes :class:`WorkerError` with the worker's name and the original message; no progress within
the timeout raises :class:`WorkerTimeoutError`. The controller then stops every worker of the
run (never a hang: the others may be blocked in a collective with the dead one), and a collective
inside a worker gives up after ``timeout`` seconds too (``init_process_group(timeout=...)``).

**Ray set-up.** :func:`start_ray` starts (or joins) a local Ray instance with no dashboard and
without token authentication (``RAY_AUTH_MODE=disabled``: a local instance does not need it);
nothing has to be started by hand. :func:`stop_ray` ends it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlm_course.utils import cores

#: Seconds a call (and a collective inside a worker) may make no progress before it fails.
DEFAULT_TIMEOUT = 300.0


class WorkerError(RuntimeError):
    """A worker failed. ``worker``: its name; ``what``: what it was doing."""

    def __init__(self, message: str, worker: str, what: str) -> None:
        super().__init__(message)
        self.worker, self.what = worker, what


class WorkerDiedError(WorkerError):
    """A worker's process died (killed, out of memory, a crash)."""


class WorkerTimeoutError(WorkerError):
    """No worker made progress within the timeout."""


# ---------------------------------------------------------------------------------- Ray itself
def start_ray(num_cpus: int | None = None, address: str | None = None, quiet: bool = True) -> dict:
    """Start a local Ray instance (or join ``address``), once per process.

    ``num_cpus`` defaults to the cores this process may use. Ray's dashboard is off, token
    authentication is off for a local instance (``RAY_AUTH_MODE=disabled``; Ray 2.60 would write
    a token under the user's home), the object store is small (256 MB: the course moves megabytes),
    and ``quiet`` keeps the workers' logs out of the driver's output (they stay in Ray's log
    folder).

    Returns:
        Ray's cluster resources, e.g. ``{"CPU": 2.0, ...}``.
    """
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        kwargs = dict(include_dashboard=False, log_to_driver=not quiet,
                      logging_level=logging.WARNING if quiet else logging.INFO)
        if address is None:
            kwargs.update(num_cpus=num_cpus or cores(), object_store_memory=256 * 2**20)
        ray.init(address=address, **kwargs)
    return dict(ray.cluster_resources())


def stop_ray() -> None:
    """Shut the Ray instance of this process down (a no-op if none is running)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------------------- placement
@dataclass(frozen=True)
class WorkerGroupSpec:
    """One worker group: the roles its processes host, and the device of each process."""

    roles: tuple[str, ...]
    devices: tuple[int, ...]

    @property
    def name(self) -> str:
        return "+".join(self.roles)

    @property
    def colocated(self) -> bool:
        return len(self.roles) > 1


class DeviceMapping:
    """Which devices each role runs on: ``DeviceMapping(actor=[0], rollout=[1])``.

    Identical device lists make roles **colocated** (one process per device hosts them all);
    disjoint lists make them **disaggregated**.

    Raises:
        ValueError: for no roles, an empty or repeated device list, a negative device, or two
            roles whose pools overlap without being equal (the message names them and the fix).
    """

    def __init__(self, **roles: Sequence[int]) -> None:
        if not roles:
            raise ValueError("DeviceMapping: give at least one role, e.g. DeviceMapping(actor=[0], "
                             "rollout=[1]).")
        self.roles: dict[str, tuple[int, ...]] = {}
        for role, devices in roles.items():
            devices = tuple(devices)
            if not devices or len(set(devices)) != len(devices) or any(
                    not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices):
                raise ValueError(f"DeviceMapping: role {role!r} has devices {list(devices)}; give "
                                 "a non-empty list of distinct device numbers >= 0.")
            self.roles[role] = devices
        names = list(self.roles)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pa, pb = set(self.roles[a]), set(self.roles[b])
                if pa & pb and pa != pb:
                    raise ValueError(
                        f"DeviceMapping: roles {a!r} {sorted(pa)} and {b!r} {sorted(pb)} share "
                        "some devices but not all; give them the same devices (colocated: one "
                        "process per device hosts both) or disjoint ones (disaggregated).")

    @classmethod
    def colocated(cls, roles: Iterable[str], devices: int) -> "DeviceMapping":
        """Every role on devices ``0 .. devices - 1``."""
        return cls(**{r: list(range(devices)) for r in roles})

    @classmethod
    def disaggregated(cls, **pool_sizes: int) -> "DeviceMapping":
        """Each role on its own devices, numbered in the order given: ``disaggregated(actor=1,
        rollout=1)`` puts the actor on device 0 and the rollout on device 1."""
        roles, start = {}, 0
        for role, size in pool_sizes.items():
            roles[role] = list(range(start, start + size))
            start += size
        return cls(**roles)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted({d for devs in self.roles.values() for d in devs}))

    def check_cluster(self, devices: int, kind: str = "devices") -> None:
        """Check the device numbers against a cluster of ``devices`` devices (numbered from 0, as
        the controller reserves one bundle per device).

        Raises:
            ValueError: if a role names a device the cluster does not have, or the numbers leave a
                gap (the message gives the numbering that fits).
        """
        used = self.devices
        missing = [d for d in used if d >= devices]
        if missing:
            raise ValueError(f"DeviceMapping: device(s) {missing} do not exist; the cluster has "
                             f"{devices} {kind}, numbered 0..{devices - 1}. Renumber the roles "
                             f"within that range, e.g. {self._renumbered()}.")
        if used != tuple(range(len(used))):
            raise ValueError(f"DeviceMapping: devices {list(used)} leave a gap; number them "
                             f"0..{len(used) - 1}, e.g. {self._renumbered()}.")

    def _renumbered(self) -> str:
        new = {d: i for i, d in enumerate(self.devices)}
        return "DeviceMapping(" + ", ".join(
            f"{r}={[new[d] for d in devs]}" for r, devs in self.roles.items()) + ")"

    def groups(self) -> list[WorkerGroupSpec]:
        """The worker groups: roles with identical pools fused, in the order roles were given."""
        out: dict[tuple[int, ...], list[str]] = {}
        for role, devices in self.roles.items():
            out.setdefault(devices, []).append(role)
        return [WorkerGroupSpec(tuple(roles), devices) for devices, roles in out.items()]

    def placement(self, a: str, b: str) -> str:
        """``"colocated"`` or ``"disaggregated"`` for roles ``a`` and ``b``.

        Raises:
            ValueError: for a role the mapping does not have.
        """
        for role in (a, b):
            if role not in self.roles:
                raise ValueError(f"DeviceMapping has no role {role!r}; its roles: {list(self.roles)}.")
        return "colocated" if self.roles[a] == self.roles[b] else "disaggregated"

    def __repr__(self) -> str:
        inner = ", ".join(f"{r}={list(d)}" for r, d in self.roles.items())
        return f"DeviceMapping({inner})"


# ---------------------------------------------------------------------------------- controller
def method_name(worker_class: type, method) -> str:
    """The name under which Ray calls ``method``, a method of ``worker_class`` (e.g.
    ``RLWorker.train``): the controller takes methods, not strings, so that a misspelt name fails
    in the driver, in Python, and go-to-definition works.

    Raises:
        TypeError: for a string or anything else that is not a function.
        ValueError: for a function that is not a method of ``worker_class``.
    """
    cls = worker_class.__name__
    if isinstance(method, str):
        raise TypeError(f"pass the worker's method itself, e.g. {cls}.{method}, not its name "
                        f"{method!r}.")
    name = getattr(method, "__name__", None)
    if not callable(method) or name is None:
        raise TypeError(f"{method!r} is not a method; pass one of {cls}'s, e.g. {cls}.describe.")
    if getattr(worker_class, name, None) is not method:
        raise ValueError(f"{getattr(method, '__qualname__', name)} is not a method of the worker "
                         f"class {cls}; pass one of its methods.")
    return name


@dataclass
class WorkerInfo:
    """What the controller knows about one worker."""

    name: str
    roles: tuple[str, ...]
    rank: int
    group_rank: int
    device: int
    handle: object
    pid: int = 0
    node: str = ""
    clock_offset: float = 0.0


class Controller:
    """Start the workers of a :class:`DeviceMapping` on Ray and join them in one
    ``torch.distributed`` world; call their methods with fault handling; collect their events.

    Use it as a context manager (``with Controller(mapping) as c: ...``) or call :meth:`close`.

    Args:
        mapping: the roles and their devices.
        threads: torch intra-op threads per worker (1: one core each).
        cpus_per_device: Ray CPUs of each device's bundle (default: the CPUs Ray has free, shared
            evenly among the devices, at most 1, so that every worker fits).
        use_gpu: one GPU per device and NCCL (default: when the Ray cluster has GPUs for every
            device).
        timeout: seconds without progress before a call fails (:class:`WorkerTimeoutError`); also
            the collectives' timeout inside the workers.
        worker_class: the actor class (default :class:`rlm_course.systems.workers.RLWorker`).
        groups: more named process groups, ``{name: [global ranks]}`` (e.g. HybridFlow's micro
            data-parallel groups).

    Raises:
        ValueError: if the cluster has too few CPUs or GPUs for the devices, or the mapping names
            a device the cluster does not have or leaves a gap
            (:meth:`DeviceMapping.check_cluster`).
        WorkerError: if a worker fails to start (its message names the worker).
    """

    def __init__(self, mapping: DeviceMapping, threads: int = 1,
                 cpus_per_device: float | None = None, use_gpu: bool | None = None,
                 timeout: float = DEFAULT_TIMEOUT, worker_class=None,
                 groups: dict[str, list[int]] | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if timeout <= 0:
            raise ValueError(f"timeout={timeout} must be positive (seconds).")
        start_ray()
        self.mapping, self.timeout, self.closed = mapping, float(timeout), False
        self.extra_groups = dict(groups or {})
        self._pending: dict = {}
        self._values: dict = {}
        resources = ray.cluster_resources()
        n = len(mapping.devices)
        gpus = resources.get("GPU", 0)
        self.use_gpu = bool(gpus >= n) if use_gpu is None else use_gpu
        if self.use_gpu and gpus < n:
            raise ValueError(f"use_gpu: the Ray cluster has {gpus:g} GPUs for {n} devices.")
        if self.use_gpu:
            mapping.check_cluster(int(gpus), "GPUs")
        else:  # a simulated device is one worker process with its own CPU share
            mapping.check_cluster(max(n, int(resources.get("CPU", 0))), "simulated devices "
                                  "(one per Ray CPU)")
        cpus = ray.available_resources().get("CPU", 0)
        if cpus_per_device is None:
            cpus_per_device = min(1.0, cpus / n) if cpus else 0.0
        if cpus_per_device <= 0 or cpus_per_device * n > cpus + 1e-9:
            raise ValueError(f"{n} devices x {cpus_per_device:g} CPUs do not fit the {cpus:g} CPUs "
                             "Ray has free; close the other controllers, lower cpus_per_device or "
                             "start Ray with more CPUs.")
        self.backend = "nccl" if self.use_gpu else "gloo"
        self.cpus_per_device = cpus_per_device
        bundle = {"CPU": cpus_per_device, **({"GPU": 1} if self.use_gpu else {})}
        self._remove_pg = remove_placement_group
        self.placement_group = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
        try:
            ray.get(self.placement_group.ready(), timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.placement_group)
            raise ValueError(f"Ray could not reserve {n} bundles of {bundle} within "
                             f"{self.timeout:.0f} s; the cluster has {resources}.") from None
        if worker_class is None:
            from rlm_course.systems.workers import RLWorker as worker_class
        self.worker_class = worker_class
        remote = ray.remote(worker_class)
        bundle_of = {d: i for i, d in enumerate(mapping.devices)}
        self.workers: list[WorkerInfo] = []
        for spec in mapping.groups():
            for k, device in enumerate(spec.devices):
                name = f"{spec.name}/{k}"
                strategy = PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=bundle_of[device])
                handle = remote.options(num_cpus=cpus_per_device,
                                        num_gpus=1 if self.use_gpu else 0,
                                        scheduling_strategy=strategy, max_concurrency=2,
                                        name=None).remote(name, spec.roles, threads)
                self.workers.append(WorkerInfo(name, spec.roles, len(self.workers), k, device,
                                               handle))
        try:
            self._start_distributed()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up
    def _start_distributed(self) -> None:
        cls = self.worker_class
        infos = self.call(self.workers, cls.describe, what="starting")
        for w, info in zip(self.workers, infos):
            w.pid, w.node = info["pid"], info["node"]
        for w in self.workers:
            w.clock_offset = _offset(self, w)
        addr, port = self.call([self.workers[0]], cls.rendezvous_address,
                               what="choosing a port")[0]
        self.groups = self._group_ranks()
        self.call(self.workers, cls.setup_distributed, addr, port, len(self.workers),
                  groups=self.groups, backend=self.backend, timeout=self.timeout,
                  per_worker=[{"rank": w.rank} for w in self.workers],
                  what="joining the process group")

    def _group_ranks(self) -> dict[str, list[int]]:
        groups = {"world": [w.rank for w in self.workers]}
        for spec in self.mapping.groups():
            groups[spec.name] = [w.rank for w in self.workers if w.roles == spec.roles]
        actors = self.role_workers("actor") if "actor" in self.mapping.roles else []
        rollouts = self.role_workers("rollout") if "rollout" in self.mapping.roles else []
        if actors and rollouts and self.mapping.placement("actor", "rollout") == "disaggregated":
            groups["sync"] = [actors[0].rank] + [w.rank for w in rollouts]
        for name, ranks in self.extra_groups.items():
            if name in groups or not ranks or not set(ranks) <= set(groups["world"]):
                raise ValueError(f"group {name!r} {ranks}: give a new name and ranks among "
                                 f"{groups['world']}.")
            groups[name] = list(ranks)
        return groups

    # ------------------------------------------------------------------ lookup
    def role_workers(self, role: str) -> list[WorkerInfo]:
        """The workers hosting ``role``, in group-rank order.

        Raises:
            ValueError: for a role the mapping does not have.
        """
        found = [w for w in self.workers if role in w.roles]
        if not found:
            raise ValueError(f"no worker hosts role {role!r}; the roles are "
                             f"{list(self.mapping.roles)}.")
        return found

    def worker(self, name: str) -> WorkerInfo:
        for w in self.workers:
            if w.name == name:
                return w
        raise ValueError(f"no worker named {name!r}; the workers are "
                         f"{[w.name for w in self.workers]}.")

    # ------------------------------------------------------------------ calls
    def submit(self, worker: WorkerInfo, method, *args, what: str = "", **kwargs):
        """Start ``worker.method(*args, **kwargs)`` (``method``: a method of the worker class,
        e.g. ``RLWorker.train``); returns a future for :meth:`wait`.

        Raises:
            TypeError, ValueError: see :func:`method_name`.
        """
        name = method_name(self.worker_class, method)
        if self.closed:
            raise RuntimeError("the controller is closed; start a new one.")
        future = getattr(worker.handle, name).remote(*args, **kwargs)
        self._pending[future] = (worker, what or name)
        return future

    def wait(self, futures: list, num_returns: int = 1, timeout: float | None = None):
        """Wait until ``num_returns`` of ``futures`` are done; returns ``(done, not_done)`` like
        ``ray.wait``, the done ones' results checked (see the module docstring on faults).

        Raises:
            WorkerDiedError, WorkerError, WorkerTimeoutError: as described there; the controller
                is closed first.
        """
        import ray

        timeout = self.timeout if timeout is None else timeout
        done, rest = ray.wait(list(futures), num_returns=num_returns, timeout=timeout)
        if len(done) < num_returns:
            busy = ", ".join(sorted({f"{self._pending[f][0].name} ({self._pending[f][1]})"
                                     for f in rest if f in self._pending}))
            first = self._pending.get(rest[0], (self.workers[0], "waiting"))
            self.close()
            raise WorkerTimeoutError(f"no progress within {timeout:.0f} s; still running: {busy}. "
                                     "Every worker was stopped; raise timeout if the work is "
                                     "really that slow.", first[0].name, first[1])
        for future in done:
            self._values[future] = self._fetch(future)
        return done, rest

    def value(self, future):
        """The result of a ``future`` that :meth:`wait` returned as done (or, if it has not
        been waited for, its result once it is done), with worker failures turned into errors."""
        if future in self._values:
            return self._values.pop(future)
        return self._fetch(future)

    def _fetch(self, future):
        import ray

        worker, what = self._pending.pop(future, (None, "a call"))
        try:
            return ray.get(future, timeout=self.timeout)
        except ray.exceptions.RayActorError as err:
            name = worker.name if worker else "a worker"
            where = f" (pid {worker.pid}, device {worker.device})" if worker else ""
            self.close()
            raise WorkerDiedError(
                f"worker {name}{where} died while {what}: its process is gone "
                f"({type(err).__name__}). The run stopped and every worker was shut down.",
                name, what) from None
        except ray.exceptions.RayTaskError as err:
            name = worker.name if worker else "a worker"
            cause = err.cause if getattr(err, "cause", None) is not None else err
            dead = self._dead_peer(worker)
            if dead is not None:  # the root cause: a peer died and this collective broke
                self.close()
                raise WorkerDiedError(
                    f"worker {dead.name} (pid {dead.pid}, device {dead.device}) died: its process "
                    f"is gone; worker {name} then failed while {what} ({type(cause).__name__}). "
                    "The run stopped and every worker was shut down.", dead.name, what) from cause
            self.close()
            raise WorkerError(f"worker {name} failed while {what}: {type(cause).__name__}: "
                              f"{str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}",
                              name, what) from cause

    def _dead_peer(self, failed: "WorkerInfo | None") -> "WorkerInfo | None":
        """A worker other than ``failed`` whose process is gone, if one is (checked in ``/proc``
        for workers on this machine; None elsewhere): a collective fails in the survivors when a
        peer is killed, and which of the two errors reaches the controller first is a race."""
        import socket
        from pathlib import Path

        if not Path("/proc/self/stat").exists():  # no /proc here (macOS): cannot tell
            return None
        here = socket.gethostname()
        for w in getattr(self, "workers", []):
            if w is failed or not w.pid or w.node != here:
                continue
            try:
                state = Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:  # gone and reaped
                return w
            except (OSError, IndexError):
                continue
            if state in ("Z", "X"):  # a zombie: dead, not yet reaped
                return w
        return None

    def call(self, workers: Sequence[WorkerInfo], method, *args, what: str = "",
             per_worker: Sequence[dict] | None = None, **kwargs) -> list:
        """Run ``method`` (a method of the worker class, e.g. ``RLWorker.train``) on every worker
        of ``workers`` at once and return their results in order. ``per_worker`` (optional):
        extra keyword arguments for each worker (e.g. its rank).

        Raises:
            TypeError, ValueError: see :func:`method_name`.
        """
        name = method_name(self.worker_class, method)
        futures = [self.submit(w, method, *args, what=what or name,
                               **kwargs, **(per_worker[i] if per_worker else {}))
                   for i, w in enumerate(workers)]
        return self.gather(futures)

    def gather(self, futures: list) -> list:
        """The results of every future, in order, with :meth:`wait`'s fault handling."""
        pending = list(futures)
        while pending:
            _, pending = self.wait(pending, num_returns=1)
        return [self.value(f) for f in futures]

    def events(self) -> list:
        """Every worker's recorded events since the last call, on the controller's clock."""
        from rlm_course.timeline import shifted

        out = []
        per_worker = self.call(self.workers, self.worker_class.take_events,
                               what="collecting events")
        for w, events in zip(self.workers, per_worker):
            out += shifted(events, w.clock_offset)
        return out

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop every worker and free the placement group (safe to call twice)."""
        import ray

        if self.closed:
            return
        self.closed = True
        for w in getattr(self, "workers", []):
            try:
                ray.kill(w.handle, no_restart=True)
            except Exception:  # already dead
                pass
        try:
            self._remove_pg(self.placement_group)
            # Ray returns the bundles' CPUs asynchronously: wait (briefly) until they are free,
            # so that a controller started next sees them
            freed = self.cpus_per_device * len(self.mapping.devices)
            deadline = time.monotonic() + 10.0
            while (ray.available_resources().get("CPU", 0) + 1e-9 < freed
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        except Exception:
            pass
        self._pending.clear()
        self._values.clear()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def describe(self) -> str:
        """One line per worker: name, roles, global rank, device, process id."""
        lines = [f"{self.mapping!r}: {len(self.workers)} workers, backend {self.backend}"]
        for w in self.workers:
            lines.append(f"  {w.name:<18} rank {w.rank}  device {w.device}  pid {w.pid}")
        return "\n".join(lines)


def _offset(controller: Controller, worker: WorkerInfo) -> float:
    import ray

    from rlm_course.timeline import clock_offset

    return clock_offset(lambda: ray.get(worker.handle.clock.remote(), timeout=controller.timeout))
