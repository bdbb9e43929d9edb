"""``python -m datapipe.cli``: the same program as the ``datapipe`` script."""

from datapipe.cli import main

main()
