"""``python -m arbor.cli``: the ``arbor`` command."""

from arbor.cli import main

main()
