"""An example attestor plugin: machines prove they were provisioned by the operator's own tooling.

The operator's provisioning system (a PXE install, a cloud-init step) knows a provisioning secret that the control
plane knows too. When ``bcd`` joins, it sends as evidence ``provisioning_proof``: the base64 HMAC-SHA256, keyed by
that secret, of the machine's serial and the SHA-256 of the public key in its certificate request. The proof is
bound to the key being certified, so a proof copied off one machine does not help another key join; and it names
the serial, so it does not help another machine either.

Compose it with ``Options(attestors=[ProvisioningAttestor(secret=...)])``: JoinService runs it after the built-in
``claims`` attestor, outside any transaction; its facts (``provisioning.proof: verified``) are recorded on the node,
and a missing or wrong proof refuses the join with ``ACCESS_DENIED`` (reason ``provisioning_proof``) and nothing
written. ``proof_for`` is the provisioning side's half.
"""

from examples.attestor._attestor import ProvisioningAttestor as ProvisioningAttestor
from examples.attestor._attestor import proof_for as proof_for

__all__ = ["ProvisioningAttestor", "proof_for"]
