"""Error types a user can act on; every command prints them as one `error:` line and exits with 2."""

from __future__ import annotations

from costmodel.catalog import CatalogError
from costmodel.cli import UserError
from costmodel.specs import SpecError


class ConfigError(UserError):
    """A config value that cannot be used; the message names it and says how to fix it."""


class WorkloadError(UserError):
    """A workload description or trace that cannot be used; the message says what and where."""


class RecordsError(UserError):
    """A run's records could not be written (a full disk, its folder deleted while it ran); what was journalled
    is kept."""


USER_ERRORS: tuple[type[Exception], ...] = (UserError, CatalogError, SpecError)
