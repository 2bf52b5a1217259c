"""What the deployment refuses: a plan or setting no launch file can be written for."""

from __future__ import annotations

from costmodel.cli import UserError


class DeployError(UserError):
    """A plan or setting the launch files cannot be written for; the message says why and what to change."""
