"""deliveries as the outbox (payload, body hash, attempts, errors); PR head ordering and history;
the worker that signed a result

Revision ID: 0003_botfaults
Revises: 0002
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003_botfaults'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payload', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('body_sha256', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('last_error', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_unique_constraint('uq_deliveries_body_sha256', ['body_sha256'])
    with op.batch_alter_table('pull_requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('head_updated_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('head_history', sa.JSON(), nullable=True))
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('result_worker', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('result_worker')
    with op.batch_alter_table('pull_requests', schema=None) as batch_op:
        batch_op.drop_column('head_history')
        batch_op.drop_column('head_updated_at')
    with op.batch_alter_table('deliveries', schema=None) as batch_op:
        batch_op.drop_constraint('uq_deliveries_body_sha256', type_='unique')
        for name in ('failed_at', 'last_error', 'next_attempt_at', 'attempts', 'enqueued_at', 'body_sha256',
                     'payload'):
            batch_op.drop_column(name)
