"""Schedules: the schedule and run-history tables (resilience.schedules).

Revision ID: 0003_schedules
Revises: 0002_workflows
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0003_schedules"
down_revision = "0002_workflows"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
