import torch

def get_inputs():
    T, H, D = 128, 32, 128
    q = torch.randn(T, H, D).to(torch.bfloat16)
    cos = torch.randn(T, D // 2)
    sin = torch.randn(T, D // 2)
    return [q, cos, sin]

def get_correctness_inputs():
    out = []
    for T, H, D, dt in [(7, 3, 40, torch.float32), (1, 1, 2, torch.bfloat16), (33, 5, 72, torch.float32)]:
        out.append([torch.randn(T, H, D).to(dt), torch.randn(T, D // 2), torch.randn(T, D // 2)])
    return out

def get_reference_output(q, cos, sin):
    d = q.shape[-1] // 2
    x1, x2 = q[..., :d].double(), q[..., d:].double()
    c, s = cos[:, None, :].double(), sin[:, None, :].double()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(q.dtype)
