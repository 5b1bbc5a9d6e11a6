"""gate results keep both one-sided noise floors

Revision ID: 0007_floor_sides
Revises: 0006_claimed_by
Create Date: 2026-12-02 07:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0007_floor_sides'
down_revision = '0006_claimed_by'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('floor_slower', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('floor_faster', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.drop_column('floor_faster')
        batch_op.drop_column('floor_slower')
