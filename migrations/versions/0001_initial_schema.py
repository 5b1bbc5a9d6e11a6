"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 09:36:33.794460
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('deliveries',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('event', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('processed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('installations',
    sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('account_login', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('repositories',
    sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('installation_id', sa.BigInteger(), nullable=True),
    sa.Column('full_name', sa.String(length=255), nullable=False),
    sa.Column('clone_url', sa.Text(), nullable=True),
    sa.Column('default_branch', sa.String(length=255), nullable=False),
    sa.ForeignKeyConstraint(['installation_id'], ['installations.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('full_name')
    )
    op.create_table('pull_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('html_url', sa.Text(), nullable=True),
    sa.Column('author_login', sa.String(length=255), nullable=False),
    sa.Column('head_sha', sa.String(length=64), nullable=False),
    sa.Column('head_ref', sa.String(length=255), nullable=False),
    sa.Column('head_clone_url', sa.Text(), nullable=True),
    sa.Column('base_ref', sa.String(length=255), nullable=False),
    sa.Column('base_sha', sa.String(length=64), nullable=False),
    sa.Column('is_open', sa.Boolean(), nullable=False),
    sa.Column('approved_sha', sa.String(length=64), nullable=True),
    sa.Column('sticky_comment_id', sa.BigInteger(), nullable=True),
    sa.Column('awaiting_approval', sa.Boolean(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('repository_id', 'number')
    )
    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pull_request_id', sa.Integer(), nullable=False),
    sa.Column('head_sha', sa.String(length=64), nullable=False),
    sa.Column('base_sha', sa.String(length=64), nullable=False),
    sa.Column('base_ref', sa.String(length=255), nullable=False),
    sa.Column('state', sa.Enum('queued', 'running', 'done', 'infra', 'cancelled', 'superseded', name='evalstate', native_enum=False, length=32), nullable=False),
    sa.Column('trigger', sa.Enum('auto', 'approval', 'command', 'check_rerun', 'round', 'retry', name='trigger', native_enum=False, length=32), nullable=False),
    sa.Column('requested_by', sa.String(length=255), nullable=True),
    sa.Column('profile', sa.String(length=32), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('celery_task_id', sa.String(length=64), nullable=True),
    sa.Column('check_run_id', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('worker_host', sa.String(length=255), nullable=True),
    sa.Column('verdict', sa.String(length=32), nullable=True),
    sa.Column('summary', sa.Text(), nullable=True),
    sa.Column('best_speedup', sa.Float(), nullable=True),
    sa.Column('infra_kind', sa.String(length=64), nullable=True),
    sa.Column('infra_detail', sa.Text(), nullable=True),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['pull_request_id'], ['pull_requests.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluations_pull_request_id'), ['pull_request_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_evaluations_state'), ['state'], unique=False)

    op.create_table('rounds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.Enum('open', 'closed', name='roundstate', native_enum=False, length=32), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('closes_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('winner_pull_request_id', sa.Integer(), nullable=True),
    sa.Column('winner_speedup', sa.Float(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['winner_pull_request_id'], ['pull_requests.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rounds_repository_id'), ['repository_id'], unique=False)

    op.create_table('gate_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('gate', sa.String(length=64), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('base_median', sa.Float(), nullable=True),
    sa.Column('head_median', sa.Float(), nullable=True),
    sa.Column('rel_change', sa.Float(), nullable=True),
    sa.Column('ci_low', sa.Float(), nullable=True),
    sa.Column('ci_high', sa.Float(), nullable=True),
    sa.Column('noise_floor', sa.Float(), nullable=True),
    sa.Column('significant', sa.Boolean(), nullable=False),
    sa.Column('regression', sa.Boolean(), nullable=False),
    sa.Column('scored', sa.Boolean(), nullable=False),
    sa.Column('n_pairs', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gate_results_evaluation_id'), ['evaluation_id'], unique=False)

    op.create_table('guard_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('seeds', sa.JSON(), nullable=False),
    sa.Column('head_top1', sa.Float(), nullable=True),
    sa.Column('base_top1', sa.Float(), nullable=True),
    sa.Column('head_kl', sa.Float(), nullable=True),
    sa.Column('base_kl', sa.Float(), nullable=True),
    sa.Column('top1_floor', sa.Float(), nullable=True),
    sa.Column('paired_delta', sa.Float(), nullable=True),
    sa.Column('max_drop', sa.Float(), nullable=True),
    sa.Column('kl_bound', sa.Float(), nullable=True),
    sa.Column('bit_identical', sa.Boolean(), nullable=False),
    sa.Column('passed', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('guard_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_guard_results_evaluation_id'), ['evaluation_id'], unique=False)

    op.create_table('receipts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('evaluation_id')
    )


def downgrade() -> None:
    op.drop_table('receipts')
    with op.batch_alter_table('guard_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_guard_results_evaluation_id'))

    op.drop_table('guard_results')
    with op.batch_alter_table('gate_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gate_results_evaluation_id'))

    op.drop_table('gate_results')
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rounds_repository_id'))

    op.drop_table('rounds')
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluations_state'))
        batch_op.drop_index(batch_op.f('ix_evaluations_pull_request_id'))

    op.drop_table('evaluations')
    op.drop_table('pull_requests')
    op.drop_table('repositories')
    op.drop_table('installations')
    op.drop_table('deliveries')
