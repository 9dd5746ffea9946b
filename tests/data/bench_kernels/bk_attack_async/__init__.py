"""Attack: return at once and let a background thread fill the output later."""

import threading
import time

import torch

from bk_common import rms_norm_honest


def rms_norm(x, weight, eps):
    out = torch.empty_like(x)

    def fill():
        time.sleep(0.002)
        out.copy_(rms_norm_honest(x, weight, eps))

    threading.Thread(target=fill, daemon=True).start()
    return out
