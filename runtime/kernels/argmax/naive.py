import torch


def argmax_to_naive(logits, token, ws=None, pos=None, pdl=False):
    token[0] = torch.argmax(logits).to(torch.int32)
    if pos is not None:
        pos += 1
    return token
