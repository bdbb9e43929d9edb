"""``python -m datapipe.cli``: the same as the ``datapipe`` command."""

from datapipe.cli import main

main()
