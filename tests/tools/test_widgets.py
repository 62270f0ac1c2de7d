"""The calculator responds to a programmatic change of every control, and shows bad settings as
messages."""

import html

import pytest

from rlm_course.cost.anatomy import Workload, iteration_report
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.rl.algorithms import preset
from rlm_course.tools.widgets import RLStepCalculator

CHANGES = {  # control -> a new valid value (in an order where each step stays valid)
    "generation_tp": 4, "model": "llama-3-70b", "algorithm": "ppo", "prompts": 256, "group_size": 4, "minibatches": 8,
    "prompt_len": 256, "response_len": 1024, "device": "H200-SXM-141GB", "devices": 16,
}
CUSTOM = {"n_layer": 8, "d_model": 1024, "n_head": 16, "n_kv_head": 4, "d_ff": 4096}


def test_every_control_changes_the_result():
    calc = RLStepCalculator()
    assert calc.message == "" and calc.result["seconds"] > 0
    for name, value in CHANGES.items():
        before = calc.result
        calc.controls[name].value = value
        assert calc.message == "", (name, calc.message)
        assert calc.result != before, name
    calc.controls["model"].value = "custom"
    for name, value in CUSTOM.items():
        before = calc.result
        calc.controls[name].value = value
        assert calc.message == "" and calc.result != before, name
    assert "iteration" in calc.status.value and "<table" in calc.table.value
    assert calc.plot.value.startswith("<img src='data:image/png;base64,")
    assert "Brent" in calc.status.value


def test_the_widget_shows_the_pure_functions_result():
    calc = RLStepCalculator()
    expected = iteration_report(get_spec("llama-3-8b"), preset("grpo", group_size=16,
                                                               prompts_per_step=16, minibatches=16),
                                Workload(512, 16, 512, 2048), get_device("H100-SXM-80GB"), 64, 1)
    assert calc.result == expected


@pytest.mark.parametrize("name,value,message", [
    ("devices", 0, "devices 0: give 1 or more."),
    ("devices", 10**12, "devices 1,000,000,000,000: the calculator prices clusters of up to "
                        "100,000 devices"),
    ("generation_tp", 3, "generation TP 3 must divide devices 64 (whole replicas): e.g. "
                         "generation TP 2."),
    ("response_len", -5, "response tokens -5: give 1 or more."),
    ("group_size", 1, "group_size=1 with advantage='group'"),
    ("minibatches", 3, "minibatches=3 does not divide the batch of 8192"),
    ("minibatches", 10**6, "gradient steps 1,000,000: at most one per response, so at most "
                           "prompts x group size = 8,192."),
    ("model", "tiny", "the tiny model has 32 positions; prompt + response = 2560 tokens do not "
                      "fit: keep prompt tokens + response tokens at most 32"),
])
def test_bad_settings_show_a_message(name, value, message):
    calc = RLStepCalculator()
    calc.controls[name].value = value
    assert calc.result is None and message in calc.message
    assert html.escape(message.split("=")[0]) in calc.status.value and calc.table.value == ""


def test_inconsistent_custom_model_and_moe():
    calc = RLStepCalculator()
    calc.controls["model"].value = "custom"
    calc.controls["n_head"].value = 7
    assert "n_head=7 does not divide d_model=4096" in calc.message
    calc.controls["n_head"].value = 32
    calc.controls["n_kv_head"].value = 5
    assert "n_kv_head=5 must divide n_head=32" in calc.message
    calc.controls["generation_tp"].value = 2  # 93 GB of Mixtral weights need two 80 GB GPUs
    calc.controls["model"].value = "mixtral-8x7b"
    assert calc.message == "" and calc.result["memory"]["policy states"] == 16 * 46702792704
    calc.controls["group_size"].value = 64  # 512 x 64 responses: beyond a laptop run, fine here
    assert calc.message == ""
    calc.controls["generation_tp"].value = 1
    assert "93 GB of weights" in calc.message and "do not fit in tp=1" in calc.message
    calc.controls["model"].value = "llama-3-70b"  # 141 GB of weights on one 80 GB GPU
    assert "141 GB of weights" in calc.message
    calc.controls["generation_tp"].value = 4
    assert calc.message == "" and calc.result["decode_waves"] > 1 and "waves" in calc.status.value
    calc.controls["response_len"].value = 16384  # past Llama 3's 8,192-token window
    assert calc.result is None and ("llama-3-70b reads at most 8,192 tokens" in calc.message
                                    and "lower response tokens to at most 7,680" in calc.message)
    calc.controls["model"].value = "llama-3.1-70b"  # the same architecture, 131,072 tokens
    assert calc.message == ""


def test_architecture_boxes_show_the_selected_model_and_only_custom_edits_them():
    calc = RLStepCalculator()
    boxes = ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff")
    calc.controls["model"].value = "llama-3-70b"
    assert [calc.controls[b].value for b in boxes] == [80, 8192, 64, 8, 28672]
    assert all(calc.controls[b].disabled for b in boxes)
    calc.controls["model"].value = "custom"
    assert not any(calc.controls[b].disabled for b in boxes)
    assert calc.controls["n_layer"].value == 80  # custom starts from the last model shown
    calc.controls["n_layer"].value = 40
    assert calc.spec().n_layer == 40
