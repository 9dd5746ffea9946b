# Compatibility directory kernels expects next to the variant's __init__.py.
from .. import *  # noqa: F401,F403
