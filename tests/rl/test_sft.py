import pytest
import torch

from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.sft import SFTConfig, demonstration_batch, run_sft
from rlm_course.tasks import get_task
from rlm_course.tasks.base import Problem

TOK = CharTokenizer()
TASK = get_task("addition", digits=2)


def test_demonstration_batch_trains_only_on_the_answer():
    tokens, attention, loss_mask = demonstration_batch(TASK, TOK, [Problem("1+1=", "2"),
                                                                   Problem("10+15=", "25")])
    assert TOK.decode(tokens[0]) == "1+1=2" and tokens[0, 6].item() == TOK.eos_id
    # position t predicts token t+1: the answer "2" (pos 5) and <eos> (pos 6) are predicted at 4, 5
    assert loss_mask[0].nonzero().flatten().tolist() == [4, 5]
    assert loss_mask[1].nonzero().flatten().tolist() == [6, 7, 8]
    assert attention[0].tolist() == [True] * 7 + [False] * 3  # right-padded to the 10 of row 1


def tiny_sft(seed):
    config = SFTConfig(seed=seed, max_steps=4, eval_every=2, target_accuracy=1.0, n_validation=16,
                       batch_size=16)
    return run_sft(TASK, TOK, config, progress=False)


def test_sft_is_seeded_and_reproducible():
    (a, info_a), (b, _), (c, _) = tiny_sft(0), tiny_sft(0), tiny_sft(1)
    assert info_a["sft_steps"] == 4
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, z) for x, z in zip(a.state_dict().values(), c.state_dict().values()))


def test_checkpoint_round_trip_and_truncation(tmp_path):
    model, info = tiny_sft(0)
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, task=TASK.key, **info)
    loaded = load_checkpoint(path)
    assert loaded["task"] == TASK.key and loaded["sft_steps"] == 4
    for x, y in zip(model.state_dict().values(), loaded["model"].state_dict().values()):
        assert torch.equal(x, y)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupt"):
        load_checkpoint(path)
    torch.save({"weights": 1}, path)
    with pytest.raises(ValueError, match="not an rlm_course checkpoint"):
        load_checkpoint(path)
    # a plain pickle: one clear error, without torch's warning about its protocol before it
    import pickle
    import warnings

    path.write_bytes(pickle.dumps({"weights": 1}, protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="corrupt or not a torch checkpoint"):
            load_checkpoint(path)
    assert not [w for w in caught if "pickle" in str(w.message)], [str(w.message) for w in caught]


def test_bad_sft_config():
    with pytest.raises(ValueError, match="target_accuracy"):
        SFTConfig(target_accuracy=0.0)
    with pytest.raises(ValueError, match="max_steps"):
        SFTConfig(max_steps=0)
