"""Who may call a method: the access levels a declaration names."""

from __future__ import annotations

from typing import Literal

__all__ = ["ACCESS_LEVELS", "Access"]

Access = Literal["open", "read", "use", "manage"]
"""Who may call a method, as the built-in roles see it:

- ``open``: every authenticated principal, without an IAM decision (``system.version``);
- ``read``: a read-only method, in the built-in ``viewer`` role and every role above it;
- ``use``: a method members use (reserving capacity), in the ``member`` role and above, not in ``viewer``;
- ``manage``: the rest, for operators and admins (and custom roles that name it).
"""
ACCESS_LEVELS: tuple[Access, ...] = ("open", "read", "use", "manage")
