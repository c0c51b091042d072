"""Better IAM behind the core's ``Iam`` port: embedded (tenants, principals, credentials, roles) or ``RemoteIam``."""

from ._iam import Bootstrap as Bootstrap
from ._iam import EmbeddedIam as EmbeddedIam
from ._remote import RemoteIam as RemoteIam
from ._version import __version__ as __version__

__all__ = ["Bootstrap", "EmbeddedIam", "RemoteIam", "__version__"]
