"""Delta weight sync (rlm_course.systems.delta_sync): the receiver's bf16 weights equal the
sender's bit for bit after every sync, the payload's bytes equal the formula, and the unchanged
fraction by hand."""

import pytest
import torch

from rlm_course.systems.delta_sync import (DeltaState, bf16_bits, delta_broadcast, delta_bytes,
                                           unchanged_fraction)


def test_bytes_formula_by_hand():
    assert delta_bytes(1000, 0) == 8
    assert delta_bytes(1000, 10) == 8 + 60  # positions (int32) and values (bf16)
    assert delta_bytes(1000, 400) == 8 + 2000  # 2400 > 2000: the dense tensor is smaller
    with pytest.raises(ValueError, match="k=5"):
        delta_bytes(4, 5)


def test_unchanged_fraction_by_hand():
    a = [torch.tensor([1.0, 2.0, 3.0, 4.0])]
    # 1 + 2^-10 rounds back to 1 in bf16 (8 significant bits); 2.5 and -4 do not
    b = [torch.tensor([1.0 + 2**-10, 2.5, 3.0, -4.0])]
    assert unchanged_fraction(a, b) == 0.5
    with pytest.raises(ValueError, match="same tensors"):
        unchanged_fraction(a, [torch.zeros(3)])


def test_a_chain_of_delta_syncs_keeps_the_receiver_bit_identical():
    g = torch.Generator().manual_seed(0)
    sender = [torch.randn(64, 32, generator=g) * 0.02, torch.randn(32, generator=g),
              torch.randn(7, generator=g)]
    receiver = [torch.zeros_like(t) for t in sender]
    send_state, recv_state = DeltaState(sender), DeltaState(sender)
    for t, r in zip(sender, receiver):  # the first full sync
        r.copy_(t.to(torch.bfloat16))
    for step, scale in enumerate((1e-6, 1e-4, 1e-2, 0.0)):
        before = [t.clone() for t in sender]
        sender[0] += scale * torch.randn(sender[0].shape, generator=g)
        sender[1] += scale * torch.randn(sender[1].shape, generator=g)
        sender[2] += 1.0  # every weight changes: sent dense
        changed = [int((bf16_bits(a) != bf16_bits(b)).sum()) for a, b in zip(before, sender)]
        payload, counted = send_state.encode(sender)
        assert counted == changed
        assert len(payload) == sum(delta_bytes(t.numel(), k) for t, k in zip(sender, changed))
        recv_state.apply(payload, receiver)
        for t, r in zip(sender, receiver):
            assert torch.equal(bf16_bits(t), bf16_bits(r)), step
    assert changed[0] == 0 and changed[2] == 7  # scale 0: nothing; +1 on each: everything
    with pytest.raises(ValueError, match="left over|ends"):
        recv_state.apply(torch.cat([payload, payload]), receiver)
    with pytest.raises(ValueError, match="same model"):
        send_state.encode(sender[:2])


def test_delta_broadcast_moves_the_payload_through_a_collective():
    sender = [torch.linspace(-1, 1, 50), torch.ones(3, 3)]
    receiver = [t.clone() for t in sender]
    s_state, r_state = DeltaState(sender), DeltaState(receiver)
    sender[0][:5] += 0.5
    wire = []  # a broadcast between two "processes": the source's buffers, in order
    sent = delta_broadcast(sender, s_state, True, lambda b: wire.append(b.clone()))
    queue = iter(wire)
    got = delta_broadcast(receiver, r_state, False, lambda b: b.copy_(next(queue)))
    assert sent == got == delta_bytes(50, 5) + delta_bytes(9, 0)
    assert all(torch.equal(bf16_bits(a), bf16_bits(b)) for a, b in zip(sender, receiver))


def test_a_payload_for_other_tensors_is_refused_before_anything_changes():
    a = [torch.linspace(-1, 1, 20), torch.ones(4, 5)]
    other = [torch.linspace(-1, 1, 9), torch.ones(5, 4)]
    sender, receiver = DeltaState(a), DeltaState(a)
    moved = [t + 0.5 for t in a]
    payload, _ = sender.encode(moved)
    before = [b.clone() for b in receiver.bits]
    target = [t.clone() for t in a]
    for bad, match in ((payload[:-3], "cut short|left over|ends"),
                       (torch.cat([payload, payload[:3]]), "left over"),
                       (payload.float(), "uint8"),
                       (DeltaState(other).encode([t + 0.5 for t in other])[0], "other tensors")):
        with pytest.raises(ValueError, match=match):
            receiver.apply(bad, target)
        assert all(torch.equal(x, y) for x, y in zip(before, receiver.bits))  # unchanged
        assert all(torch.equal(x, y) for x, y in zip(target, a))
    with pytest.raises(ValueError, match="other shapes"):
        receiver.apply(payload, [a[0], a[1].T])  # same sizes, other shapes
    with pytest.raises(ValueError, match="integers"):
        delta_bytes(10, 2.5)
    with pytest.raises(ValueError, match="at least one"):
        unchanged_fraction([], [])
