"""The ``secrets`` group (values sealed by the KMS, never returned) and ``SecretBroker`` (releases to nodes)."""

from ._broker import RELEASE_ACTION as RELEASE_ACTION
from ._broker import NodeIdentity as NodeIdentity
from ._broker import SecretBroker as SecretBroker
from ._methods import ACTIONS as ACTIONS
from ._methods import SecretsGroup as SecretsGroup
from ._module import SecretsModule as SecretsModule
from ._schemas import CreateSecretInput as CreateSecretInput
from ._schemas import DeleteSecretInput as DeleteSecretInput
from ._schemas import DeleteSecretOutput as DeleteSecretOutput
from ._schemas import ListSecretsInput as ListSecretsInput
from ._schemas import ListSecretsOutput as ListSecretsOutput
from ._schemas import Secret as Secret

__all__ = [
    "ACTIONS",
    "RELEASE_ACTION",
    "CreateSecretInput",
    "DeleteSecretInput",
    "DeleteSecretOutput",
    "ListSecretsInput",
    "ListSecretsOutput",
    "NodeIdentity",
    "Secret",
    "SecretBroker",
    "SecretsGroup",
    "SecretsModule",
]
