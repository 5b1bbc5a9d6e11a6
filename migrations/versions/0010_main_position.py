"""main measurements remember where their commit stands on main's first-parent line (the pages' order)

Revision ID: 0010_main_position
Revises: 0009_eval_delivery
Create Date: 2026-12-05 23:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0010_main_position'
down_revision = '0009_eval_delivery'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('main_measurements', schema=None) as batch_op:
        batch_op.add_column(sa.Column('main_position', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('main_measurements', schema=None) as batch_op:
        batch_op.drop_column('main_position')
