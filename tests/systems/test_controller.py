"""The controller without Ray (rlm_course.systems.controller): device mappings, and worker methods
passed by reference."""

import os

import pytest

from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.systems.controller import DeviceMapping

TOK = CharTokenizer()


def test_device_mappings():
    colocated = DeviceMapping(actor=[0, 1], rollout=[0, 1])
    assert [(g.roles, g.devices) for g in colocated.groups()] == [(("actor", "rollout"), (0, 1))]
    assert colocated.placement("actor", "rollout") == "colocated"
    split = DeviceMapping.disaggregated(actor=2, rollout=1)
    assert split.roles == {"actor": (0, 1), "rollout": (2,)}
    assert split.placement("actor", "rollout") == "disaggregated"
    with pytest.raises(ValueError, match="share some devices but not all"):
        DeviceMapping(actor=[0, 1], rollout=[1, 2])
    with pytest.raises(ValueError, match="distinct"):
        DeviceMapping(actor=[0, 0])
    with pytest.raises(ValueError, match="no role"):
        colocated.placement("actor", "critic")


def test_device_numbers_are_checked_against_the_cluster():
    DeviceMapping(actor=[0], rollout=[1]).check_cluster(2)  # fits: no error
    with pytest.raises(ValueError, match=r"device\(s\) \[99\] do not exist; the cluster has 2 GPUs, "
                                         r"numbered 0..1. .*DeviceMapping\(actor=\[0\], rollout=\[1\]\)"):
        DeviceMapping(actor=[0], rollout=[99]).check_cluster(2, "GPUs")
    with pytest.raises(ValueError, match=r"devices \[0, 2\] leave a gap; number them 0..1"):
        DeviceMapping(actor=[0], rollout=[2]).check_cluster(4)


def test_worker_methods_are_passed_by_reference_and_a_wrong_one_fails_in_the_driver():
    from rlm_course.systems.controller import method_name
    from rlm_course.systems.workers import RLWorker, TrainerMixin

    assert method_name(RLWorker, RLWorker.train) == "train"
    assert method_name(RLWorker, TrainerMixin.train) == "train"  # the role's mixin defines it
    with pytest.raises(TypeError, match=r"RLWorker\.train, not its name 'train'"):
        method_name(RLWorker, "train")
    with pytest.raises(ValueError, match="not a method of the worker class RLWorker"):
        method_name(RLWorker, len)
    with pytest.raises(TypeError, match="is not a method"):
        method_name(RLWorker, 3)


def test_a_failure_after_a_peer_died_names_the_dead_peer():
    """When a rollout worker is killed, the actor's collective with it fails too, and either
    error may reach the controller first: the controller looks for a peer whose process is gone
    and names it (the root cause), not the survivor's broken send."""
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    from rlm_course.systems.controller import Controller, WorkerInfo

    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # exited and reaped: its pid is gone
    here = socket.gethostname()

    def worker(name, pid, node=here):
        return WorkerInfo(name, ("x",), 0, 0, 0, None, pid=pid, node=node)

    actor, rollout = worker("actor/0", os.getpid()), worker("rollout/0", done.pid)
    stub = SimpleNamespace(workers=[actor, rollout])
    assert Controller._dead_peer(stub, actor) is rollout
    assert Controller._dead_peer(stub, rollout) is None  # the failed one itself is not a peer
    elsewhere = worker("rollout/0", done.pid, node="another-host")
    assert Controller._dead_peer(SimpleNamespace(workers=[actor, elsewhere]), actor) is None
