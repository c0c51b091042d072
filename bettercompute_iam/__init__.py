"""Better IAM, embedded: tenants, principals and API credentials (first slice), behind the core's ``Iam`` port."""

from ._iam import Bootstrap as Bootstrap
from ._iam import EmbeddedIam as EmbeddedIam
from ._version import __version__ as __version__

__all__ = ["Bootstrap", "EmbeddedIam", "__version__"]
