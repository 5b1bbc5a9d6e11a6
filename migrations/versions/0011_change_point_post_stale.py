"""change points remember a post edit GitHub refused (a beat edits it again)

Revision ID: 0011_post_stale
Revises: 0010_main_position
Create Date: 2026-12-05 23:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0011_post_stale'
down_revision = '0010_main_position'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('change_points', schema=None) as batch_op:
        batch_op.add_column(sa.Column('post_stale', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('change_points', schema=None) as batch_op:
        batch_op.drop_column('post_stale')
