"""initial schema: prompts, groups, trajectories, rewards, decisions, leases, policy versions, sampling requests.

Arrays (token ids, loss mask, log-probs) are raw little-endian bytea; see service/store/arrays.py.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 00:36:22.008860
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('curation_policies',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('body', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', 'version', name=op.f('pk_curation_policies'))
    )
    op.create_table('datasets',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('reward_spec', sa.Text(), nullable=True),
    sa.Column('curation_policy', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_datasets'))
    )
    op.create_table('leases',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('trainer_id', sa.Text(), nullable=False),
    sa.Column('request_id', sa.Text(), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='active', nullable=False),
    sa.Column('group_pks', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('n_groups', sa.Integer(), nullable=False),
    sa.Column('n_trajectories', sa.Integer(), nullable=False),
    sa.Column('n_tokens', sa.BigInteger(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_leases')),
    sa.UniqueConstraint('request_id', name=op.f('uq_leases_request_id'))
    )
    op.create_index(op.f('ix_leases_expires_at'), 'leases', ['expires_at'], unique=False)
    op.create_table('policy_versions',
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('metrics', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('version', name=op.f('pk_policy_versions'))
    )
    op.create_table('prompts',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('dataset', sa.Text(), nullable=False),
    sa.Column('messages', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('reference', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('reward_spec', sa.Text(), nullable=True),
    sa.Column('curation_policy', sa.Text(), nullable=True),
    sa.Column('pass_rate', sa.Float(), nullable=True),
    sa.Column('n_groups', sa.Integer(), server_default='0', nullable=False),
    sa.Column('recent_outcomes', postgresql.JSONB(astext_type=sa.Text()), server_default='[]', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_prompts'))
    )
    op.create_index(op.f('ix_prompts_dataset'), 'prompts', ['dataset'], unique=False)
    op.create_table('reward_specs',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('body', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', 'version', name=op.f('pk_reward_specs'))
    )
    op.create_table('groups',
    sa.Column('pk', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('prompt_id', sa.Text(), nullable=False),
    sa.Column('dataset', sa.Text(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('sampling', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), server_default='received', nullable=False),
    sa.Column('drop_reason', sa.Text(), nullable=True),
    sa.Column('n_trajectories', sa.Integer(), nullable=False),
    sa.Column('n_tokens', sa.BigInteger(), nullable=False),
    sa.Column('reward_spec_name', sa.Text(), nullable=True),
    sa.Column('reward_spec_version', sa.Integer(), nullable=True),
    sa.Column('curation_policy_name', sa.Text(), nullable=True),
    sa.Column('curation_policy_version', sa.Integer(), nullable=True),
    sa.Column('score_attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('score_error', sa.Text(), nullable=True),
    sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('metric_std', sa.Float(), nullable=True),
    sa.Column('outcome_mean', sa.Float(), nullable=True),
    sa.Column('lease_id', sa.Text(), nullable=True),
    sa.Column('consumed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('staleness', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('scored_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('curated_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ready_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_groups_prompt_id_prompts')),
    sa.PrimaryKeyConstraint('pk', name=op.f('pk_groups')),
    sa.UniqueConstraint('id', name=op.f('uq_groups_id'))
    )
    op.create_index('ix_groups_dataset_pk', 'groups', ['dataset', 'pk'], unique=False)
    op.create_index(op.f('ix_groups_lease_id'), 'groups', ['lease_id'], unique=False)
    op.create_index('ix_groups_policy_version', 'groups', ['policy_version'], unique=False)
    op.create_index(op.f('ix_groups_prompt_id'), 'groups', ['prompt_id'], unique=False)
    op.create_index('ix_groups_status_pk', 'groups', ['status', 'pk'], unique=False)
    op.create_table('sampling_requests',
    sa.Column('pk', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('prompt_id', sa.Text(), nullable=True),
    sa.Column('dataset', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('budget', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('priority', sa.Float(), server_default='1.0', nullable=False),
    sa.Column('source_group_pk', sa.BigInteger(), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='open', nullable=False),
    sa.Column('taken_by', sa.Text(), nullable=True),
    sa.Column('taken_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_sampling_requests_prompt_id_prompts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('pk', name=op.f('pk_sampling_requests'))
    )
    op.create_index(op.f('ix_sampling_requests_prompt_id'), 'sampling_requests', ['prompt_id'], unique=False)
    op.create_index('ix_sampling_requests_status_priority', 'sampling_requests', ['status', 'priority'], unique=False)
    op.create_table('decisions',
    sa.Column('pk', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('group_pk', sa.BigInteger(), nullable=False),
    sa.Column('idx', sa.SmallInteger(), nullable=True),
    sa.Column('policy_name', sa.Text(), nullable=True),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('rule', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['group_pk'], ['groups.pk'], name=op.f('fk_decisions_group_pk_groups'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('pk', name=op.f('pk_decisions'))
    )
    op.create_index(op.f('ix_decisions_group_pk'), 'decisions', ['group_pk'], unique=False)
    op.create_table('rewards',
    sa.Column('pk', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('group_pk', sa.BigInteger(), nullable=False),
    sa.Column('idx', sa.SmallInteger(), nullable=False),
    sa.Column('spec_name', sa.Text(), nullable=False),
    sa.Column('spec_version', sa.Integer(), nullable=False),
    sa.Column('component', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('details', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['group_pk'], ['groups.pk'], name=op.f('fk_rewards_group_pk_groups'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('pk', name=op.f('pk_rewards')),
    sa.UniqueConstraint('group_pk', 'idx', 'spec_name', 'spec_version', 'component', name='uq_rewards_key')
    )
    op.create_table('trajectories',
    sa.Column('group_pk', sa.BigInteger(), nullable=False),
    sa.Column('idx', sa.SmallInteger(), nullable=False),
    sa.Column('messages', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('final_answer', sa.Text(), nullable=False),
    sa.Column('token_ids', sa.LargeBinary(), nullable=True),
    sa.Column('loss_mask', sa.LargeBinary(), nullable=True),
    sa.Column('logprobs', sa.LargeBinary(), nullable=True),
    sa.Column('seq_len', sa.Integer(), nullable=False),
    sa.Column('num_tokens', sa.Integer(), nullable=False),
    sa.Column('num_turns', sa.SmallInteger(), nullable=False),
    sa.Column('finish_reason', sa.String(length=16), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('total_reward', sa.Float(), nullable=True),
    sa.Column('outcome', sa.Float(), nullable=True),
    sa.Column('advantage', sa.Float(), nullable=True),
    sa.Column('action', sa.String(length=16), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['group_pk'], ['groups.pk'], name=op.f('fk_trajectories_group_pk_groups'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('group_pk', 'idx', name=op.f('pk_trajectories'))
    )


def downgrade() -> None:
    op.drop_table('trajectories')
    op.drop_table('rewards')
    op.drop_index(op.f('ix_decisions_group_pk'), table_name='decisions')
    op.drop_table('decisions')
    op.drop_index('ix_sampling_requests_status_priority', table_name='sampling_requests')
    op.drop_index(op.f('ix_sampling_requests_prompt_id'), table_name='sampling_requests')
    op.drop_table('sampling_requests')
    op.drop_index('ix_groups_status_pk', table_name='groups')
    op.drop_index(op.f('ix_groups_prompt_id'), table_name='groups')
    op.drop_index('ix_groups_policy_version', table_name='groups')
    op.drop_index(op.f('ix_groups_lease_id'), table_name='groups')
    op.drop_index('ix_groups_dataset_pk', table_name='groups')
    op.drop_table('groups')
    op.drop_table('reward_specs')
    op.drop_index(op.f('ix_prompts_dataset'), table_name='prompts')
    op.drop_table('prompts')
    op.drop_table('policy_versions')
    op.drop_index(op.f('ix_leases_expires_at'), table_name='leases')
    op.drop_table('leases')
    op.drop_table('datasets')
    op.drop_table('curation_policies')
