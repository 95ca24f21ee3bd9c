"""Durable workflows: the workflow and step tables (resilience.workflows).

Revision ID: 0002_workflows
Revises: 0001_baseline
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0002_workflows"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
