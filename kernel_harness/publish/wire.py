"""The one-line protocol between the publisher and its fresh child processes.

Kept apart from :mod:`.child` so that importing the publisher never imports
the module ``python -m kernel_harness.publish.child`` is about to run.
"""

#: A child prints exactly one line starting with this, followed by JSON.
RESULT_PREFIX = "KH_PUBLISH_RESULT "
