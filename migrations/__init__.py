"""Alembic revisions of the read models (`projections`), shipped as a package so that an
installed aenv (a wheel, no source tree) migrates too (`projections.db.alembic_config`)."""
