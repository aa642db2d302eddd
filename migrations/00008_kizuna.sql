-- +goose Up
-- Kizuna agents: the agent id is the account name and the agent token is
-- the account's Agent key, so an agent is an account plus its letterbox.
CREATE TABLE kz_agents (
    account_id      BIGINT      PRIMARY KEY REFERENCES accounts (id),
    -- The display name; the agent id is the account's name.
    name            TEXT        NOT NULL DEFAULT '',
    capabilities    TEXT        NOT NULL DEFAULT '',
    tags            TEXT[]      NOT NULL DEFAULT '{}',
    webhook_url     TEXT        NOT NULL DEFAULT '',
    -- Needed again to sign every attempt, so it cannot be a hash: sealed
    -- with the server key (AES-GCM, purpose "kizuna-secret:<account id>").
    endpoint_secret BYTEA       NOT NULL,
    agent_card      JSON,
    enabled         BOOLEAN     NOT NULL DEFAULT TRUE,
    last_seen_at    TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    deleted_at      TIMESTAMPTZ
);
CREATE INDEX kz_agents_tags ON kz_agents USING GIN (tags) WHERE deleted_at IS NULL;

-- A letter's body holds the exact delivery bytes, built once at enqueue:
-- json (text), never jsonb, so every attempt signs the same bytes and a
-- sender's JSON body keeps its key order.
CREATE TABLE kz_letters (
    id              BIGSERIAL   PRIMARY KEY,
    task_id         TEXT        NOT NULL UNIQUE,
    from_account    BIGINT      NOT NULL REFERENCES accounts (id),
    to_account      BIGINT      REFERENCES accounts (id),
    kind            TEXT        NOT NULL CHECK (kind IN ('kizuna.task', 'kizuna.task-result')),
    reply_to        TEXT,
    body            JSON        NOT NULL,
    state           TEXT        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'delivering', 'acked', 'delivery_failed', 'invalid_target', 'cancelled')),
    attempts        INT         NOT NULL DEFAULT 0 CHECK (attempts BETWEEN 0 AND 6),
    next_attempt_at TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL,
    acked_at        TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ
);
CREATE INDEX kz_letters_due ON kz_letters (next_attempt_at) WHERE finished_at IS NULL;
CREATE INDEX kz_letters_from ON kz_letters (from_account, id);
CREATE INDEX kz_letters_to ON kz_letters (to_account, id);

CREATE TABLE kz_attempts (
    letter_id  BIGINT      NOT NULL REFERENCES kz_letters (id),
    n          INT         NOT NULL CHECK (n BETWEEN 1 AND 6),
    at         TIMESTAMPTZ NOT NULL,
    -- HTTP status; NULL when no response came.
    status     INT,
    latency_ms INT         NOT NULL DEFAULT 0,
    error      TEXT        NOT NULL DEFAULT '',
    -- The first 4 000 bytes of the reply.
    reply      TEXT        NOT NULL DEFAULT '',
    PRIMARY KEY (letter_id, n)
);

CREATE TABLE kz_results (
    id        BIGSERIAL   PRIMARY KEY,
    letter_id BIGINT      NOT NULL REFERENCES kz_letters (id),
    state     TEXT        NOT NULL
        CHECK (state IN ('working', 'input-required', 'completed', 'failed', 'canceled')),
    category  TEXT        NOT NULL CHECK (category IN ('in_progress', 'interrupted', 'terminal')),
    message   TEXT,
    result    JSON,
    at        TIMESTAMPTZ NOT NULL
);
CREATE INDEX kz_results_letter ON kz_results (letter_id, id);

-- One row per dequeue with the whole attempt history; refuse_change (from
-- 00001) makes PostgreSQL itself refuse UPDATE and DELETE.
CREATE TABLE kz_audit (
    id        BIGSERIAL   PRIMARY KEY,
    letter_id BIGINT      NOT NULL REFERENCES kz_letters (id),
    task_id   TEXT        NOT NULL,
    outcome   TEXT        NOT NULL
        CHECK (outcome IN ('acked', 'delivery_failed', 'invalid_target', 'cancelled')),
    attempts  JSON        NOT NULL,
    at        TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX kz_audit_letter ON kz_audit (letter_id);
CREATE TRIGGER kz_audit_append_only BEFORE UPDATE OR DELETE ON kz_audit
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Enroll tokens: only the SHA-256 is kept; spent by one conditional UPDATE.
CREATE TABLE kz_enroll_tokens (
    token_hash BYTEA       PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL,
    used_at    TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL
);

-- +goose Down
DROP TABLE kz_enroll_tokens;
DROP TABLE kz_audit;
DROP TABLE kz_results;
DROP TABLE kz_attempts;
DROP TABLE kz_letters;
DROP TABLE kz_agents;
