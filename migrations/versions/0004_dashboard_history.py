"""dashboard: main history, change points, repository visibility

Revision ID: 0004_dashboard
Revises: 0003_botfaults

New tables only (nothing existing changes): main_measurements, history_points, change_points,
repository_visibility.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0004_dashboard'
down_revision = '0003_botfaults'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('change_points',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('gate', sa.String(length=64), nullable=False),
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('previous_sha', sa.String(length=64), nullable=False),
    sa.Column('rel_step', sa.Float(), nullable=False),
    sa.Column('false_alarm_rate', sa.Float(), nullable=False),
    sa.Column('detected_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('good_sha', sa.String(length=64), nullable=False),
    sa.Column('bad_sha', sa.String(length=64), nullable=False),
    sa.Column('culprit_sha', sa.String(length=64), nullable=True),
    sa.Column('pull_request_number', sa.Integer(), nullable=True),
    sa.Column('issue_number', sa.Integer(), nullable=True),
    sa.Column('comment_id', sa.BigInteger(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('repository_id', 'model', 'gate', 'sha')
    )
    with op.batch_alter_table('change_points', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_change_points_repository_id'), ['repository_id'], unique=False)

    op.create_table('repository_visibility',
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('private', sa.Boolean(), nullable=False),
    sa.Column('checked_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('repository_id')
    )
    op.create_table('main_measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('base_sha', sa.String(length=64), nullable=False),
    sa.Column('pull_request_id', sa.Integer(), nullable=True),
    sa.Column('change_point_id', sa.Integer(), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('profile', sa.String(length=32), nullable=False),
    sa.Column('celery_task_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('merged_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('worker_host', sa.String(length=255), nullable=True),
    sa.Column('verdict', sa.String(length=32), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('peak_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_kind', sa.String(length=16), nullable=True),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['change_point_id'], ['change_points.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['pull_request_id'], ['pull_requests.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('main_measurements', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_main_measurements_repository_id'), ['repository_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_main_measurements_state'), ['state'], unique=False)

    op.create_table('history_points',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('measurement_id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('gate', sa.String(length=64), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('tok_s', sa.Float(), nullable=True),
    sa.Column('base_tok_s', sa.Float(), nullable=True),
    sa.Column('rel_change', sa.Float(), nullable=True),
    sa.Column('significant', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['measurement_id'], ['main_measurements.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('measurement_id', 'model', 'gate')
    )
    with op.batch_alter_table('history_points', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_history_points_measurement_id'), ['measurement_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_history_points_repository_id'), ['repository_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('history_points', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_history_points_repository_id'))
        batch_op.drop_index(batch_op.f('ix_history_points_measurement_id'))

    op.drop_table('history_points')
    with op.batch_alter_table('main_measurements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_main_measurements_state'))
        batch_op.drop_index(batch_op.f('ix_main_measurements_repository_id'))

    op.drop_table('main_measurements')
    op.drop_table('repository_visibility')
    with op.batch_alter_table('change_points', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_change_points_repository_id'))

    op.drop_table('change_points')
