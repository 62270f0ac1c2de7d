"""Memory does not grow with the number of steps: every preset's trainer holds the same live
tensors after each step (the activation meter once kept every tracked forward pass alive through
a reference cycle in the autograd graph: about 45 MB per PPO step)."""

import pytest

from rlm_course.cost.accounting import live_tensor_bytes
from rlm_course.lm.checkpoint import load_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset
from rlm_course.rl.runs import default_sft_checkpoint
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TASK = get_task("addition", digits=3)


@pytest.mark.parametrize("variant,sizes", [
    ("grpo", dict(prompts_per_step=8, group_size=4)),
    ("ppo", dict(prompts_per_step=32)),
    ("dapo", dict(prompts_per_step=8, group_size=4)),
])
def test_live_tensors_do_not_grow_with_the_step_number(variant, sizes):
    policy = load_checkpoint(default_sft_checkpoint(TASK))["model"]
    trainer = RLTrainer(policy, TASK, CharTokenizer(), preset(variant, eval_every=10**6, **sizes),
                        load_eval_set(TASK)[:10])
    after = []
    for _ in range(6):
        trainer.step()
        after.append(live_tensor_bytes())
    counts = [c for c, _ in after[1:]]
    sizes_ = [b for _, b in after[1:]]
    # after the first step (the optimizer creates its state), nothing accumulates
    assert counts == [counts[0]] * len(counts), after
    assert max(sizes_) - min(sizes_) <= 64 * 1024, after
