import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from hyperplex.layers import PHMLinear
from hyperplex.nn import LinearSpec
from hyperplex.nn.rnn import PHMLSTM, PHMLSTMCell, reverse_padded

SPECS = [LinearSpec("dense"), LinearSpec("phm", n=1)]


def _reference(lstm, x, lengths, state=None):
    """nn.LSTM on a packed batch, padded back to (B, T, H·dirs)."""
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = lstm(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, h, c


@pytest.mark.parametrize("spec", SPECS, ids=["dense", "phm-n1"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_nn_lstm_variable_lengths(spec, bidirectional):
    torch.manual_seed(0)
    lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=bidirectional).double()
    model = PHMLSTM.from_lstm(lstm, spec)
    assert model.conversion_error == 0.0
    x = torch.randn(4, 7, 6, dtype=torch.double)
    lengths = torch.tensor([7, 3, 5, 1])
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(2 * dirs, 4, 5, dtype=torch.double)
    c0 = torch.randn(2 * dirs, 4, 5, dtype=torch.double)

    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    ref_out, ref_h, ref_c = _reference(lstm, x1, lengths, (h0, c0))
    out, (h, c) = model(x2, lengths, (h0, c0))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(c, ref_c)

    g_out, g_h, g_c = torch.randn_like(out), torch.randn_like(h), torch.randn_like(c)
    ((ref_out * g_out).sum() + (ref_h * g_h).sum() + (ref_c * g_c).sum()).backward()
    ((out * g_out).sum() + (h * g_h).sum() + (c * g_c).sum()).backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    for layer in range(2):
        for d in range(dirs):
            suffix = f"l{layer}" + ("_reverse" if d else "")
            cell = model.cells[layer * dirs + d]
            grads = {"input": _weight_grad(cell.input_proj), "hidden": _weight_grad(cell.hidden_proj)}
            torch.testing.assert_close(grads["input"], getattr(lstm, f"weight_ih_{suffix}").grad)
            torch.testing.assert_close(grads["hidden"], getattr(lstm, f"weight_hh_{suffix}").grad)
            # one bias b = b_ih + b_hh: its gradient equals each of theirs
            torch.testing.assert_close(cell.input_proj.bias.grad, getattr(lstm, f"bias_ih_{suffix}").grad)
            torch.testing.assert_close(cell.input_proj.bias.grad, getattr(lstm, f"bias_hh_{suffix}").grad)


def _weight_grad(layer):
    if isinstance(layer, PHMLinear):
        return layer.phm_weight.grad.view(layer.out_features, layer.in_features)
    return layer.weight.grad


def test_padding_values_do_not_matter():
    torch.manual_seed(1)
    model = PHMLSTM(4, 4, num_layers=2, bidirectional=True, linear=LinearSpec("phm", n=2)).double()
    x = torch.randn(3, 6, 4, dtype=torch.double)
    lengths = torch.tensor([6, 2, 4])
    y = x.clone()
    for b, n in enumerate(lengths.tolist()):
        y[b, n:] = 1e3 * torch.randn_like(y[b, n:])
    out1, (h1, c1) = model(x, lengths)
    out2, (h2, c2) = model(y, lengths)
    torch.testing.assert_close(out1, out2)
    torch.testing.assert_close(h1, h2)
    torch.testing.assert_close(c1, c2)
    assert out1[1, 2:].abs().max() == 0  # zero on padding, as pad_packed_sequence


def test_each_row_equals_running_it_alone():
    torch.manual_seed(2)
    model = PHMLSTM(4, 8, bidirectional=True, linear=LinearSpec("quaternion")).double()
    x = torch.randn(2, 5, 4, dtype=torch.double)
    lengths = torch.tensor([5, 3])
    out, (h, c) = model(x, lengths)
    alone, (h_alone, _) = model(x[1:, :3])
    torch.testing.assert_close(out[1, :3], alone[0])
    torch.testing.assert_close(h[:, 1], h_alone[:, 0])


def test_to_lstm_roundtrip_phm():
    torch.manual_seed(3)
    model = PHMLSTM(8, 4, num_layers=2, bidirectional=True, linear=LinearSpec("phm", n=4)).double()
    lstm = model.to_lstm()
    x = torch.randn(3, 5, 8, dtype=torch.double)
    lengths = torch.tensor([5, 4, 2])
    out, (h, c) = model(x, lengths)
    ref_out, ref_h, ref_c = _reference(lstm, x, lengths)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h, ref_h)
    # and back: from_lstm finds an exact Kronecker sum again
    back = PHMLSTM.from_lstm(lstm, LinearSpec("phm", n=4))
    assert back.conversion_error < 1e-10
    torch.testing.assert_close(back(x, lengths)[0], out)


def test_step_equals_forward():
    torch.manual_seed(4)
    model = PHMLSTM(4, 6, num_layers=3, linear=LinearSpec("phm", n=2)).double()
    x = torch.randn(2, 5, 4, dtype=torch.double)
    out, (h, c) = model(x)
    state = None
    for t in range(5):
        y, state = model.step(x[:, t], state)
        torch.testing.assert_close(y, out[:, t])
    torch.testing.assert_close(state[0], h)
    torch.testing.assert_close(state[1], c)


def test_cell_matches_nn_lstm_cell():
    torch.manual_seed(5)
    ref = nn.LSTMCell(3, 4).double()
    cell = PHMLSTMCell(3, 4).double()
    with torch.no_grad():
        cell.input_proj.weight.copy_(ref.weight_ih)
        cell.input_proj.bias.copy_(ref.bias_ih + ref.bias_hh)
        cell.hidden_proj.weight.copy_(ref.weight_hh)
    x, h, c = (torch.randn(2, k, dtype=torch.double) for k in (3, 4, 4))
    for a, b in zip(cell(x, (h, c)), ref(x, (h, c))):
        torch.testing.assert_close(a, b)


def test_batch_first_false_and_dropout_eval():
    torch.manual_seed(6)
    lstm = nn.LSTM(3, 4, num_layers=2, dropout=0.5, batch_first=False).double().eval()
    model = PHMLSTM.from_lstm(lstm).eval()
    x = torch.randn(5, 2, 3, dtype=torch.double)  # (T, B, D)
    torch.testing.assert_close(model(x)[0], lstm(x)[0])


def test_input_projection_is_one_call_per_layer_and_direction():
    model = PHMLSTM(4, 4, num_layers=2, bidirectional=True, linear=LinearSpec("phm", n=2))
    calls = []
    for cell in model.cells:
        cell.input_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    model(torch.randn(2, 9, 4), torch.tensor([9, 4]))
    assert len(calls) == 4 and all(s[:2] == (2, 9) for s in calls)


def test_quaternion_parameter_count():
    dense = PHMLSTM(16, 16)
    quat = PHMLSTM(16, 16, linear=LinearSpec("quaternion"))

    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(quat) == (16 * 64 + 16 * 64) // 4 + 64
    assert count(dense) == 16 * 64 * 2 + 64


def test_reverse_padded_is_involution():
    x = torch.arange(12.).view(2, 6)
    lengths = torch.tensor([6, 3])
    r = reverse_padded(x, lengths)
    assert r.tolist() == [[5, 4, 3, 2, 1, 0], [8, 7, 6, 9, 10, 11]]
    torch.testing.assert_close(reverse_padded(r, lengths), x)


def test_bad_input_errors():
    model = PHMLSTM(4, 4, bidirectional=True)
    with pytest.raises(ValueError, match=r"expects input of shape \(B, T, 4\)"):
        model(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 3\]"):
        model(torch.randn(2, 3, 4), torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="h_0 must have shape"):
        model(torch.randn(2, 3, 4), state=(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match="unidirectional"):
        model.step(torch.randn(2, 4))
    with pytest.raises(ValueError, match="n=4 does not divide size 6"):
        PHMLSTM(6, 8, linear=LinearSpec("phm", n=4))
