"""Durable state: SQLAlchemy models, Alembic migrations, and the writer the allocator uses."""
