"""arbor.

Offline and quiet by default (STACK_NOTES): no usage telemetry, so an offline node logs no telemetry errors. Set
when arbor is first imported, before Prefect or huggingface_hub read them, whether arbor runs from its CLI, a
benchmark, a notebook or a Prefect worker that imports its flows; a value the user exported wins.
"""

import os as _os

for _key, _value in (("DO_NOT_TRACK", "1"), ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                     ("HF_HUB_DISABLE_TELEMETRY", "1")):
    _os.environ.setdefault(_key, _value)
