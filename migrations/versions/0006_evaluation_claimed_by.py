"""evaluations.claimed_by: the GPU worker an attempt is bound to (its signed claim), whose key alone may
sign the attempt's result

Revision ID: 0006_claimed_by
Revises: 0005_raw_body
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006_claimed_by'
down_revision = '0005_raw_body'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('claimed_by', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('claimed_by')
