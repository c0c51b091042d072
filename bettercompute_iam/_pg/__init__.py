"""IAM's PostgreSQL adapter: its tables and statements (every one in ``_statements``). The only part of this package
that may import the PostgreSQL store or SQLAlchemy (an import-linter contract)."""

from ._admin import IAM_ADMIN as IAM_ADMIN
from ._admin import IamAdmin as IamAdmin
from ._admin import RootAdmins as RootAdmins
from ._engine import ROOT_TENANT as ROOT_TENANT
from ._engine import CredentialRow as CredentialRow
from ._engine import IamTables as IamTables
from ._statements import MIGRATIONS as MIGRATIONS

__all__ = ["IAM_ADMIN", "MIGRATIONS", "ROOT_TENANT", "CredentialRow", "IamAdmin", "IamTables", "RootAdmins"]
