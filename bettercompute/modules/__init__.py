"""The built-in modules of the core, one sub-package each (schemas, service, methods)."""
