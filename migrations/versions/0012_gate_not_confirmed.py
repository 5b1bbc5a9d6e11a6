"""gate results say when a gate was slower but left unconfirmed (another gate of its model confirmed the slowdown)

Revision ID: 0012_gate_not_confirmed
Revises: 0011_post_stale
Create Date: 2026-12-07 03:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0012_gate_not_confirmed'
down_revision = '0011_post_stale'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('not_confirmed', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.drop_column('not_confirmed')
