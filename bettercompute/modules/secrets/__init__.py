"""The ``secrets`` group (values sealed by the KMS, never returned) and ``SecretBroker`` (releases to nodes)."""

from bettercompute.modules.secrets._broker import RELEASE_ACTION as RELEASE_ACTION
from bettercompute.modules.secrets._broker import SecretBroker as SecretBroker
from bettercompute.modules.secrets._methods import ACTIONS as ACTIONS
from bettercompute.modules.secrets._methods import SecretsGroup as SecretsGroup
from bettercompute.modules.secrets._module import SecretsModule as SecretsModule
from bettercompute.modules.secrets._port import SEALED_SECRETS as SEALED_SECRETS
from bettercompute.modules.secrets._port import SECRETS as SECRETS
from bettercompute.modules.secrets._port import SecretRecord as SecretRecord
from bettercompute.modules.secrets._port import SecretStore as SecretStore
from bettercompute.modules.secrets._schemas import CreateSecretInput as CreateSecretInput
from bettercompute.modules.secrets._schemas import DeleteSecretInput as DeleteSecretInput
from bettercompute.modules.secrets._schemas import DeleteSecretOutput as DeleteSecretOutput
from bettercompute.modules.secrets._schemas import ListSecretsInput as ListSecretsInput
from bettercompute.modules.secrets._schemas import ListSecretsOutput as ListSecretsOutput
from bettercompute.modules.secrets._schemas import Secret as Secret
from bettercompute.modules.secrets._service import value_context as value_context

__all__ = [
    "ACTIONS",
    "RELEASE_ACTION",
    "SEALED_SECRETS",
    "SECRETS",
    "CreateSecretInput",
    "DeleteSecretInput",
    "DeleteSecretOutput",
    "ListSecretsInput",
    "ListSecretsOutput",
    "Secret",
    "SecretBroker",
    "SecretRecord",
    "SecretStore",
    "SecretsGroup",
    "SecretsModule",
    "value_context",
]
