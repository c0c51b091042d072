"""The ``audit`` group: the audit log every mutation writes, read with filters and paging, and checked against the
hash chain that links each tenant's rows (``_service`` tells how)."""

from bettercompute.modules.audit._methods import ACTIONS as ACTIONS
from bettercompute.modules.audit._methods import AuditGroup as AuditGroup
from bettercompute.modules.audit._module import AuditModule as AuditModule
from bettercompute.modules.audit._port import AUDIT_LOG as AUDIT_LOG
from bettercompute.modules.audit._port import AuditFilter as AuditFilter
from bettercompute.modules.audit._port import AuditLog as AuditLog
from bettercompute.modules.audit._port import AuditRow as AuditRow
from bettercompute.modules.audit._port import ChainLink as ChainLink
from bettercompute.modules.audit._port import Position as Position
from bettercompute.modules.audit._schemas import AuditEntry as AuditEntry
from bettercompute.modules.audit._schemas import ChainHead as ChainHead
from bettercompute.modules.audit._schemas import ChainProblem as ChainProblem
from bettercompute.modules.audit._schemas import GetAuditInput as GetAuditInput
from bettercompute.modules.audit._schemas import ListAuditInput as ListAuditInput
from bettercompute.modules.audit._schemas import ListAuditOutput as ListAuditOutput
from bettercompute.modules.audit._schemas import VerifyAuditInput as VerifyAuditInput
from bettercompute.modules.audit._schemas import VerifyAuditOutput as VerifyAuditOutput
from bettercompute.modules.audit._service import AUDIT as AUDIT
from bettercompute.modules.audit._service import AUDIT_CHAIN as AUDIT_CHAIN
from bettercompute.modules.audit._service import GENESIS as GENESIS
from bettercompute.modules.audit._service import link_audit as link_audit
from bettercompute.modules.audit._service import link_hash as link_hash

__all__ = [
    "ACTIONS",
    "AUDIT",
    "AUDIT_CHAIN",
    "AUDIT_LOG",
    "GENESIS",
    "AuditEntry",
    "AuditFilter",
    "AuditGroup",
    "AuditLog",
    "AuditModule",
    "AuditRow",
    "ChainHead",
    "ChainLink",
    "ChainProblem",
    "GetAuditInput",
    "ListAuditInput",
    "ListAuditOutput",
    "Position",
    "VerifyAuditInput",
    "VerifyAuditOutput",
    "link_audit",
    "link_hash",
]
