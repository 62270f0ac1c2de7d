"""The controller without Ray (rlm_course.systems.controller): device mappings, and worker methods
passed by reference."""

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
