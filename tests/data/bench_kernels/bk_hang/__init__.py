"""Hangs on the call (sleeps; no busy loop)."""

import threading


def rms_norm(x, weight, eps):
    threading.Event().wait()
