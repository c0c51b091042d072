"""Better IAM behind the core's ``Iam`` port: embedded (tenants, principals, credentials, roles) or ``RemoteIam``; and
the method groups that administer the embedded one (tenants, principals, credentials, roles, bindings)."""

from ._iam import Bootstrap as Bootstrap
from ._iam import EmbeddedIam as EmbeddedIam
from ._methods import BindingsGroup as BindingsGroup
from ._methods import CredentialsGroup as CredentialsGroup
from ._methods import IamGroups as IamGroups
from ._methods import PrincipalsGroup as PrincipalsGroup
from ._methods import RolesGroup as RolesGroup
from ._methods import TenantsGroup as TenantsGroup
from ._remote import RemoteIam as RemoteIam
from ._schemas import Binding as Binding
from ._schemas import CreateBindingInput as CreateBindingInput
from ._schemas import CreateCredentialInput as CreateCredentialInput
from ._schemas import CreatedCredential as CreatedCredential
from ._schemas import CreatePrincipalInput as CreatePrincipalInput
from ._schemas import CreateRoleInput as CreateRoleInput
from ._schemas import CreateTenantInput as CreateTenantInput
from ._schemas import CredentialInfo as CredentialInfo
from ._schemas import DeleteBindingInput as DeleteBindingInput
from ._schemas import DeleteBindingOutput as DeleteBindingOutput
from ._schemas import DisablePrincipalInput as DisablePrincipalInput
from ._schemas import ListBindingsInput as ListBindingsInput
from ._schemas import ListBindingsOutput as ListBindingsOutput
from ._schemas import ListCredentialsInput as ListCredentialsInput
from ._schemas import ListCredentialsOutput as ListCredentialsOutput
from ._schemas import ListPrincipalsInput as ListPrincipalsInput
from ._schemas import ListPrincipalsOutput as ListPrincipalsOutput
from ._schemas import ListRolesInput as ListRolesInput
from ._schemas import ListRolesOutput as ListRolesOutput
from ._schemas import ListTenantsInput as ListTenantsInput
from ._schemas import ListTenantsOutput as ListTenantsOutput
from ._schemas import Principal as Principal
from ._schemas import RevokeCredentialInput as RevokeCredentialInput
from ._schemas import Role as Role
from ._schemas import Tenant as Tenant
from ._version import __version__ as __version__

__all__ = [
    "Binding",
    "BindingsGroup",
    "Bootstrap",
    "CreateBindingInput",
    "CreateCredentialInput",
    "CreatePrincipalInput",
    "CreateRoleInput",
    "CreateTenantInput",
    "CreatedCredential",
    "CredentialInfo",
    "CredentialsGroup",
    "DeleteBindingInput",
    "DeleteBindingOutput",
    "DisablePrincipalInput",
    "EmbeddedIam",
    "IamGroups",
    "ListBindingsInput",
    "ListBindingsOutput",
    "ListCredentialsInput",
    "ListCredentialsOutput",
    "ListPrincipalsInput",
    "ListPrincipalsOutput",
    "ListRolesInput",
    "ListRolesOutput",
    "ListTenantsInput",
    "ListTenantsOutput",
    "Principal",
    "PrincipalsGroup",
    "RemoteIam",
    "RevokeCredentialInput",
    "Role",
    "RolesGroup",
    "Tenant",
    "TenantsGroup",
    "__version__",
]
