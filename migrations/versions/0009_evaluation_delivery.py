"""evaluations remember the delivery whose handling asked for them (a handler handled again finds its own)

Revision ID: 0009_eval_delivery
Revises: 0008_floor_widening
Create Date: 2026-12-05 19:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0009_eval_delivery'
down_revision = '0008_floor_widening'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('delivery_id', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_evaluations_delivery_id'), ['delivery_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluations_delivery_id'))
        batch_op.drop_column('delivery_id')
