"""The reference path of the fused LSTM gates: PyTorch ops only, float32 arithmetic (float64
stays float64), the kernels' interface."""
import torch


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _activations(c, gates, bias, forget_bias):
    acc = _acc(c.dtype)
    k = c.shape[1]
    pre = [t.to(acc) for t in gates]
    if bias is not None:
        pre = [t + bias[i * k:(i + 1) * k].to(acc) for i, t in enumerate(pre)]
    i, j, f, o = pre
    i, j, f, o = torch.sigmoid(i), torch.tanh(j), torch.sigmoid(f + forget_bias), torch.sigmoid(o)
    c = c.to(acc)
    return c, i, j, f, o, f * c + i * j


def lstm_gates_fwd(c, gates, bias, *, forget_bias):
    """``(c_next, h_next)``; see :func:`blocksparse.torch.fused_lstm_gates`."""
    _, _, _, _, o, c_next = _activations(c, gates, bias, forget_bias)
    # contiguous whatever the inputs' strides, as the kernels' outputs (and the ops' fake functions)
    return c_next.to(c.dtype).contiguous(), (o * torch.tanh(c_next)).to(c.dtype).contiguous()


def lstm_gates_bwd(c, gates, bias, dc_next, dh_next, *, forget_bias, merged):
    """``(dc, dgates, dbias)`` as :func:`blocksparse.torch._lstm.launch.lstm_gates_bwd` returns them."""
    c, i, j, f, o, c_next = _activations(c, gates, bias, forget_bias)
    dh = dh_next.to(c.dtype)
    t = torch.tanh(c_next)
    dcn = dc_next.to(c.dtype) + dh * o * (1 - t * t)
    grads = (dcn * j * i * (1 - i), dcn * i * (1 - j * j), dcn * c * f * (1 - f), dh * t * o * (1 - o))
    dtype = gates[0].dtype
    dgates = torch.cat(grads, 1).to(dtype) if merged else tuple(g.to(dtype).contiguous() for g in grads)
    dbias = None if bias is None else torch.cat([g.sum(0) for g in grads]).to(bias.dtype)
    return (dcn * f).to(dtype).contiguous(), dgates, dbias
