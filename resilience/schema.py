"""SQLAlchemy metadata of the resilience package's own tables.

Each guard's `models.py` declares its tables (all named `resilience_*`) on this `metadata`;
the library's own Alembic history (`resilience.migrations`, `python -m resilience migrate`)
creates them.
"""

from __future__ import annotations

from sqlalchemy import MetaData

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
