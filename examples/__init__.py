"""Examples of extending Better Compute; each is tested by ``tests/integration/examples``."""
