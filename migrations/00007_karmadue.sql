-- +goose Up
-- KarmaDue agents: an account that signs with its own Ed25519 key. The key
-- itself is a credentials row (kind 'ed25519', external_id = the agent id),
-- so rotation and revocation are the same revoked_at every credential has.
CREATE TABLE kd_agents (
    id         UUID        PRIMARY KEY,
    account_id BIGINT      NOT NULL REFERENCES accounts (id),
    handle     TEXT        NOT NULL CHECK (handle ~ '^kd_[0-9a-f]{12}$'),
    label      TEXT        NOT NULL,
    platform   TEXT        NOT NULL DEFAULT '',
    status     TEXT        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX kd_agents_handle ON kd_agents (handle);
-- One live agent per account: a native account attaches one key identity.
CREATE UNIQUE INDEX kd_agents_one_live ON kd_agents (account_id) WHERE status = 'active';

-- The reservation of each live label: its folded form and the one-edit
-- neighbours (deletions, and deletions tagged with their position for
-- substitutions), so "is this a lookalike of a live label" is an index
-- probe rather than a scan. Rows go when the agent is revoked.
CREATE TABLE kd_label_keys (
    agent_id UUID NOT NULL REFERENCES kd_agents (id),
    key      TEXT NOT NULL
);
CREATE INDEX kd_label_keys_key ON kd_label_keys (key);
CREATE INDEX kd_label_keys_agent ON kd_label_keys (agent_id);

-- Registration challenges: single use, spent by one conditional UPDATE.
CREATE TABLE kd_challenges (
    id         UUID        PRIMARY KEY,
    payload    TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    used_at    TIMESTAMPTZ
);
CREATE INDEX kd_challenges_expires ON kd_challenges (expires_at);

CREATE INDEX credentials_ed25519_agent ON credentials (external_id) WHERE kind = 'ed25519';
ALTER TABLE credentials ADD CONSTRAINT credentials_ed25519_size
    CHECK (kind <> 'ed25519' OR (octet_length(public_key) = 32 AND external_id IS NOT NULL));

-- +goose Down
ALTER TABLE credentials DROP CONSTRAINT credentials_ed25519_size;
DROP INDEX credentials_ed25519_agent;
DROP TABLE kd_challenges;
DROP TABLE kd_label_keys;
DROP TABLE kd_agents;
