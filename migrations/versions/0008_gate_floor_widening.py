"""gate results keep the factor their noise floors were widened by (a host noisier than its A/A history)

Revision ID: 0008_floor_widening
Revises: 0007_floor_sides
Create Date: 2026-12-02 14:05:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0008_floor_widening'
down_revision = '0007_floor_sides'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('floor_widening', sa.Float(), nullable=False, server_default='1.0'))


def downgrade() -> None:
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.drop_column('floor_widening')
