"""``python -m examples.custom_deployment``: see ``examples.custom_deployment``."""

from examples.custom_deployment._cli import main

main()
